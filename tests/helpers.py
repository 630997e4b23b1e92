"""Shared test helpers: run a training in-process and read what it reports."""

from __future__ import annotations

import json
import os

import sf_core.train


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
