"""scripts/benchmark.py: a tiny end-to-end run (JSON structure, clean shutdown), and its parts in
scripts/benchlib/: reading our trainer's summary file, Sample Factory's console, the window, the ratios."""

from __future__ import annotations

import json
import os
import py_compile
import shutil
import subprocess
import sys
import time

import pytest

from tests import launch
from tests.conftest import REPO


SCRIPT = os.path.join(REPO, "scripts", "benchmark.py")
if os.path.join(REPO, "scripts") not in sys.path:
    sys.path.insert(0, os.path.join(REPO, "scripts"))  # scripts/ is no package: benchlib is top-level there

from benchlib import ours, report, sample_factory, watch, window  # noqa: E402
from benchlib.window import Point  # noqa: E402


def run_script(args: list[str], timeout: float) -> subprocess.CompletedProcess:
    return launch.run(args, timeout, script=SCRIPT)


@pytest.mark.slow
def test_tiny_run_writes_every_figure(tmp_path):
    out = tmp_path / "bench.json"
    started = time.time()
    # a warm-up past the learner's first update: under load the first 1-2 s can be a stall (no new frames)
    proc = run_script(["--seconds=2", "--warmup=2", "--num_workers=1", "--num_envs_per_worker=4",
                       "--worker_num_splits=2", "--rollout=16", "--batch_size=128", "--encoder_mlp_layers", "32",
                       "--variant=--num_epochs=2 --num_batches_per_epoch=2", f"--baseline_repo={REPO}",
                       f"--output={out}"], timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert time.time() - started < 150
    results = json.loads(out.read_text())

    assert results["finished"] is True
    assert results["machine"]["usable_cores"] >= 1 and results["machine"]["cpu_count"] >= 1
    assert results["settings"]["config"]["num_envs_per_worker"] == 4
    assert results["settings"]["config"]["encoder_mlp_layers"] == [32]
    assert results["settings"]["summary_interval"] == ours.SUMMARY_INTERVAL_SEC
    phases = results["phases"]
    assert list(phases) == ["raw_env_1proc", "raw_env_per_core", "sampling", "sampling_variant_1", "training",
                            "training_baseline", "training_variant_1", "sample_factory"]  # in the order they ran
    for name in ("raw_env_1proc", "raw_env_per_core", "sampling", "sampling_variant_1", "training",
                 "training_baseline", "training_variant_1"):
        assert phases[name]["status"] == "ok", phases[name]
        assert phases[name]["fps"] > 0
        assert phases[name]["peak_rss_mb"] > 0
    assert phases["raw_env_per_core"]["processes"] == results["machine"]["usable_cores"]
    assert phases["sampling"]["samples_trained_per_s"] == 0  # --sampling_only skips SGD
    training = phases["training"]
    assert training["samples_trained_per_s"] > 0
    assert training["window"]["seconds"] > 0 and training["window"]["frames"] > 0
    # the window's edges are snapshots of training_summary.json, taken while the trainer ran
    assert training["window"]["status_lines"] >= 2 and training["window"]["complete"] is True
    assert 0 < training["time_to_first_frame_trainer_s"] <= training["time_to_first_frame_s"]
    assert training["summary"]["exit_code"] in (0, 130) and training["summary"]["running"] is False
    assert training["summary"]["frames"] >= training["window"]["frames"]
    assert training["shm_files_left_behind"] == 0  # ours unlink their shared memory
    assert "--sampling_only=False" in training["command"] and "--sampling_only=True" in phases["sampling"]["command"]
    assert f"--experiment_summaries_interval={ours.SUMMARY_INTERVAL_SEC:g}" in training["command"]
    assert results["ratios"]["training_vs_baseline"] == pytest.approx(
        training["fps"] / phases["training_baseline"]["fps"], abs=1e-4)
    assert phases["training_baseline"]["label"] == f"sf_core training from {REPO}"
    variant = phases["training_variant_1"]
    assert variant["label"] == "sf_core training --num_epochs=2 --num_batches_per_epoch=2"
    assert variant["command"].endswith("--restart_behavior=overwrite") and "--num_epochs=2" in variant["command"]
    assert variant["samples_trained_per_s"] > 0
    assert phases["sample_factory"] == {"status": "not run", "reason": "--sf_python not given"}

    ratios = results["ratios"]
    assert ratios["training_vs_raw_1proc"] > 0 and ratios["sampling_vs_ceiling"] > 0
    assert ratios["training_vs_sf"] is None and ratios["training_variant_1_vs_sf"] is None
    assert len(results["commands"]) == 7  # raw 1 and per core, sampling and its variant, training, baseline, variant
    assert "--sampling_only=True" in phases["sampling_variant_1"]["command"]
    assert "--num_epochs=2" in phases["sampling_variant_1"]["command"]
    assert any("sf_core training" in line for line in results["table"])
    assert any(line.startswith("sf_core training --num_epochs=2") for line in results["table"])
    assert "frames/s" in proc.stdout
    check_time_accounting(training["summary"], proc.stdout)
    logs = tmp_path / "bench_logs"  # the temporary work dir went; each run's log stayed beside the results
    assert {"training.log", "sampling.log", "training_baseline.log"} <= {p.name for p in logs.iterdir()}
    assert "fps" in (logs / "training.log").read_text()


def check_time_accounting(summary: dict, stdout: str) -> None:
    """Every kind of component says where its time went, and every process when it reached each start-up step."""
    accounting = summary["time_accounting"]
    assert list(accounting) == ["rollout_worker", "inference_worker", "batcher", "learner"]
    named = {"rollout_worker": "env_step", "inference_worker": "forward", "batcher": "copy", "learner": "sgd"}
    for kind, k in accounting.items():
        assert k["components"] == 1 and k["wall_seconds"] > 2
        assert k["seconds"][named[kind]] > 0 and "waiting" in k["seconds"] and "other" in k["seconds"]
        assert sum(k["shares"].values()) == pytest.approx(1.0, abs=0.05)  # the phases split the wall time
    assert accounting["inference_worker"]["mean_batch_rows"] >= 1
    assert accounting["inference_worker"]["counts"]["batches"] > 10
    startup = summary["startup"]
    runner = startup["runner"]
    assert 0 < runner["main_started"] < runner["env_probed"] < runner["processes_started"] < runner["first_frame"]
    marks = {"rollout_worker": ["process_started", "loop_started", "envs_made", "first_step"],
             "inference_worker": ["process_started", "loop_started", "model_on_device", "first_forward"],
             "learner": ["process_started", "loop_started", "model_ready", "first_sgd"]}
    for kind, expected in marks.items():
        seen = startup["latest_by_kind"][kind]
        assert list(seen) == expected and all(0 < seen[m] < 60 for m in expected), (kind, seen)
        assert runner["main_started"] < seen["process_started"] <= seen["loop_started"]
    assert startup["latest_by_kind"]["rollout_worker"]["first_step"] <= runner["first_frame"]
    assert "training: where the time went" in stdout and "start-up, seconds after launch" in stdout


@pytest.mark.slow
def test_unusable_sf_python_fails_only_that_phase(tmp_path):
    out = tmp_path / "bench.json"
    proc = run_script(["--phases=sf", "--sf_python=/bin/false", f"--output={out}"], timeout=60)
    assert proc.returncode == 1
    sf = json.loads(out.read_text())["phases"]["sample_factory"]
    assert sf["status"] == "failed" and "sample_factory not importable" in sf["error"]


# ---------------------------------------------------------------------------------- our trainer's summary


def write_running_summary(tmp_path, frames: int, trained: int, elapsed: float) -> str:
    """training_summary.json as the trainer writes it while running (its own stats and writer)."""
    from sf_core.cli.arguments import parse_args
    from sf_core.records.experiment import Experiment
    from sf_core.run.stats import TrainingStats

    cfg, _ = parse_args(["--env=CartPole-v1", f"--train_dir={tmp_path}", "--experiment=e"])
    experiment = Experiment(cfg)
    os.makedirs(experiment.path, exist_ok=True)
    stats = TrainingStats(window=10, started=time.time() - elapsed)
    stats.frames, stats.samples_trained = frames, trained
    experiment.write_summary(stats.summary(None, None, running=True))
    return os.path.join(experiment.path, "training_summary.json")


def test_summary_poller_reads_the_trainers_running_summary(tmp_path):
    path = write_running_summary(tmp_path, 123_456, 98_304, elapsed=12.5)
    w = watch.Watch(command=[], wall_launched=time.time() - 20)
    os.utime(path, (w.wall_launched + 13.9, w.wall_launched + 13.9))  # written 13.9 s after launch
    poller = ours.SummaryPoller(path)
    point = poller(w)
    assert point is not None
    assert (point.frames, point.trained) == (123_456, 98_304)
    assert point.t == pytest.approx(12.5, abs=0.2)
    assert w.launch_offset == pytest.approx(1.4, abs=0.2)  # launch -> the trainer's clock zero
    assert poller(w) is None  # the same snapshot again is no new point


def test_summary_poller_skips_what_is_not_a_fresh_snapshot(tmp_path):
    path = str(tmp_path / "training_summary.json")
    w = watch.Watch(command=[], wall_launched=time.time() - 5)
    poller = ours.SummaryPoller(path)
    assert poller(w) is None  # not written yet
    for text in ('{"running": true, "seconds": 3.0, "fra', "[1, 2]", ""):  # a torn or foreign file
        with open(path, "w") as f:
            f.write(text)
        assert ours.read_summary(path) is None and poller(w) is None
    with open(path, "w") as f:
        json.dump({"running": True, "seconds": 3.0, "frames": 10, "samples_trained": 0}, f)
    os.utime(path, (w.wall_launched - 60, w.wall_launched - 60))
    assert poller(w) is None  # a previous run's file, before the trainer replaced it
    assert ours.read_summary(path) is not None
    os.utime(path, None)
    assert poller(w) == Point(t=3.0, frames=10, trained=0)
    with open(path, "w") as f:  # the final summary: its clock includes the shutdown
        json.dump({"running": False, "exit_code": 130, "seconds": 9.0, "frames": 90, "samples_trained": 0}, f)
    assert poller(w) is None
    assert ours.snapshot_point({"running": True, "seconds": 1.0}) is None  # counters missing


def test_our_result_needs_the_final_summary():
    points = [Point(t=float(t), frames=1000 * t, trained=500 * t) for t in range(1, 8)]
    w = watch.Watch(command=[], points=points, first_frames_t=1.0, window_covered=True, exit_code=130,
                    launch_offset=1.25)
    final = {"running": False, "exit_code": 130, "error": None, "time_to_first_frame": 0.75}
    result = ours.our_result(w, final, warmup=1.0, seconds=4.0, command="cmd")
    assert result["status"] == "ok"
    assert result["fps"] == pytest.approx(1000) and result["samples_trained_per_s"] == pytest.approx(500)
    assert result["time_to_first_frame_s"] == pytest.approx(2.0) and result["launch_to_trainer_clock_s"] == 1.25

    killed = ours.our_result(w, {**final, "running": True}, warmup=1.0, seconds=4.0, command="cmd")
    assert killed["status"] == "failed" and "still says running" in killed["error"]
    missing = ours.our_result(w, None, warmup=1.0, seconds=4.0, command="cmd")
    assert missing["status"] == "failed" and missing["error"] == "no training_summary.json"
    w.exit_code = 1
    crashed = ours.our_result(w, {**final, "exit_code": 1}, warmup=1.0, seconds=4.0, command="cmd")
    assert crashed["status"] == "failed" and crashed["error"] == "exit code 1"


FAKE_TRAINER = """
import json, os, signal, sys, time
path, started, frames = sys.argv[1], time.time(), 0
signal.signal(signal.SIGINT, lambda *_: (write(False, 130), sys.exit(130)))
def write(running, code=None):
    with open(path + ".tmp", "w") as f:
        json.dump({"running": running, "exit_code": code, "seconds": time.time() - started,
                   "frames": frames, "samples_trained": frames // 2}, f)
    os.replace(path + ".tmp", path)
while time.time() - started < 60:
    frames += 100
    write(True)
    print("status", frames, flush=True)
    time.sleep(0.1)
"""


@pytest.mark.slow
def test_watch_process_stops_a_trainer_once_its_summaries_cover_the_window(tmp_path):
    path = str(tmp_path / "training_summary.json")
    command = [sys.executable, "-c", FAKE_TRAINER, path]
    w = watch.watch_process(command, watch.Timing(warmup=0.3, seconds=0.8, startup_timeout=30),
                            str(tmp_path / "fake.log"), poll=ours.SummaryPoller(path))
    assert w.window_covered and w.stopped_by == "benchmark: SIGINT after the timed window"
    assert w.exit_code == 130 and w.wall_seconds < 20 and not w.killed
    assert 0 <= w.launch_offset < w.wall_seconds  # the fake's clock starts after its interpreter's start-up
    rates = window.window_rates(w.points, w.first_frames_t, 0.3, 0.8)
    assert rates["window"]["complete"] and rates["fps"] > 0
    assert rates["trained_per_s"] == pytest.approx(rates["fps"] / 2, rel=0.05)
    assert ours.read_summary(path)[0]["running"] is False
    assert "\nstatus 100\n" in (tmp_path / "fake.log").read_text()  # the console still goes to the log


# ---------------------------------------------------------------------------------- Sample Factory


def test_sample_factory_status_line_and_command():
    w = watch.Watch(command=[], wall_launched=time.time() - 20)
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(time.time() - 0.5))
    line = (f"\x1b[36m[{stamp},250][01234] Fps is (10 sec: 4096.0, 60 sec: 4096.0, 300 sec: 4096.0). "
            f"Total num frames: 40960. Throughput: 0: 4000.0. Samples: 41000. Policy #0 lag: (min: 0.0, avg: 0.4, "
            f"max: 2.0)\x1b[0m")
    point = sample_factory.parse_sf(line, 20.0, w)
    assert point is not None and (point.frames, point.samples) == (40960, 41000)
    assert 18.5 < point.t < 20.5
    assert sample_factory.parse_sf("[2023-06-19 08:22:20,123][01234] Heartbeat connected", 20.0, w) is None

    parse = sample_factory.line_parser(frameskip=4)  # SF counts frames with frameskip; trained samples are steps
    assert parse(line, 20.0, w).trained == 40960 // 4
    assert parse("[2023-06-19 08:22:20,123][01234] Collected {0: 40960}, FPS: 3512.5", 21.0, w) is None
    assert w.extra["sf_final_fps"] == 3512.5

    from sf_core.cli.arguments import parse_args

    cfg, _ = parse_args(["--env=CartPole-v1", "--num_workers=3", "--encoder_mlp_layers", "256", "128"])
    cmd = sample_factory.sf_command("/sf/bin/python", sample_factory.LAUNCHER, cfg,
                                    ["--set_workers_cpu_affinity=False"], "/tmp/sf_train", 99.7)
    assert cmd[:2] == ["/sf/bin/python", os.path.join(REPO, "scripts", "sf_launcher.py")]
    i = cmd.index("--encoder_mlp_layers")
    assert cmd[i + 1:i + 3] == ["256", "128"]
    for flag in ("--env=CartPole-v1", "--num_workers=3", f"--num_envs_per_worker={cfg.num_envs_per_worker}",
                 f"--rollout={cfg.rollout}", f"--batch_size={cfg.batch_size}", "--use_rnn=False",
                 "--train_for_seconds=99", "--device=cpu", "--set_workers_cpu_affinity=False"):
        assert flag in cmd
    by_module = sample_factory.sf_command("/sf/bin/python", sample_factory.LAUNCHER, cfg, [], "/tmp/sf_train", 99,
                                          module="sf_examples.train_gym_env", env="CartPole-v0")
    assert by_module[:3] == ["/sf/bin/python", "-m", "sf_examples.train_gym_env"] and "--env=CartPole-v0" in by_module


def test_a_relative_sf_python_is_made_absolute(tmp_path, monkeypatch):
    """Sample Factory runs in a working directory of its own, where ./.sf_python is not."""
    monkeypatch.chdir(tmp_path)
    launcher = tmp_path / ".sf_python"
    launcher.write_text("#!/bin/sh\n")
    launcher.chmod(0o755)
    assert sample_factory.resolve_python("./.sf_python") == str(launcher)
    assert sample_factory.resolve_python("sh") == shutil.which("sh")


def test_sf_launcher_is_a_runnable_file(tmp_path):
    import ast

    py_compile.compile(sample_factory.LAUNCHER, cfile=str(tmp_path / "launcher.pyc"), doraise=True)
    with open(sample_factory.LAUNCHER) as f:
        tree = ast.parse(f.read())
    functions = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
    assert {"make_env", "main"} <= functions  # SF's spawned workers import make_env from it
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert "sample_factory" in imported
    assert not imported & {"sf_core", "algo", "envs", "benchlib"}  # it runs in SF's venv, not ours


# ---------------------------------------------------------------------------------- window and report


def test_window_rates_skip_the_warmup():
    # 1,000 frames/s for the first 3 s (warm-up), then 10,000 frames/s
    points = [Point(t=float(t), frames=1000 * min(t, 3) + 10_000 * max(0, t - 3), trained=0) for t in range(1, 12)]
    rates = window.window_rates(points, first_t=1.0, warmup=2.0, seconds=5.0)
    assert rates["fps"] == pytest.approx(10_000)
    assert rates["window"]["start_s"] == 3.0 and rates["window"]["end_s"] == 8.0
    assert rates["window"]["complete"] is True and rates["window"]["status_lines"] == 6
    assert rates["interval_fps"] == {"min": 10_000.0, "max": 10_000.0, "cv": 0.0}
    assert "error" in window.window_rates(points[:1], first_t=1.0, warmup=2.0, seconds=5.0)
    assert "error" in window.window_rates(points, first_t=None, warmup=2.0, seconds=5.0)


def test_window_rates_of_a_run_that_ended_early_and_uneven_reports():
    # reports at uneven times: the rate is over the trainer's clock between the window's edges
    times = [0.5, 1.0, 2.2, 2.9, 4.4, 5.0]
    points = [Point(t=t, frames=int(2000 * t), trained=int(700 * t)) for t in times]
    rates = window.window_rates(points, first_t=0.5, warmup=0.5, seconds=10.0)
    assert rates["window"]["start_s"] == 1.0 and rates["window"]["end_s"] == 5.0
    assert rates["window"]["complete"] is False  # the last report came before the window's end
    assert rates["fps"] == pytest.approx(2000, rel=1e-3) and rates["trained_per_s"] == pytest.approx(700, rel=1e-3)
    # a report within the tolerance before the end still closes the window
    closes = window.window_rates(points, first_t=0.5, warmup=0.5, seconds=4.0 + window.WINDOW_TOLERANCE_SEC / 2)
    assert closes["window"]["complete"] is True and closes["window"]["end_s"] == 5.0


def test_samples_rate_over_the_window():
    points = [Point(t=float(t), frames=100 * t, trained=100 * t, samples=50 * t) for t in range(6)]
    assert window.samples_rate(points, {"start_s": 1.0, "end_s": 4.0}) == pytest.approx(50)
    assert window.samples_rate([Point(t=1.0, frames=0, trained=0), Point(t=2.0, frames=1, trained=1)],
                               {"start_s": 1.0, "end_s": 2.0}) is None  # our trainer reports no samples


def test_ratios_use_only_successful_phases():
    assert report.ratio(3.0, 2.0) == 1.5 and report.ratio(1.0, 3.0) == 0.3333
    assert report.ratio(None, 2.0) is None and report.ratio(1.0, 0) is None and report.ratio(1.0, None) is None
    phases = {"raw_env_1proc": {"status": "ok", "fps": 1000.0}, "raw_env_per_core": {"status": "ok", "fps": 2000.0},
              "sampling": {"status": "ok", "fps": 800.0},
              "training": {"status": "ok", "fps": 600.0, "samples_trained_per_s": 300.0},
              "training_variant_1": {"status": "ok", "fps": 900.0},
              "sample_factory": {"status": "ok", "fps": 200.0, "samples_trained_per_s": 50.0}}
    r = report.compute_ratios(phases)
    assert (r["training_vs_sf"], r["training_variant_1_vs_sf"], r["sampling_vs_sf"]) == (3.0, 4.5, 4.0)
    assert (r["training_vs_raw_1proc"], r["training_vs_ceiling"], r["raw_per_core_scaling"]) == (0.6, 0.3, 2.0)
    assert r["training_samples_trained_vs_sf"] == 6.0 and r["sf_vs_ceiling"] == 0.1
    assert r["training_vs_sampling"] == 0.75 and r["sampling_vs_ceiling"] == 0.4
    assert r["training_variant_1_vs_training"] == 1.5  # a variant against the same phase without its flags
    phases["sample_factory"] = {"status": "failed", "fps": 200.0, "samples_trained_per_s": 50.0}
    phases["sampling"]["status"] = "failed"
    r = report.compute_ratios(phases)
    assert r["training_vs_sf"] is None and r["training_variant_1_vs_sf"] is None
    assert r["training_samples_trained_vs_sf"] is None and r["sampling_vs_raw_1proc"] is None
    assert r["training_vs_raw_1proc"] == 0.6


def test_rounds_report_each_phases_median_round():
    runs = [{"status": "ok", "fps": 30.0, "round": 1}, {"status": "failed"}, {"status": "ok", "fps": 10.0, "round": 3},
            {"status": "ok", "fps": 20.0, "round": 4}]
    chosen = report.median_round(runs)
    assert chosen["round"] == 4 and chosen["fps"] == 20.0  # the median of the three that measured
    assert chosen["fps_rounds"] == [30.0, None, 10.0, 20.0]
    assert report.median_round(runs[:1] + runs[2:3])["fps"] == 10.0  # the lower of an even count
    assert "median of 30, -, 10, 20" in report._notes("training", chosen)
