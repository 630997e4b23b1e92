"""The benchmark's first_frame phase (scripts/benchlib/first_frame.py) and another checkout's trainer run whole
(scripts/benchlib/checkout.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests import launch
from tests.conftest import REPO

if os.path.join(REPO, "scripts") not in sys.path:
    sys.path.insert(0, os.path.join(REPO, "scripts"))  # scripts/ is no package: benchlib is top-level there

from benchlib.checkout import checkout_env  # noqa: E402
from benchlib.first_frame import spread, summary_line  # noqa: E402


def test_another_checkout_imports_its_own_algo_and_envs(tmp_path):
    """The venv's editable install maps sf_core.algo and sf_core.envs to this checkout: PYTHONPATH alone gave a
    baseline run its own sf_core with our algo/ and envs/."""
    other = tmp_path / "other"
    for folder in ("sf_core", "algo", "envs", "algo/sub"):
        (other / folder).mkdir(parents=True)
        (other / folder / "__init__.py").write_text(f"WHERE = {folder!r}\n")
    probe = ("import json, sf_core, sf_core.algo.sub, sf_core.envs\n"
             "print(json.dumps([m.__file__ for m in (sf_core, sf_core.algo, sf_core.algo.sub, sf_core.envs)]))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60,
                         env=checkout_env(str(other), str(tmp_path / "work")), cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr
    files = json.loads(out.stdout)
    assert files == [str(other / f / "__init__.py") for f in ("sf_core", "algo", "algo/sub", "envs")], files


def test_this_checkout_needs_no_mapping(tmp_path):
    env = checkout_env(REPO, str(tmp_path), {"PYTHONPATH": "/elsewhere"})
    assert env["PYTHONPATH"] == os.pathsep.join([REPO, "/elsewhere"]) and not list(tmp_path.iterdir())


def test_spread_and_line():
    assert spread([]) == {"median": None, "min": None, "max": None, "n": 0}
    assert spread([2.0, 1.0, 4.0]) == {"median": 2.0, "min": 1.0, "max": 4.0, "n": 3}
    result = {"first_frame_s": spread([1.8, 1.7]), "over_floor_s": spread([0.7, 0.8]), "floor_s": spread([1.06])}
    assert summary_line(result) == ("1st frame 1.75 s (1.70-1.80) after launch, 0.75 s (0.70-0.80) over a bare "
                                    "torch import (1.06 s (1.06-1.06))")


@pytest.mark.slow  # launches the trainer
def test_first_frame_phase_measures_the_trainer_and_the_floor_in_turns(tmp_path):
    out = tmp_path / "bench.json"
    proc = launch.run(["--phases=first_frame", "--launches=1", f"--output={out}"], 180,
                      script=os.path.join(REPO, "scripts", "benchmark.py"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    phase = json.loads(out.read_text())["phases"]["first_frame"]
    assert phase["status"] == "ok", phase
    run = phase["runs"][0]
    marks = run["startup"]
    # configured: flags checked and torch imported (sf_core/cli/train.py), before the runner probes the env
    assert 0 < marks["main_started"] < marks["configured"] <= marks["env_probed"] < marks["first_frame"], marks
    assert run["floor"] > 0 and run["over_floor"] == pytest.approx(marks["first_frame"] - run["floor"], abs=1e-3)
    assert phase["first_frame_s"]["n"] == 1 and "1st frame" in phase["line"]
    assert "sf_core first frame after launch" in proc.stdout
