"""Sampling: rollout workers and their split runners, inference workers, device I/O, and which policy acts
for which agent."""
