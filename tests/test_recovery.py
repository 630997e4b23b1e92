"""A trainer that outlives the death of its learner or an inference worker (sf_core/run/recovery.py): every
component is restored from the newest checkpoint within the same command (an inference worker's process is replaced
alone under --env_fault_policy=restart: sf_core/run/worker_replacement.py), the recovery is counted with what it
lost, the frame counter never goes back, and nothing is left behind (tests/conftest.py checks processes and
/dev/shm after each test). A dead learner rank: tests/test_learner_group.py.

The batcher is not killed on its own: it is never a process of its own (a thread of its learner's process; in
serial mode, and in a cluster sampler, on a loop it shares), so its death is its learner process's death.
"""

import glob
import json
import re
import threading
import time

import psutil
import pytest

from sf_core.contracts.signals import LearnerReport
from sf_core.run.fault_log import RECOVERED, STOPPED
from sf_core.run.recovery import Recovery
from sf_core.run.stats import TrainingStats
from tests import launch
from tests.helpers import read_summary, wait_for

# slower than the preset (one env at a time, CartPole's slower learning rate), so the target is ~10 s away when
# the fault comes: the vector env with the preset's rate can reach it within 4 s, before the first kill
TRAIN = ["--env=CartPole-v1", "--num_workers=2", "--seed=3", "--target_mean_return=450", "--save_every_sec=1",
         "--env_vectorization=none", "--learning_rate=3e-4",
         "--train_for_env_steps=1000000", "--train_for_seconds=80", "--experiment_summaries_interval=0.2",
         "--report_interval=0.5"]
FAST = ["--env=CartPole-v1", "--num_workers=2", "--seed=3", "--target_mean_return=450", "--train_for_seconds=60",
        "--experiment_summaries_interval=0.2", "--report_interval=0.5"]


class Watched:
    """A trainer started with `args`, its console in a file, its training_summary.json's frames read every 0.1 s."""

    def __init__(self, tmp_path, args: list[str]):
        self.tmp_path, self.log = tmp_path, tmp_path / "train.log"
        with open(self.log, "w") as out:
            self.proc = launch.start([f"--train_dir={tmp_path}", "--experiment=exp", *args], output=out)
        self.frames: list[int] = []
        self.descendants: dict[int, psutil.Process] = {}
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self) -> None:
        while self.proc.poll() is None:
            try:
                self.descendants.update((p.pid, p) for p in psutil.Process(self.proc.pid).children(recursive=True))
            except psutil.NoSuchProcess:
                pass
            frames = _live(self.tmp_path, "frames")
            if frames:
                self.frames.append(frames)
            time.sleep(0.1)

    def component(self, name: str) -> psutil.Process:
        """The component process of that name (sf_core.common.process_name.process_title: sf:learner, sf:inf0)."""
        found = [p for p in psutil.Process(self.proc.pid).children(recursive=True) if p.name() == name]
        assert len(found) == 1, found
        return found[0]

    def finish(self, timeout: float) -> str:
        try:
            self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(10)
        _, alive = psutil.wait_procs(list(self.descendants.values()), timeout=10)
        assert not alive, f"processes outlived the trainer: {[p.pid for p in alive]}"
        return self.log.read_text()


def _live(tmp_path, key: str) -> int:
    try:
        return read_summary(tmp_path).get(key) or 0
    except json.JSONDecodeError:  # read while the runner replaced it
        return 0


def _console_frames(output: str) -> list[int]:
    return [int(n.replace(",", "")) for n in re.findall(r"\] frames ([\d,]+) \|", output)]


def _checkpoints(tmp_path) -> list[str]:
    return sorted(glob.glob(str(tmp_path / "exp" / "checkpoint" / "checkpoint_v*.pt")))


def _version(path: str) -> int:
    return int(re.search(r"checkpoint_v(\d+)_", path)[1])


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_a_killed_learner_resumes_from_its_last_checkpoint_and_reaches_its_target(tmp_path):
    run = Watched(tmp_path, TRAIN)
    wait_for(lambda: _checkpoints(tmp_path), 60, "a first checkpoint")
    saved = _version(_checkpoints(tmp_path)[-1])
    # the learner trains on past that checkpoint: what it trains from here on is what its death loses
    wait_for(lambda: _live(tmp_path, "policy_version") > saved + 2, 30, "training past the checkpoint")
    learner = run.component("sf:learner")
    learner.kill()
    learner.wait(10)
    newest = _checkpoints(tmp_path)[-1]  # a dead learner writes none: the one a recovery must restore
    output = run.finish(120)

    assert run.proc.returncode == 0, output[-3000:]
    assert f"process learner_proc (pid {learner.pid}) died with exit code -9: restoring every component" in output
    assert f"policy 0 restored from {newest}" in output
    summary = read_summary(tmp_path)
    assert summary["time_to_target"] is not None and summary["mean_return_at_target"] >= 450, summary
    assert summary["recoveries"] == 1
    [fault] = summary["faults"]
    assert fault["component"] == "learner_proc" and fault["cause"].endswith("died with exit code -9")
    assert fault["at"] < fault["recovered_at"]
    assert 0 < fault["frames_lost"] == summary["trained_frames_lost"] < summary["frames"]
    # the frame counter (env frames collected) never goes back, in the live summary or on the console
    seen = run.frames + _console_frames(output)
    assert len(run.frames) > 10 and run.frames == sorted(run.frames) and max(seen) <= summary["frames"]
    assert _console_frames(output) == sorted(_console_frames(output))


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_a_hung_learner_is_killed_after_the_heartbeat_timeout_and_recovered_from(tmp_path):
    run = Watched(tmp_path, [*TRAIN, "--heartbeat_timeout=3"])
    wait_for(lambda: _live(tmp_path, "policy_version") > 2, 60, "training")
    learner = run.component("sf:learner")
    learner.suspend()  # SIGSTOP: a deadlocked learner, or its batcher (a thread of its process)
    output = run.finish(120)

    assert run.proc.returncode == 0, output[-3000:]
    summary = read_summary(tmp_path)
    assert summary["recoveries"] == 1 and summary["mean_return_at_target"] >= 450, summary
    [fault] = [f for f in summary["faults"] if f["component"] == "learner_proc"]
    assert fault["cause"].startswith(f"process learner_proc (pid {learner.pid}) hung: no heartbeat for "), fault
    assert "(--heartbeat_timeout=3)" in fault["cause"] and fault["action"] == RECOVERED, fault
    assert fault["recovered_at"] > fault["at"]
    assert run.frames == sorted(run.frames)


def _faults(tmp_path) -> list[dict]:
    try:
        return read_summary(tmp_path).get("faults") or []
    except json.JSONDecodeError:  # read while the runner replaced it
        return []


@pytest.mark.slow
@pytest.mark.timeout(150)
@pytest.mark.parametrize("fault_policy", ["restart", "stop"])
def test_a_killed_inference_worker_costs_no_training(tmp_path, fault_policy, monkeypatch):
    """--env_fault_policy=restart: its process alone is replaced (sf_core/run/worker_replacement.py) while the learner
    trains on; stop: every component is restored from the checkpoint the learner saves on the way down."""
    if fault_policy == "stop":
        run = Watched(tmp_path, [*TRAIN, "--env_fault_policy=stop"])
        wait_for(lambda: _live(tmp_path, "policy_version") > 2, 60, "training")
        learner, inference = run.component("sf:learner"), run.component("sf:inf0")
        inference.kill()  # at a random moment: inside a queue operation too (then it could not be replaced alone)
    else:
        # killed by its model's forward pass (tests/fault_models.py), never inside a queue operation; the preset's
        # faster learning: its target a few seconds past the kill
        monkeypatch.setenv("SF_TEST_INFERENCE_DEATH", str(tmp_path))
        run = Watched(tmp_path, [*FAST, "--env_module=tests.fault_models", "--encoder_custom=dies_in_inference",
                                 "--env_fault_policy=restart"])
        wait_for(lambda: _live(tmp_path, "policy_version") > 2, 60, "training")
        learner, inference = run.component("sf:learner"), run.component("sf:inf0")
        (tmp_path / "go").touch()
        wait_for(lambda: any(f["recovered_at"] for f in _faults(tmp_path)), 30, "the replacement serving")
        assert run.component("sf:inf0").pid != inference.pid and run.component("sf:learner").pid == learner.pid
        assert _live(tmp_path, "time_to_target") == 0, "the target was reached before the replacement served"
    output = run.finish(120)

    assert run.proc.returncode == 0, output[-3000:]
    summary = read_summary(tmp_path)
    assert summary["time_to_target"] is not None, summary
    assert run.frames == sorted(run.frames)
    [fault] = summary["faults"]
    assert fault["at"] < fault["recovered_at"] and fault["frames_lost"] == summary["trained_frames_lost"]
    if fault_policy == "restart":
        assert fault["component"] == "inference_worker_0" and fault["action"] == "replaced", output[-3000:]
        assert fault["cause"] == f"process inference_worker_0_proc (pid {inference.pid}) died with exit code -9"
        assert summary["recoveries"] == 0 and summary["trained_frames_lost"] == 0
        assert summary["worker_replacements"] == 1 and "inference_worker_0 serves again" in output
        return
    assert fault["component"] == "inference_worker_0_proc" and summary["recoveries"] == 1
    # the learner saved on the way down: the recovery restores the weights it had. Unless the worker died holding
    # the shared weights' lock: the learner then waits for it, is killed, and the recovery rolls back (rare)
    assert fault["frames_lost"] == 0 or "learner_proc did not stop in 6s: killing it" in output, output[-3000:]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_learner_that_dies_every_time_stops_the_run_at_the_cap(tmp_path):
    # its encoder kills the learner's process at each first SGD step: no checkpoint is ever saved
    run = Watched(tmp_path, ["--env=CartPole-v1", "--num_workers=1", "--env_module=tests.fault_models",
                             "--encoder_custom=dies_in_sgd", "--max_recoveries=1", "--train_for_seconds=60"])
    output = run.finish(100)

    assert run.proc.returncode == 1, output[-3000:]
    assert "policy 0 has no checkpoint yet: it starts again from its initial weights" in output
    assert re.search(r"ERROR training stopped: learner_proc failed: process learner_proc \(pid \d+\) died with exit "
                     r"code -9, and the run has recovered 1 time already \(--max_recoveries=1\)\n$", output), output
    assert "Traceback" not in output
    summary = read_summary(tmp_path)
    assert summary["exit_code"] == 1 and summary["recoveries"] == 1 and summary["trained_frames_lost"] == 0
    assert [f["component"] for f in summary["faults"]] == ["learner_proc", "learner_proc"]
    assert summary["faults"][1]["recovered_at"] is None


def test_a_recovery_takes_the_restored_counters_and_counts_what_was_lost():
    stats = TrainingStats(window=10, num_policies=2)
    stats.frames, stats.samples_trained = 50_000, 30_000
    stats.policies[0].samples_trained, stats.policies[0].version = 20_000, 40
    stats.policies[1].samples_trained, stats.policies[1].version = 10_000, 20
    recovery = Recovery(max_recoveries=1, env_frameskip=4, available=True)
    assert recovery.handles("learner_p1_proc", ["learner_p1", "batcher_p1"], -9)
    assert recovery.handles("inference_worker_0_proc", ["inference_worker_p0_0", "inference_worker_p1_0"], -11)
    assert recovery.handles("learner_rank_1", [], -9)
    assert not recovery.handles("rollout_worker_0_proc", ["rollout_worker_0"], -9)  # its own rules
    assert not recovery.handles("learner_p1_proc", ["learner_p1", "batcher_p1"], 2)  # exited by itself
    assert recovery.begin("learner_p1_proc", "process learner_p1_proc (pid 7) died with exit code -9", 100.0,
                          stats.faults, stats.frames)

    # policy 0's learner saved on the way down (and trained one more report's worth); policy 1's had no checkpoint
    recovery.restored([{"samples_trained": 21_000, "version": 41}, None], ["p0.pt", None], stats)
    assert stats.frames == 50_000  # env frames collected: never rolled back
    assert (stats.policies[0].samples_trained, stats.policies[0].version) == (21_000, 41)
    assert (stats.policies[1].samples_trained, stats.policies[1].version) == (0, 0)
    assert stats.samples_trained == 21_000 and stats.policy_version == 41
    recovery.saw(LearnerReport(policy=1, version=1, samples=1000, train_seconds=0.1), stats.frames)
    summary = recovery.summary()
    assert summary["recoveries"] == 1 and summary["trained_frames_lost"] == 10_000 * 4
    [fault] = stats.summary(0, None)["faults"]
    assert {"component", "cause", "action", "at", "recovered_at", "frames_lost"} <= set(fault)
    assert fault["component"] == "learner_p1_proc" and fault["at"] == 100.0 and fault["recovered_at"] > 100.0
    assert fault["frames_lost"] == 40_000 and fault["action"] == RECOVERED

    assert not recovery.begin("learner_p1_proc", "process learner_p1_proc (pid 8) died with exit code -9", 200.0,
                              stats.faults, stats.frames)
    assert recovery.refusal("it died") == "it died, and the run has recovered 1 time already (--max_recoveries=1)"
    assert [f["action"] for f in stats.summary(1, "it died")["faults"]] == [RECOVERED, STOPPED]


def test_recovery_needs_component_processes_on_this_machine():
    assert not Recovery(max_recoveries=5, env_frameskip=1, available=False).handles("learner_proc", ["learner"], -9)


def test_a_negative_recovery_cap_is_one_message():
    from sf_core.cli.arguments import parse_args
    from sf_core.config import ConfigError

    with pytest.raises(ConfigError, match=re.escape("--max_recoveries must be at least 0, got -1")):
        parse_args(["--env=CartPole-v1", "--max_recoveries=-1"])
