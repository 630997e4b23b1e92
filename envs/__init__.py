"""Environment registry and integrations."""

import sf_core.envs.corridor  # noqa: F401  (registers the sf_core/Corridor envs with gymnasium)
import sf_core.envs.memory  # noqa: F401  (registers sf_core/MemoryCue-v0 with gymnasium)
from sf_core.envs.registry import (
    EnvContext,
    EnvRegistry,
    make_env,
    register_env,
    registry_snapshot,
)

__all__ = ["EnvContext", "EnvRegistry", "make_env", "register_env", "registry_snapshot"]
