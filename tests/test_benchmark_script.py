"""scripts/benchmark.py: a tiny end-to-end run (JSON structure, clean shutdown) and its parsers."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slow  # every test here trains or runs a script

SCRIPT = os.path.join(REPO, "scripts", "benchmark.py")


def load_benchmark():
    spec = importlib.util.spec_from_file_location("sf_core_benchmark_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file executes
    spec.loader.exec_module(module)
    return module


def run_script(args: list[str], timeout: float) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=timeout,
                          cwd=REPO, env=env)


def test_tiny_run_writes_every_figure(tmp_path):
    out = tmp_path / "bench.json"
    started = time.time()
    proc = run_script(["--seconds=1.5", "--warmup=0.3", "--num_workers=1", "--num_envs_per_worker=4",
                       "--worker_num_splits=2", "--rollout=16", "--batch_size=128", "--encoder_mlp_layers", "32",
                       "--variant=--num_epochs=2 --num_batches_per_epoch=2", f"--output={out}"], timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert time.time() - started < 150
    results = json.loads(out.read_text())

    assert results["finished"] is True
    assert results["machine"]["usable_cores"] >= 1 and results["machine"]["cpu_count"] >= 1
    assert results["settings"]["config"]["num_envs_per_worker"] == 4
    assert results["settings"]["config"]["encoder_mlp_layers"] == [32]
    phases = results["phases"]
    assert list(phases) == ["raw_env_1proc", "raw_env_per_core", "sampling", "training", "training_variant_1",
                            "sample_factory"]  # in the order they ran
    for name in ("raw_env_1proc", "raw_env_per_core", "sampling", "training", "training_variant_1"):
        assert phases[name]["status"] == "ok", phases[name]
        assert phases[name]["fps"] > 0
        assert phases[name]["peak_rss_mb"] > 0
    assert phases["raw_env_per_core"]["processes"] == results["machine"]["usable_cores"]
    assert phases["sampling"]["samples_trained_per_s"] == 0  # --sampling_only skips SGD
    training = phases["training"]
    assert training["samples_trained_per_s"] > 0
    assert training["window"]["seconds"] > 0 and training["window"]["frames"] > 0
    assert 0 < training["time_to_first_frame_trainer_s"] <= training["time_to_first_frame_s"]
    assert training["summary"]["exit_code"] in (0, 130)
    assert training["shm_files_left_behind"] == 0  # ours unlink their shared memory
    assert "--sampling_only=False" in training["command"] and "--sampling_only=True" in phases["sampling"]["command"]
    variant = phases["training_variant_1"]
    assert variant["label"] == "sf_core training --num_epochs=2 --num_batches_per_epoch=2"
    assert variant["command"].endswith("--restart_behavior=overwrite") and "--num_epochs=2" in variant["command"]
    assert variant["samples_trained_per_s"] > 0
    assert phases["sample_factory"] == {"status": "not run", "reason": "--sf_python not given"}

    ratios = results["ratios"]
    assert ratios["training_vs_raw_1proc"] > 0 and ratios["sampling_vs_ceiling"] > 0
    assert ratios["training_vs_sf"] is None and ratios["training_variant_1_vs_sf"] is None
    assert len(results["commands"]) == 5
    assert any("sf_core training" in line for line in results["table"])
    assert any(line.startswith("sf_core training --num_epochs=2") for line in results["table"])
    assert "frames/s" in proc.stdout


def test_unusable_sf_python_fails_only_that_phase(tmp_path):
    out = tmp_path / "bench.json"
    proc = run_script(["--phases=sf", "--sf_python=/bin/false", f"--output={out}"], timeout=60)
    assert proc.returncode == 1
    sf = json.loads(out.read_text())["phases"]["sample_factory"]
    assert sf["status"] == "failed" and "sample_factory not importable" in sf["error"]


def test_status_line_parser_matches_the_trainer_console_line():
    bench = load_benchmark()
    from sf_core.stats import TrainingStats

    stats = TrainingStats(window=10, started=time.time() - 12.5)
    stats.frames, stats.samples_trained = 123_456, 98_304
    watch = bench.Watch(command=[])
    point = bench.parse_ours("03:49:20 INFO " + stats.console_line(), 13.9, watch)
    assert point is not None
    assert (point.frames, point.trained) == (123_456, 98_304)
    assert point.t == pytest.approx(12.5, abs=0.2)
    assert watch.launch_offset == pytest.approx(1.4, abs=0.2)


def test_sample_factory_status_line_and_command():
    bench = load_benchmark()
    watch = bench.Watch(command=[], wall_launched=time.time() - 20)
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(time.time() - 0.5))
    line = (f"\x1b[36m[{stamp},250][01234] Fps is (10 sec: 4096.0, 60 sec: 4096.0, 300 sec: 4096.0). "
            f"Total num frames: 40960. Throughput: 0: 4000.0. Samples: 41000. Policy #0 lag: (min: 0.0, avg: 0.4, "
            f"max: 2.0)\x1b[0m")
    point = bench.parse_sf(line, 20.0, watch)
    assert point is not None and (point.frames, point.samples) == (40960, 41000)
    assert 18.5 < point.t < 20.5

    from sf_core.config import parse_args

    cfg, _ = parse_args(["--env=CartPole-v1", "--num_workers=3", "--encoder_mlp_layers", "256", "128"])
    cmd = bench.sf_command("/sf/bin/python", "/tmp/launcher.py", cfg, ["--set_workers_cpu_affinity=False"],
                           "/tmp/sf_train", 99.7)
    assert cmd[:2] == ["/sf/bin/python", "/tmp/launcher.py"]
    i = cmd.index("--encoder_mlp_layers")
    assert cmd[i + 1:i + 3] == ["256", "128"]
    for flag in ("--env=CartPole-v1", "--num_workers=3", f"--num_envs_per_worker={cfg.num_envs_per_worker}",
                 f"--rollout={cfg.rollout}", f"--batch_size={cfg.batch_size}", "--use_rnn=False",
                 "--train_for_seconds=99", "--device=cpu", "--set_workers_cpu_affinity=False"):
        assert flag in cmd


def test_window_rates_skip_the_warmup():
    bench = load_benchmark()
    P = bench.Point
    # 1,000 frames/s for the first 3 s (warm-up), then 10,000 frames/s
    points = [P(t=float(t), frames=1000 * min(t, 3) + 10_000 * max(0, t - 3), trained=0) for t in range(1, 12)]
    rates = bench.window_rates(points, first_t=1.0, warmup=2.0, seconds=5.0)
    assert rates["fps"] == pytest.approx(10_000)
    assert rates["window"]["start_s"] == 3.0 and rates["window"]["end_s"] == 8.0
    assert rates["window"]["complete"] is True
    assert "error" in bench.window_rates(points[:1], first_t=1.0, warmup=2.0, seconds=5.0)
