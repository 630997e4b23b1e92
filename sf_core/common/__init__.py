"""The ground that algo/ and envs/ may stand on beside sf_core.config: user code sent to worker processes,
and the console logger."""
