"""One run per experiment folder (sf_core/records/experiment_lock.py), and files replaced whole
(sf_core/records/atomic_file.py): the lock on its own, without training."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from sf_core.common.logs import setup_logging
from sf_core.config import Config
from sf_core.records.experiment import Experiment
from sf_core.records.experiment_lock import LOCK_FILE, ExperimentInUse, ExperimentLock


def dead_pid() -> int:
    finished = subprocess.Popen(["true"])
    finished.wait()
    return finished.pid


def stale_lock(folder, pid: int) -> None:
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, LOCK_FILE), "w") as f:
        json.dump({"pid": pid, "host": os.uname().nodename, "since": time.time() - 60, "command": "x"}, f)


def test_a_second_lock_names_the_holder_and_the_ways_out_and_leaves_its_file_alone(tmp_path):
    first = ExperimentLock()
    first.acquire(str(tmp_path / "exp"))
    held = (tmp_path / "exp" / LOCK_FILE).read_text()
    try:
        with pytest.raises(ExperimentInUse) as raised:
            ExperimentLock().acquire(str(tmp_path / "exp"))
        message = str(raised.value)
        assert "\n" not in message
        assert f"pid {os.getpid()} on {os.uname().nodename}, since " in message
        assert "wait for it to finish" in message and f"kill {os.getpid()}" in message and "--experiment" in message
        assert (tmp_path / "exp" / LOCK_FILE).read_text() == held
    finally:
        first.release()
    assert not (tmp_path / "exp").exists(), "the folder the lock made, and nothing else wrote into, is removed"
    second = ExperimentLock()
    second.acquire(str(tmp_path / "exp"))  # a released lock blocks nobody
    second.release()


def test_release_keeps_a_folder_the_run_wrote_into_but_not_the_lock_file(tmp_path):
    lock = ExperimentLock()
    lock.acquire(str(tmp_path / "a" / "b"))
    (tmp_path / "a" / "b" / "config.json").write_text("{}")
    lock.release()
    lock.release()  # twice: every way out releases, and some pass here again
    assert sorted(os.listdir(tmp_path / "a" / "b")) == ["config.json"]


def test_a_lock_file_left_by_a_dead_process_is_taken_over_with_a_note(tmp_path, capsys):
    setup_logging()
    pid = dead_pid()
    stale_lock(tmp_path / "exp", pid)
    lock = ExperimentLock()
    lock.acquire(str(tmp_path / "exp"))
    try:
        out = capsys.readouterr().out
        assert f"took over the lock of pid {pid} on {os.uname().nodename}, since " in out
        assert "which is no longer running" in out
        holder = json.loads((tmp_path / "exp" / LOCK_FILE).read_text())
        assert holder["pid"] == os.getpid() and holder["command"]
    finally:
        lock.release()


def test_a_process_forked_by_the_holder_does_not_keep_the_folder_locked(tmp_path):
    """The runner's component processes are forked: one that outlives a killed runner must not hold the lock."""
    read_end, write_end = os.pipe()
    holder = os.fork()
    if holder == 0:  # the runner: locks, forks a component that lingers, then dies without releasing
        try:
            ExperimentLock().acquire(str(tmp_path / "exp"))
            component = os.fork()
            if component == 0:  # writes once its at-fork handlers ran (a loaded machine may run it late)
                os.write(write_end, str(os.getpid()).encode())
                time.sleep(30)
                os._exit(0)
        finally:
            os._exit(0)
    os.close(write_end)
    component = int(os.read(read_end, 32))
    os.close(read_end)
    os.waitpid(holder, 0)  # the holder exits without waiting for the component's write
    try:
        lock = ExperimentLock()
        lock.acquire(str(tmp_path / "exp"))
        lock.release()
    finally:
        os.kill(component, signal.SIGKILL)
        time.sleep(0.1)  # the init process reaps it: it is not our child


def test_overwrite_and_restart_keep_the_lock_file_and_the_lock(tmp_path):
    path = tmp_path / "exp"
    lock = ExperimentLock()
    lock.acquire(str(path))
    try:
        for behavior in ("overwrite", "restart"):
            (path / "tb").mkdir()
            (path / "training_summary.json").write_text("{}")
            Experiment(Config(train_dir=str(tmp_path), experiment="exp", restart_behavior=behavior)).prepare(False)
            assert sorted(os.listdir(path)) == ["config.json", LOCK_FILE]
            with pytest.raises(ExperimentInUse):
                ExperimentLock().acquire(str(path))
        aside = [p for p in os.listdir(tmp_path) if p.startswith("exp.old_")]
        assert len(aside) == 1 and sorted(os.listdir(tmp_path / aside[0])) == ["config.json", "tb",
                                                                                 "training_summary.json"]
    finally:
        lock.release()


def test_a_failed_write_leaves_the_old_file_and_no_temporary_one(tmp_path):
    experiment = Experiment(Config(train_dir=str(tmp_path), experiment="exp"))
    os.makedirs(experiment.path)
    experiment.write_summary({"running": False})
    with pytest.raises(TypeError):
        experiment.write_summary({"running": True, "not json": object()})
    assert os.listdir(experiment.path) == ["training_summary.json"]
    assert json.loads((tmp_path / "exp" / "training_summary.json").read_text()) == {"running": False}
