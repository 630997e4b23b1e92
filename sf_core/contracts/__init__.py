"""Contracts between processes: the signals, what a sample is, the shared buffers, the control block, and the
component base every event-loop object derives from."""
