"""The forkserver's preload (`--mp_start_method=forkserver`): importing this module imports, once, what
every component process needs, and each component then forks from the forkserver with it imported.

The imports run with the cyclic garbage collector paused, and what they made is frozen
(`sf_core/machine/heap.py`): faster to import, and the forked components' collections skip it. The modules
are named, not imported here, so this layer does not depend on the components' (.importlinter).
"""

import importlib

from sf_core.machine.heap import collector_paused

MODULES = ("torch", "numpy", "gymnasium", "sf_core.sampling.rollout_worker", "sf_core.sampling.inference_worker",
           "sf_core.learning.batcher", "sf_core.learning.learner", "sf_core.sampling.periodic_evaluator")

with collector_paused():
    for module in MODULES:
        importlib.import_module(module)
