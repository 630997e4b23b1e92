"""The garbage collector around start-up imports (sf_core/machine/heap.py) and the forkserver's preload."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

PROBE = "import gc, json, sys; print(json.dumps({'frozen': gc.get_freeze_count(), 'enabled': gc.isenabled()}))"


def run_fresh(code: str) -> dict:
    """`code` in a fresh interpreter, which then prints what the collector holds frozen and whether it runs."""
    out = subprocess.run([sys.executable, "-c", f"{code}\n{PROBE}"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # starts a process
def test_the_first_import_of_torch_is_frozen_and_the_collector_runs_again():
    state = run_fresh("from sf_core.machine.heap import collector_paused\n"
                      "with collector_paused():\n    import torch")
    assert state["enabled"] and state["frozen"] > 50_000, state  # torch's import makes hundreds of thousands


@pytest.mark.slow  # starts a process
def test_a_process_that_imported_torch_already_has_nothing_frozen():
    """A script calling sf_core.train.main() has objects of its own: freezing could keep its garbage forever."""
    state = run_fresh("import torch\nfrom sf_core.machine.heap import collector_paused\n"
                      "with collector_paused():\n    import sf_core.run.runner")
    assert state["enabled"] and state["frozen"] == 0, state


@pytest.mark.slow  # starts a process
def test_the_forkserver_preload_imports_every_component_module():
    """multiprocessing's forkserver skips a preload module that fails to import, silently: a renamed module
    would only make every component import it again after the fork."""
    state = run_fresh("import sys\nimport sf_core.machine.forkserver_preload as preload\n"
                      "assert not [m for m in preload.MODULES if m not in sys.modules]")
    assert state["enabled"] and state["frozen"] > 50_000, state
