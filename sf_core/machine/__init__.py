"""One machine's components: wiring them for a run, and the defaults fitted to the machine."""
