"""--with_wandb=True: an offline W&B run (WANDB_MODE=offline, nothing leaves the machine) in the
experiment folder, holding the TensorBoard scalars at the same env-frame steps, the config and the
run's project, group, tags and job type; enjoy adds its results and video to the same run."""

import json
import os

import pytest

from sf_core.cli.arguments import parse_args
from sf_core.records.wandb_logging import STEP, WandbWriter, with_run_id
from tests import launch
from tests.conftest import extra

extra("wandb", "wandb")
from tests.wandb_records import history, run_files, run_record  # noqa: E402  (after the skip: it imports wandb)

W_AND_B_INTERNAL = {"_runtime", "_step", "_timestamp", STEP}


def offline(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):  # nothing written under ~
        monkeypatch.setenv(name, str(tmp_path / "wandb_home"))


def tensorboard_scalars(experiment_path: str) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(os.path.join(experiment_path, "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


@pytest.mark.slow
def test_training_logs_the_tensorboard_scalars_and_config_then_enjoy_adds_the_video(tmp_path, monkeypatch):
    offline(monkeypatch, tmp_path)
    result = launch.run([f"--train_dir={tmp_path}", "--experiment=wb", "--env=CartPole-v1", "--serial_mode=True",
                         "--num_workers=1", "--train_for_env_steps=6000", "--experiment_summaries_interval=0.3",
                         "--with_wandb=True", "--wandb_project=sf_tests", "--wandb_group=sweep1",
                         "--wandb_tags", "cartpole", "smoke", "--wandb_job_type=train"], timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    path = os.path.join(str(tmp_path), "wb")
    with open(os.path.join(path, "config.json")) as f:
        run_id = json.load(f)["wandb_unique_id"]
    (training_run,) = run_files(path)
    assert training_run.endswith(f"run-{run_id}.wandb")
    run = run_record(training_run)
    assert (run.run_id, run.project, run.run_group, list(run.tags), run.job_type) == \
        (run_id, "sf_tests", "sweep1", ["cartpole", "smoke"], "train")
    config = {item.key: json.loads(item.value_json) for item in run.config.update}
    assert config["env"] == "CartPole-v1" and config["train_for_env_steps"] == 6000

    rows, scalars = history(training_run), tensorboard_scalars(path)
    logged = {key for row in rows for key in row} - W_AND_B_INTERNAL
    assert "episode/return" in logged and logged == set(scalars)
    for tag in ("episode/return", "perf/samples_trained"):
        in_wandb = [(int(row[STEP]), float(row[tag])) for row in rows if tag in row]
        assert [step for step, _ in in_wandb] == [step for step, _ in scalars[tag]], tag
        assert [v for _, v in in_wandb] == pytest.approx([v for _, v in scalars[tag]], rel=1e-6), tag

    result = launch.run([f"--train_dir={tmp_path}", "--experiment=wb", "--max_num_episodes=2", "--save_video=True",
                         "--video_frames=30"], timeout=120, module="sf_core.enjoy")
    assert result.returncode == 0, result.stderr[-3000:]
    enjoy_run = [f for f in run_files(path) if f != training_run]
    assert len(enjoy_run) == 1 and enjoy_run[0].endswith(f"run-{run_id}.wandb")  # the same run, resumed
    (row,) = [row for row in history(enjoy_run[0]) if "eval/mean_return" in row]
    with open(os.path.join(path, "eval_results.json")) as f:
        assert float(row["eval/mean_return"]) == pytest.approx(json.load(f)["mean_return"])
    assert int(row[STEP]) >= 6000  # logged at the checkpoint's frames
    assert json.loads(row["eval/replay/_type"]) == "video-file"
    video = os.path.join(os.path.dirname(enjoy_run[0]), "files", json.loads(row["eval/replay/path"]))
    assert video.endswith(".mp4") and os.path.getsize(video) > 1000


def test_the_run_id_is_kept_when_the_experiment_resumes(tmp_path):
    cfg, _ = parse_args(["--env=CartPole-v1", f"--train_dir={tmp_path}", "--experiment=e", "--with_wandb=True"])
    first = with_run_id(cfg, str(tmp_path / "e"))
    assert first.wandb_unique_id.startswith("e_")
    os.makedirs(tmp_path / "e")
    (tmp_path / "e" / "config.json").write_text(first.to_json())
    assert with_run_id(cfg, str(tmp_path / "e")).wandb_unique_id == first.wandb_unique_id
    restarted = with_run_id(cfg.__class__(**{**vars(cfg), "restart_behavior": "restart"}), str(tmp_path / "e"))
    assert restarted.wandb_unique_id != first.wandb_unique_id
    given = with_run_id(cfg.__class__(**{**vars(cfg), "wandb_unique_id": "mine"}), str(tmp_path / "e"))
    assert given.wandb_unique_id == "mine"


class Recorder:
    def __init__(self):
        self.logged, self.scalars, self.finished = [], [], False

    def add_scalar(self, tag, value, step):
        self.scalars.append((tag, value, step))

    def log(self, row):
        self.logged.append(row)

    def flush(self):
        pass

    def close(self):
        pass

    def finish(self):
        self.finished = True


def test_the_writer_logs_one_row_per_step_with_every_tensorboard_scalar():
    tensorboard, run = Recorder(), Recorder()
    writer = WandbWriter(tensorboard, run)
    writer.add_scalar("a", 1.0, 100)
    writer.add_scalar("b", 2.0, 100)
    writer.flush()
    writer.add_scalar("a", 3.0, 200)
    writer.close()
    assert tensorboard.scalars == [("a", 1.0, 100), ("b", 2.0, 100), ("a", 3.0, 200)]
    assert run.logged == [{"a": 1.0, "b": 2.0, STEP: 100}, {"a": 3.0, STEP: 200}] and run.finished
