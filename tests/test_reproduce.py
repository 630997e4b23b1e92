"""scripts/reproduce.py: the published scores, where a curve reaches them, the table, bad command lines; and one
short run end to end (train, curve, evaluation, raw rate, results, plot), then the same command again."""

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

import reproduce  # noqa: E402
from benchlib import published  # noqa: E402
from benchlib.reproduction_report import build_results, markdown  # noqa: E402

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
MACHINE = {"cpu_model": "Test CPU", "usable_cores": 2, "cpu_count": 2, "gpu": [], "load_average_at_start": [1, 1, 1]}


def test_the_published_scores_name_their_source_metric_and_budget():
    scores = published.load()
    assert scores.suites["mujoco"] == ["HalfCheetah-v5", "Hopper-v5", "Walker2d-v5", "Ant-v5", "Humanoid-v5",
                                       "InvertedPendulum-v5"]
    hopper = {ref.source: ref for ref in scores.references("Hopper-v5")}
    cleanrl, zoo = hopper["cleanrl_ppo_continuous_action"], hopper["rl_zoo_ppo"]
    assert (cleanrl.mean, cleanrl.std, cleanrl.their_env, cleanrl.budget_frames, cleanrl.seeds) == \
        (2382.86, 271.74, "Hopper-v4", 1_000_000, 3)
    assert (cleanrl.ours, zoo.ours, zoo.their_env) == ("final_return", "eval", "Hopper-v3")
    pong = {ref.source: ref for ref in scores.references("atari_pong")}
    assert pong["cleanrl_ppo_atari"].budget_frames == 40_000_000  # 10M agent steps, frame skip 4
    for suite in scores.suites.values():
        for env in suite:
            assert scores.references(env) and all(ref.url and ref.citation for ref in scores.references(env))


def test_a_curve_reaches_a_score_at_its_first_point_at_or_above_it():
    frames, seconds, values = [10, 20, 30, 40], [1.0, 2.0, 3.0, 4.0], [-300.0, -199.0, -250.0, -150.0]
    assert published.first_reaching(frames, seconds, values, -200) == (2.0, 20)
    assert published.first_reaching(frames, seconds, values, -150) == (4.0, 40)
    assert published.first_reaching(frames, seconds, values, 0) is None


def _record(seed: int, final: float, evaluation: float, returns: list[float]) -> dict:
    frames = [100_000 * (i + 1) for i in range(len(returns))]
    return {"run_id": f"CartPole-v1_s{seed}", "suite": "classic", "env": "CartPole-v1", "seed": seed,
            "status": "ok", "wall_seconds": 10.0 + seed,
            "training": {"frames": frames[-1], "final_return": final, "fps": 20_000.0},
            "evaluation": {"episodes": 10, "mean": evaluation, "std": 0.0},
            "curve": {"frames": frames, "seconds": [5.0 * (i + 1) for i in range(len(returns))], "returns": returns}}


def test_the_table_sets_each_reference_beside_the_figure_of_ours_it_is_compared_with():
    scores = published.load()
    records = [_record(1, 490.0, 500.0, [100.0, 480.0, 490.0]), _record(2, 300.0, 200.0, [100.0, 200.0, 300.0])]
    context = {"command": "python scripts/reproduce.py --suite=classic", "date": "today", "commit": "abc",
               "machine": MACHINE, "settings": {"eval_episodes": 10}}
    results = build_results(records, scores, context)
    cartpole = results["envs"]["CartPole-v1"]
    assert cartpole["eval"] == {"mean": 350.0, "std": 150.0, "n": 2}
    assert cartpole["final_return"]["mean"] == 395.0 and cartpole["median_wall_seconds"] == 11.5
    threshold = cartpole["references"][0]
    assert (threshold["compared_with"], threshold["ours"], threshold["at_least"]) == ("final_return", 395.0, False)
    assert threshold["seeds_reaching"] == 1
    assert threshold["median_seconds_to_reach"] is None  # one of two seeds never reached it: the median did not
    assert results["runs"][0]["to_reference"] == [
        {"source": "gymnasium_reward_threshold", "score": 475.0, "seconds": 10.0, "frames": 200_000}]
    assert "to_reference" not in records[0]  # the records themselves are left as they were
    table = markdown(results, scores)
    row = next(line for line in table.splitlines() if line.startswith("| CartPole-v1 |"))
    assert row.split(" | ")[1:4] == ["350 ± 150", "395 ± 95", "< 475"]
    assert "not reached (1/2)" in row
    assert "gymnasium threshold (vs. our training return)" in table and "Command: `python scripts/reproduce.py" in table


@pytest.mark.parametrize("argv, message", [
    (["--suite=nope"], "unknown suite 'nope'"),
    (["--suite=classic", "--envs=Hopper-v5"], "unknown env 'Hopper-v5' in suite classic"),
    (["--envs=NoSuchEnv-v0"], "unknown env 'NoSuchEnv-v0'"),
    (["--suite=classic", "--seeds=1,two"], "--seeds takes distinct integers"),
    (["--suite=classic", "--seeds=1,1"], "--seeds takes distinct integers"),
    (["--suite=classic", "--frames=-5"], "--frames takes a positive number"),
    ([], "name a suite"),
])
def test_a_command_line_that_cannot_run_gets_one_line_and_exit_status_2(argv, message, tmp_path, capsys):
    assert reproduce.main([*argv, f"--out={tmp_path / 'out'}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("reproduce: error: ") and message in err and err.count("\n") == 1
    assert not os.path.exists(tmp_path / "out")


@pytest.mark.slow
def test_a_short_cartpole_run_is_recorded_compared_and_plotted_then_not_run_again(tmp_path):
    out = tmp_path / "out"
    argv = ["--suite=classic", "--envs=CartPole-v1", "--seeds=3", "--frames=40000", "--eval_episodes=2",
            "--raw_rate", "--raw_seconds=0.5", "--extra=--experiment_summaries_interval=0.25", f"--out={out}"]
    first = launch.run(argv, timeout=180, script="scripts/reproduce.py")
    assert first.returncode == 0, first.stdout + first.stderr
    assert "[1/1] CartPole-v1 seed 3: training, 40k frames" in first.stdout

    results = json.loads((out / "results.json").read_text())
    run = results["runs"][0]
    assert run["status"] == "ok" and run["exit_code"] == 0 and run["budget_from"] == "--frames"
    assert "--train_for_env_steps=40000" in run["command"] and run["command"].endswith("--restart_behavior=overwrite")
    curve, training = run["curve"], run["training"]
    assert len(curve["frames"]) >= 2 and curve["frames"] == sorted(curve["frames"])
    assert curve["seconds"] == sorted(curve["seconds"]) and 0 < curve["seconds"][-1] <= run["wall_seconds"]
    assert training["frames"] >= 40_000 and curve["frames"][-1] == training["frames"]
    assert training["final_return"] == pytest.approx(curve["returns"][-1], abs=1e-3) and training["fps"] > 0
    evaluation = run["evaluation"]
    assert len(evaluation["returns"]) == 2 and evaluation["deterministic"] and evaluation["seconds"] > 0
    assert evaluation["first_seed"] != 3  # apart from the training seeds
    assert run["raw"]["fps"] > 0 and run["raw"]["episode_length"] == round(training["mean_length"])
    assert run["raw"]["training_vs_raw"] == pytest.approx(training["fps"] / run["raw"]["fps"], rel=1e-2)
    reached = run["to_reference"][0]
    assert reached["score"] == 475.0 and (reached["seconds"] is None) == (max(curve["returns"]) < 475)
    env = results["envs"]["CartPole-v1"]
    assert env["eval"]["mean"] == evaluation["mean"] and env["median_wall_seconds"] == run["wall_seconds"]
    assert results["machine"]["cpu_model"] and results["commit"] and "scripts/reproduce.py" in results["command"]

    table = (out / "results.md").read_text()
    assert any(line.startswith("| CartPole-v1 |") and "475" in line for line in table.splitlines())
    assert (out / "plots" / "CartPole-v1.png").read_bytes().startswith(PNG_SIGNATURE)
    assert (out / "logs" / f"{run['run_id']}.log").stat().st_size > 0

    record = out / "records" / f"{run['run_id']}.json"
    summary = out / "runs" / run["run_id"] / "training_summary.json"
    before, trained_at = record.read_bytes(), summary.stat().st_mtime_ns
    again = launch.run(argv, timeout=120, script="scripts/reproduce.py")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "1 runs, 0 to train" in again.stdout and "(recorded before)" in again.stdout
    assert record.read_bytes() == before and summary.stat().st_mtime_ns == trained_at  # nothing trained again
    assert json.loads((out / "results.json").read_text())["runs"] == results["runs"]


@pytest.mark.slow  # the trainer's flag checks import torch: seconds, though nothing trains
def test_a_run_trains_for_frames_else_the_presets_budget_else_the_published_one(monkeypatch):
    from sf_core.run import presets

    scores = published.load()

    def plan(*argv: str) -> list:
        return reproduce.plan_runs(reproduce.build_parser().parse_args([*argv, "--seeds=1"]), scores)

    hopper, pendulum = plan("--envs=Hopper-v5,InvertedPendulum-v5")  # both get the MuJoCo family's preset
    assert (hopper.budget, hopper.budget_from, hopper.run_id) == (1_000_000, "trainer", "Hopper-v5_s1")
    assert not any(flag.startswith("--train_for_env_steps") for flag in hopper.command("/runs"))
    assert pendulum.budget_from == "trainer"
    monkeypatch.setattr(presets, "FAMILIES", {})  # InvertedPendulum-v5 without a preset: the published budget
    (pendulum,) = plan("--envs=InvertedPendulum-v5")
    assert (pendulum.budget, pendulum.budget_from) == (1_000_000, "references")
    assert "--train_for_env_steps=1000000" in pendulum.command("/runs")
    (short,) = plan("--envs=Hopper-v5", "--frames=5000", "--extra=--num_epochs=2")
    assert short.budget == 5000 and short.run_id.startswith("Hopper-v5_s1_f5000_x") and short.run_id != "Hopper-v5_s1"
    assert short.command("/runs")[-3:] == ["--train_for_env_steps=5000", "--num_epochs=2",
                                           "--restart_behavior=overwrite"]


@pytest.mark.slow
def test_a_run_that_fails_is_recorded_with_its_log_and_the_others_go_on(tmp_path):
    # an env module the flag check imports, which then fails in the trainer itself
    (tmp_path / "fails_in_trainer.py").write_text(
        'import sys\nif sys.argv[0].endswith("train.py"):\n    raise RuntimeError("this env module fails")\n')
    out = tmp_path / "out"
    env = {**launch.environment(), "PYTHONPATH": f"{REPO}{os.pathsep}{tmp_path}"}
    argv = ["--envs=CartPole-v1", "--seeds=1,2", "--frames=20000", "--extra=--env_module=fails_in_trainer",
            f"--out={out}"]
    done = subprocess.run(launch.command(argv, script="scripts/reproduce.py"), capture_output=True, text=True,
                          timeout=120, cwd=REPO, env=env)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.count("FAILED (exit code 1;") == 2 and "RuntimeError: this env module fails" in done.stdout
    runs = json.loads((out / "results.json").read_text())["runs"]
    assert [(r["seed"], r["status"]) for r in runs] == [(1, "failed"), (2, "failed")]
    assert any("this env module fails" in line for line in runs[0]["log_tail"])
    assert "| CartPole-v1 (2 of 2 failed) |" in (out / "results.md").read_text()


def test_a_record_made_with_other_trainer_values_is_trained_again(monkeypatch):
    from benchlib import reproduction as repro
    from sf_core.run import presets

    digest = reproduce.config_digest("CartPole-v1", ())
    assert digest == reproduce.config_digest("CartPole-v1", ())
    assert digest != reproduce.config_digest("CartPole-v1", ("--num_epochs=3",))
    spec = repro.RunSpec("classic", "CartPole-v1", 1, 1000, "trainer", (), digest)
    record = {"format_version": repro.FORMAT_VERSION, "status": "ok", "env": "CartPole-v1", "seed": 1,
              "budget_frames": 1000, "extra": [], "config": digest}
    assert spec.trained_by(record) and not spec.trained_by({**record, "config": "an older preset"})
    monkeypatch.setitem(presets.PRESETS, "CartPole-v1", {**presets.PRESETS["CartPole-v1"], "num_epochs": 7})
    assert reproduce.config_digest("CartPole-v1", ()) != digest  # a preset tuned since: another run
