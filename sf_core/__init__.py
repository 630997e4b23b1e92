"""sf_core: high-throughput asynchronous RL training."""

from envs.registry import EnvContext, register_env

__version__ = "0.1.0"
__all__ = ["EnvContext", "register_env", "__version__"]
