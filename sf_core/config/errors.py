"""The error a flag value that cannot work raises (re-exported by `sf_core.config`)."""


class ConfigError(ValueError):
    """A flag value that cannot work; the message names the flag and why."""
