"""Shared test helpers: run a training in-process and read what it reports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import sf_core.train

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def train(tmp_path, *args: str, experiment: str = "exp") -> tuple[int, dict]:
    """Run sf_core.train.main in this interpreter; returns (exit code, training_summary.json)."""
    code = sf_core.train.main([f"--train_dir={tmp_path}", f"--experiment={experiment}", *args])
    return code, read_summary(tmp_path, experiment)


def read_summary(train_dir, experiment: str = "exp") -> dict:
    path = os.path.join(train_dir, experiment, "training_summary.json")
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return json.load(f)


def start_trainer(args, cwd=None, script=None):
    """Start `python -m sf_core.train ARGS` (or a script) in its own interpreter, output piped."""
    env = dict(os.environ, PYTHONPATH=REPO)
    cmd = [sys.executable, script] if script else [sys.executable, "-m", "sf_core.train"]
    return subprocess.Popen(cmd + args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            cwd=cwd or REPO)


def wait_for(predicate, timeout, what):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")
