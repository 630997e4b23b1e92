"""Command-line entry points: `python -m sf_core.train|enjoy|plot|evaluate|env_server` (thin modules in
sf_core/ forward to these)."""
