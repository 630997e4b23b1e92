"""Models, losses and learning targets; no plumbing here."""
