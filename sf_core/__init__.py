"""sf_core: high-throughput asynchronous RL training.

`register_env` makes a custom env known; the Python API (`Trainer`, `load_policy`, `evaluate_policy`,
docs/python_api.md) is imported at its first use, so a worker process that imports this package pays nothing
for it."""

from typing import Any

from sf_core.envs.registry import EnvContext, register_env
from sf_core.evaluation.task_runners import register_task_runner

__version__ = "0.1.0"
_API = ("Policy", "Trainer", "TrainingError", "TrainingResult", "evaluate_policy", "load_policy")
__all__ = ["EnvContext", "register_env", "register_task_runner", "__version__", *_API]


def __getattr__(name: str) -> Any:
    if name in _API:
        import sf_core.api

        return getattr(sf_core.api, name)
    raise AttributeError(f"module 'sf_core' has no attribute {name!r}")
