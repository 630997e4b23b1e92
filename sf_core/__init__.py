"""sf_core: high-throughput asynchronous RL training.

`register_env` makes a custom env known; the Python API (`Trainer`, `load_policy`, `evaluate_policy`,
docs/python_api.md) is imported at its first use, so a worker process that imports this package pays nothing
for it. So are `register_env`, `EnvContext` and `register_task_runner` (gymnasium and numpy with them): the
command-line tools pause the garbage collector before their first heavy import (sf_core/machine/heap.py), and
`python -m sf_core.train` imports this package before anything of the tool runs."""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sf_core.envs.registry import EnvContext, register_env
    from sf_core.evaluation.task_runners import register_task_runner

__version__ = "0.1.0"
_API = ("Policy", "Trainer", "TrainingError", "TrainingResult", "evaluate_policy", "load_policy")
_LAZY = {"EnvContext": "sf_core.envs.registry", "register_env": "sf_core.envs.registry",
         "register_task_runner": "sf_core.evaluation.task_runners", **{name: "sf_core.api" for name in _API}}
__all__ = ["EnvContext", "register_env", "register_task_runner", "__version__", *_API]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'sf_core' has no attribute {name!r}")
