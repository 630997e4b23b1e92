"""Environment registry and integrations."""

from envs.registry import EnvContext, EnvRegistry, make_env, register_env, registry_snapshot

__all__ = ["EnvContext", "EnvRegistry", "make_env", "register_env", "registry_snapshot"]
