"""What the trainer's process imports and allocates before its first frame (docs/performance.md, "The first frame
against a bare torch import"): nothing a run does not use, and gymnasium's import without the collector."""

from __future__ import annotations

import json
import pickle

import faster_fifo
import pytest
from signal_slot.signal_slot import EventLoop

from sf_core.contracts.component import Routing
from tests import launch

PROBE = ("import gc, json, sys\n"
         "print(json.dumps({'modules': sorted(sys.modules), 'frozen': gc.get_freeze_count(), "
         "'enabled': gc.isenabled()}))")


def fresh(code: str) -> dict:
    """`code` in a fresh interpreter: the modules it left imported, and the collector's state."""
    out = launch.run([], 120, code=f"{code}\n{PROBE}")
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_importing_the_package_imports_neither_gymnasium_nor_numpy():
    """`python -m sf_core.train` imports the package before the tool can pause the collector."""
    state = fresh("import sf_core")
    assert not {"gymnasium", "numpy", "torch"} & set(state["modules"]), state["modules"]


def test_the_package_still_exports_its_api_names():
    import sf_core
    from sf_core.envs.registry import EnvContext, register_env
    from sf_core.evaluation.task_runners import register_task_runner

    assert (sf_core.register_env, sf_core.EnvContext, sf_core.register_task_runner) == \
        (register_env, EnvContext, register_task_runner)
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        sf_core.nothing  # noqa: B018


@pytest.mark.slow  # imports gymnasium and the command line in a fresh interpreter
def test_the_train_entry_point_imports_gymnasium_with_the_collector_paused():
    state = fresh("import sf_core.train")
    assert "gymnasium" in state["modules"] and "torch" not in state["modules"]
    assert state["enabled"] and state["frozen"] > 10_000, state["frozen"]  # gymnasium's and numpy's objects


@pytest.mark.slow  # imports torch in a fresh interpreter
def test_the_trainers_process_imports_no_zeromq_and_no_tensorboard_before_training():
    """pyzmq (env services only) and TensorBoard (the first summary, seconds in) load when used."""
    state = fresh("import sf_core.train\n"
                  "from sf_core.cli.arguments import import_flag_checks\n"
                  "import_flag_checks()\n"
                  "import sf_core.run.runner, sf_core.sampling.rollout_worker, sf_core.sampling.inference_worker")
    loaded = [m for m in state["modules"] if m.split(".")[0] in ("zmq", "tensorboard")
              or m.startswith("torch.utils.tensorboard")]
    assert not loaded, loaded


def test_a_loop_keeps_its_own_queue_and_pickles_plainly():
    """One faster-fifo queue per loop: a second would allocate and zero 5 MB of shared memory more."""
    loop = EventLoop("plain_pickle_test_loop")
    queue = loop.signal_queue
    assert Routing.use_plain_pickle(loop) is loop and loop.signal_queue is queue
    assert isinstance(queue, faster_fifo.Queue) and queue.dumps is pickle.dumps
    queue.put({"a": [1, 2]})
    assert queue.get(timeout=1.0) == {"a": [1, 2]}
