"""The typed config: every flag (`schema.py`) and the checks of the engine's own flags (`checks.py`, registered
on import, before any feature's)."""

from sf_core.config import checks  # noqa: F401  (registers the engine's checks first)
from sf_core.config.schema import (GROUPS, NUMERIC_LEARNING_FLAGS, _FIELDS, Config, ConfigError, default, flag,
                                   register_check)

__all__ = ["GROUPS", "NUMERIC_LEARNING_FLAGS", "_FIELDS", "Config", "ConfigError", "default", "flag", "register_check"]
