"""sf_core: high-throughput asynchronous RL training."""

from sf_core.envs.registry import EnvContext, register_env
from sf_core.evaluation.task_runners import register_task_runner

__version__ = "0.1.0"
__all__ = ["EnvContext", "register_env", "register_task_runner", "__version__"]
