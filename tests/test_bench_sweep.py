"""scripts/benchmark.py --sweep and --scaling: the grid, the best point and its ratio to the trainer's defaults,
the scaling table and plot (scripts/benchlib/sweep.py, scaling.py), with a fake trainer; and one short real sweep."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

import pytest

from tests import launch
from tests.conftest import REPO, extra

SCRIPT = os.path.join(REPO, "scripts", "benchmark.py")
if os.path.join(REPO, "scripts") not in sys.path:
    sys.path.insert(0, os.path.join(REPO, "scripts"))  # scripts/ is no package: benchlib is top-level there

import benchmark  # noqa: E402
from benchlib import scaling, sweep  # noqa: E402

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
BEST = re.compile(r"^best for this machine and (\S+): --num_workers=(\d+) --num_envs_per_worker=(\d+) "
                  r"--policy_workers_per_policy=(\d+) \(([\d,]+) frames/s, (\d+\.\d\d)× the trainer's defaults\)$")


def bench_for(argv: list[str], tmp_path) -> benchmark.Benchmark:
    """A Benchmark as main() builds it (flags checked, config resolved), with no trainer started yet."""
    args = benchmark.build_parser().parse_args(["--env=CartPole-v1", f"--output={tmp_path / 'b.json'}", *argv])
    benchmark.check_args(args)
    cfg_argv, extra, cfg = benchmark.resolve_config(args)
    return benchmark.Benchmark(args, cfg_argv, extra, cfg, str(tmp_path))


def fake_trainer(bench: benchmark.Benchmark, fps_of, calls: list) -> None:
    """Replace the trainer runs: `fps_of(flags)` gives a point's frames/s, or raises as a failed run would."""

    def ours(name: str, extra: list[str], sampling_only: bool) -> dict:
        calls.append((name, extra, sampling_only))
        return {"status": "ok", "fps": fps_of(extra), "peak_rss_mb": 100.0}

    bench.ours = ours  # type: ignore[method-assign]


def value(flags: list[str], name: str) -> int | None:
    found = [int(f.split("=", 1)[1]) for f in flags if f.startswith(f"--{name}=")]
    return found[-1] if found else None


# ---------------------------------------------------------------------------------- the grid


@pytest.mark.parametrize("cores, workers, inference", [(1, [1, 2], [1]), (2, [1, 2, 4], [1]), (3, [1, 3, 6], [1]),
                                                       (8, [4, 8, 16], [1, 2]), (16, [8, 16, 32], [1, 2])])
def test_default_axes_follow_the_cores(cores, workers, inference):
    base = {"num_workers": 5, "num_envs_per_worker": 24, "policy_workers_per_policy": 3}
    axes = sweep.default_axes(base, cores)
    assert axes == {"num_workers": workers, "num_envs_per_worker": [24, 48], "policy_workers_per_policy": inference}


def test_plan_crosses_the_axes_and_measures_the_defaults_once(tmp_path):
    bench = bench_for(["--sweep"], tmp_path)
    cfg, cores = bench.cfg, benchmark.usable_cores()
    base = {name: getattr(cfg, name) for name in sweep.SWEPT}
    points = bench.sweep.points
    assert points[0].defaults and points[0].flags == base and points[0].argv() == []  # no sweep flags at all
    assert [p.phase for p in points] == [f"sweep_{i}" for i in range(1, len(points) + 1)]
    axes = sweep.default_axes(base, cores)
    assert bench.sweep.axes == axes
    grid = {(w, e, i) for w in axes["num_workers"] for e in axes["num_envs_per_worker"]
            for i in axes["policy_workers_per_policy"]}
    seen = [tuple(p.flags[n] for n in sweep.SWEPT) for p in points]
    assert len(seen) == len(set(seen))  # each configuration once
    assert set(seen) == grid | {tuple(base.values())}
    assert len(points) == len(grid) + (tuple(base.values()) not in grid)
    assert all(p.rejected is None for p in points)
    assert bench.results["settings"]["phases"] == ["sweep"]


def test_overrides_replace_their_axis_only(tmp_path):
    bench = bench_for(["--sweep", "--sweep_num_workers=3,1,3", "--sweep_policy_workers=2"], tmp_path)
    envs = bench.cfg.num_envs_per_worker
    assert bench.sweep.axes == {"num_workers": [3, 1], "num_envs_per_worker": [envs, 2 * envs],
                                "policy_workers_per_policy": [2]}
    assert bench.sweep.points[1].argv() == ["--num_workers=3", f"--num_envs_per_worker={envs}",
                                            "--policy_workers_per_policy=2"]
    assert len(bench.sweep.points) == 1 + 4


@pytest.mark.parametrize("argv, message", [
    (["--sweep", "--sweep_num_workers=2,x"], "--sweep_num_workers takes positive integers"),
    (["--sweep", "--sweep_num_envs_per_worker=0,8"], "--sweep_num_envs_per_worker takes positive integers"),
    (["--sweep_policy_workers=1,2"], "--sweep_policy_workers given without --sweep"),
    (["--sweep", "--scaling=2,4"], "separate runs"),
    (["--plot=x.png"], "--plot draws the --scaling run"),
    (["--scaling=4,,-2"], "--scaling takes positive integers"),
])
def test_malformed_sweep_and_scaling_flags_stop_the_run(argv, message):
    args = benchmark.build_parser().parse_args(argv)
    with pytest.raises(SystemExit, match=re.escape(message)):
        benchmark.check_args(args)


def test_env_counts_are_fitted_to_the_splits(tmp_path):
    assert sweep.fit_envs([5, 6, 9, 8], 2) == ([6, 10, 8], [
        "--num_envs_per_worker=5 is not divisible by --worker_num_splits=2: 6 instead",
        "--num_envs_per_worker=9 is not divisible by --worker_num_splits=2: 10 instead"])
    assert sweep.fit_envs([1, 3], 4)[0] == [4]  # both round up to one env per split: measured once

    bench = bench_for(["--sweep", "--worker_num_splits=4", "--num_envs_per_worker=8",
                       "--sweep_num_workers=1", "--sweep_num_envs_per_worker=6,8,10"], tmp_path)
    assert bench.sweep.axes["num_envs_per_worker"] == [8, 12]
    assert any("--num_envs_per_worker=6 is not divisible by --worker_num_splits=4: 8" in n for n in bench.sweep.notes)
    for p in bench.sweep.points:  # the trainer's config accepts every point as it will run
        assert p.flags["num_envs_per_worker"] % 4 == 0
        assert isinstance(sweep.resolve(bench.cfg_argv, bench.extra, p.argv()), dict)


def test_a_grid_point_equal_to_the_defaults_is_measured_once():
    base = {"num_workers": 2, "num_envs_per_worker": 64, "policy_workers_per_policy": 1}
    axes = {"num_workers": [1, 2, 4], "num_envs_per_worker": [64, 128], "policy_workers_per_policy": [1]}
    points = sweep.build_points(axes, base, lambda flags: None)
    assert len(points) == 6 and [p.defaults for p in points] == [True] + [False] * 5
    assert sum(p.flags == base for p in points) == 1
    assert points[0].argv() == [] and "--num_workers=2" in points[0].describe()


def test_points_the_config_rejects_are_skipped_and_said_so():
    base = {"num_workers": 2, "num_envs_per_worker": 8, "policy_workers_per_policy": 1}
    axes = {"num_workers": [2, 4], "num_envs_per_worker": [8], "policy_workers_per_policy": [1]}
    points = sweep.build_points(axes, base, lambda flags: "too many" if "--num_workers=4" in flags else None)
    assert [(p.flags["num_workers"], p.defaults, p.rejected) for p in points] == [
        (2, True, None), (4, False, "too many")]
    entries = sweep.entries(points, {"sweep_1": {"status": "ok", "fps": 10.0}})
    assert entries[1]["status"] == "skipped" and entries[1]["reason"] == "too many" and entries[1]["fps"] is None
    rejected = sweep.resolve(["--env=CartPole-v1"], ["--worker_num_splits=2"], ["--num_envs_per_worker=3"])
    assert isinstance(rejected, str) and "divisible" in rejected  # the trainer's own reason, passed on


# ---------------------------------------------------------------------------------- running it, the best point


def test_sweep_runs_every_point_records_a_failure_and_names_the_best(tmp_path, capsys):
    bench = bench_for(["--sweep", "--sweep_num_workers=1,4", "--sweep_num_envs_per_worker=8,16",
                       "--extra=--num_epochs=1"], tmp_path)
    calls: list = []

    def fps_of(extra: list[str]) -> float:
        workers, envs = value(extra, "num_workers"), value(extra, "num_envs_per_worker")
        if workers == 4 and envs == 8:
            raise RuntimeError("trainer crashed")
        return 1000.0 if workers is None else 100.0 * workers * envs  # None: the defaults point

    fake_trainer(bench, fps_of, calls)
    bench.run_all()
    assert len(calls) == len(bench.sweep.points) == 5
    assert all(extra[0] == "--num_epochs=1" and not sampling for _, extra, sampling in calls)  # --extra: every point
    results = bench.results
    assert [e["status"] for e in results["sweep"]] == ["ok", "ok", "ok", "failed", "ok"]
    assert "trainer crashed" in results["sweep"][3]["reason"]
    assert results["sweep_best"] == {"flags": {"num_workers": 4, "num_envs_per_worker": 16,
                                               "policy_workers_per_policy": 1}, "fps": 6400.0, "vs_defaults": 6.4}

    capsys.readouterr()  # the phases' own lines
    benchmark.print_mode_summary(results, bench.args, str(tmp_path))
    lines = capsys.readouterr().out.strip().splitlines()
    match = BEST.match(lines[-1])
    assert match, lines[-1]
    assert match.groups() == ("CartPole-v1", "4", "16", "1", "6,400", "6.40")
    fps_column = [line.split()[3] for line in lines[3:8]]
    assert fps_column == ["6,400", "1,600", "1,000", "800", "failed"]  # sorted by frames/s, no figure last


def test_an_interrupted_sweep_keeps_what_it_measured(tmp_path):
    bench = bench_for(["--sweep", "--sweep_num_workers=1", "--sweep_num_envs_per_worker=8,16"], tmp_path)

    def fps_of(extra: list[str]) -> float:
        if value(extra, "num_envs_per_worker") == 8:
            raise KeyboardInterrupt
        return 500.0

    fake_trainer(bench, fps_of, [])
    with pytest.raises(KeyboardInterrupt):
        bench.run_all()
    assert [e["status"] for e in bench.results["sweep"]] == ["ok", "interrupted", "not run"]


def test_rounds_report_each_points_median(tmp_path, capsys):
    bench = bench_for(["--sweep", "--sweep_num_workers=1", "--sweep_num_envs_per_worker=8", "--rounds=3"], tmp_path)
    figures = iter([100.0, 300.0, 400.0, 200.0, 250.0, 900.0])  # defaults, point, defaults, point, ...
    fake_trainer(bench, lambda extra: next(figures), [])
    bench.run_all()
    defaults, point = bench.results["sweep"]
    assert defaults["fps"] == 250.0 and defaults["fps_rounds"] == [100.0, 400.0, 250.0]
    assert point["fps"] == 300.0 and point["fps_rounds"] == [300.0, 200.0, 900.0]
    assert bench.results["sweep_best"]["vs_defaults"] == 1.2
    lines = sweep.report_lines(bench.results["sweep"], "CartPole-v1")
    assert lines[2].endswith("median of 300, 200, 900")


def entry(workers: int, fps: float | None, defaults: bool = False, status: str = "ok") -> dict:
    return {"flags": {"num_workers": workers, "num_envs_per_worker": 8, "policy_workers_per_policy": 1},
            "defaults": defaults, "status": status, "fps": fps, "peak_rss_mb": None, "phase": ""}


def test_best_is_compared_with_the_defaults_point():
    best, vs = sweep.pick_best([entry(2, 1000.0, defaults=True), entry(1, 1500.0), entry(4, 1250.0)])
    assert best["flags"]["num_workers"] == 1 and vs == 1.5
    best, vs = sweep.pick_best([entry(2, 1000.0, defaults=True), entry(1, 1000.0)])
    assert best["defaults"] and vs == 1.0  # a tie keeps the defaults: no change for no gain
    best, vs = sweep.pick_best([entry(2, None, defaults=True, status="failed"), entry(1, 700.0)])
    assert best["flags"]["num_workers"] == 1 and vs is None
    assert sweep.best_line([entry(2, None, defaults=True, status="failed"), entry(1, 700.0)], "X").endswith(
        "(700 frames/s, the trainer's defaults measured nothing to compare with)")
    assert sweep.pick_best([entry(2, None, defaults=True, status="failed")]) == (None, None)
    assert sweep.best_line([entry(2, None, defaults=True, status="failed")], "X").startswith("no point of the sweep")
    line = sweep.best_line([entry(2, 40_000.0, defaults=True), entry(4, 83_624.0)], "CartPole-v1")
    assert BEST.match(line).groups() == ("CartPole-v1", "4", "8", "1", "83,624", "2.09")


# ---------------------------------------------------------------------------------- scaling


def test_scaling_runs_each_worker_count_fewest_first(tmp_path, capsys):
    bench = bench_for(["--scaling=4,1,2,4"], tmp_path)
    assert [p.workers for p in bench.scaling] == [1, 2, 4]
    assert all(p.resolved["num_workers"] == p.workers for p in bench.scaling)
    calls: list = []
    fake_trainer(bench, lambda extra: {1: 1000.0, 2: 1800.0, 4: 2000.0}[value(extra, "num_workers")], calls)
    bench.run_all()
    assert [value(extra, "num_workers") for _, extra, _ in calls] == [1, 2, 4]
    scaled = bench.results["scaling"]
    assert [(e["num_workers"], e["fps"], e["fps_per_worker"]) for e in scaled] == [
        (1, 1000.0, 1000.0), (2, 1800.0, 900.0), (4, 2000.0, 500.0)]
    assert bench.results["settings"]["phases"] == ["scaling"]

    capsys.readouterr()
    benchmark.print_mode_summary(bench.results, bench.args, str(tmp_path))
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[1].split()[:6] == ["workers", "inference", "workers", "envs/worker", "frames/s", "frames/s"]
    four = scaled[-1]["flags"]  # as the trainer resolves --num_workers=4 (inference workers may be fitted to it)
    assert lines[-1].split()[:6] == ["4", str(four["policy_workers_per_policy"]), str(four["num_envs_per_worker"]),
                                     "2,000", "500", "2.00"]
    assert "x 1 worker " in lines[1]


def test_plot_writes_a_png(tmp_path):
    extra("matplotlib", "plot")
    points = [{"num_workers": n, "fps": fps, "status": "ok"} for n, fps in ((2, 900.0), (4, 1700.0), (8, 2100.0))]
    points.append({"num_workers": 16, "fps": None, "status": "failed"})
    path = tmp_path / "scaling.png"
    title = scaling.plot_title("CartPole-v1", 2, scaling.device_name("cpu"))
    assert title == "CartPole-v1: training frames/s against rollout workers\n2 usable cores, CPU"
    assert scaling.write_plot(points, str(path), title) is True
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and len(data) > 5000

    nothing = tmp_path / "none.png"
    assert scaling.write_plot(points[-1:], str(nothing), title) is False and not nothing.exists()


# ---------------------------------------------------------------------------------- one real sweep


@pytest.mark.slow
def test_tiny_sweep_measures_every_point_and_names_the_best(tmp_path):
    out = tmp_path / "sweep.json"
    # the benchmark's own flags make the defaults point one of the grid's two: two trainer runs, not three
    proc = launch.run(["--env=CartPole-v1", "--num_workers=1", "--num_envs_per_worker=8", "--sweep",
                       "--sweep_num_workers=1", "--sweep_num_envs_per_worker=8,16", "--seconds=1.5", "--warmup=1",
                       f"--output={out}"], timeout=150, script=SCRIPT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads(out.read_text())
    points = results["sweep"]
    grid = [(p["flags"]["num_workers"], p["flags"]["num_envs_per_worker"], p["flags"]["policy_workers_per_policy"])
            for p in points]
    assert sorted(grid) == [(1, 8, 1), (1, 16, 1)]
    assert [p["defaults"] for p in points if p["flags"]["num_envs_per_worker"] == 8] == [True]
    for p in points:
        assert p["status"] == "ok" and p["fps"] > 0, p
        assert results["phases"][p["phase"]]["status"] == "ok"
    match = BEST.match(proc.stdout.strip().splitlines()[-1])
    assert match, proc.stdout[-1500:]
    best = tuple(int(g) for g in match.groups()[1:4])
    assert best in grid
    assert abs(int(match.group(5).replace(",", "")) - max(p["fps"] for p in points)) <= 1
    assert results["sweep_best"]["flags"] == dict(zip(sweep.SWEPT, best))
