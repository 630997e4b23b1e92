"""Sharing on the Hugging Face Hub without a network: push_to_hub stages the folder a repository would
get (checked here file by file, the model card's metadata parsed), the upload goes through
huggingface_hub's API (a stand-in records the calls), and load_from_hub reads a snapshot from a local
cache laid out as huggingface_hub lays it out (HF_HUB_OFFLINE=1), after which enjoy plays it."""

import hashlib
import json
import os
import shlex
import shutil

import pytest
import yaml

from sf_core.cli.arguments import parse_args
from sf_core.cli.push_to_hub import upload
from sf_core.records import checkpoint
from sf_core.records.experiment import load_config
from sf_core.sharing.model_card import UNREPRODUCED, train_command
from tests import launch
from tests.conftest import extra
from tests.policies import random_policy_experiment

extra("huggingface_hub", "huggingface")

REPO_ID = "someone/cartpole_agent"


def front_matter(readme: str) -> dict:
    assert readme.startswith("---\n")
    return yaml.safe_load(readme.split("---\n")[1])


def write_learning_curve(path: str) -> None:
    from torch.utils.tensorboard import SummaryWriter

    with SummaryWriter(os.path.join(path, "tb")) as writer:
        for i, value in enumerate((20.0, 80.0, 200.0, 450.0)):
            writer.add_scalar("episode/return", value, (i + 1) * 10_000)
            writer.add_scalar("perf/training_hours", (i + 1) / 3600, (i + 1) * 10_000)


def hub_cache(cache: str, repo_id: str, files_from: str) -> str:
    """A huggingface_hub cache holding one snapshot of `repo_id`: refs/main names the commit,
    snapshots/<commit>/ links every file to blobs/<sha256>."""
    commit = hashlib.sha1(repo_id.encode()).hexdigest()
    repo = os.path.join(cache, "models--" + repo_id.replace("/", "--"))
    os.makedirs(os.path.join(repo, "refs"))
    with open(os.path.join(repo, "refs", "main"), "w") as f:
        f.write(commit)
    for root, _, names in os.walk(files_from):
        for name in names:
            source = os.path.join(root, name)
            with open(source, "rb") as f:
                blob = os.path.join(repo, "blobs", hashlib.sha256(f.read()).hexdigest())
            os.makedirs(os.path.dirname(blob), exist_ok=True)
            shutil.copyfile(source, blob)
            link = os.path.join(repo, "snapshots", commit, os.path.relpath(source, files_from))
            os.makedirs(os.path.dirname(link), exist_ok=True)
            os.symlink(os.path.relpath(blob, os.path.dirname(link)), link)
    return commit


def run_ok(args: list[str], module: str) -> str:
    result = launch.run(args, timeout=180, module=module)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return result.stdout + result.stderr


@pytest.mark.slow
def test_push_stages_the_repository_and_load_from_a_hub_snapshot_plays(tmp_path, monkeypatch):
    runs, staged = str(tmp_path / "runs"), str(tmp_path / "staged")
    path, _, _, _ = random_policy_experiment(runs, "cartpole_agent", "CartPole-v1", encoder_mlp_layers=[32])
    write_learning_curve(path)
    enjoy = ["--experiment=cartpole_agent", "--max_num_episodes=3", "--eval_deterministic=True"]
    run_ok([f"--train_dir={runs}", *enjoy, "--save_video=True", "--video_frames=40"], "sf_core.enjoy")
    with open(os.path.join(path, "eval_results.json")) as f:
        results = json.load(f)

    run_ok([f"--train_dir={runs}", "--experiment=cartpole_agent", f"--hf_repository={REPO_ID}", "--dry_run=True",
            f"--staging_dir={staged}"], "sf_core.huggingface.push_to_hub")
    ckpt = os.path.basename(checkpoint.latest_checkpoint(checkpoint.checkpoint_dir(path)))
    found = sorted(os.path.relpath(os.path.join(r, n), staged) for r, _, names in os.walk(staged) for n in names)
    assert found == sorted(["README.md", "config.json", "eval_results.json", "replay.mp4", "learning_curve.png",
                            f"checkpoint/{ckpt}"])
    with open(os.path.join(staged, "learning_curve.png"), "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert os.path.getsize(os.path.join(staged, "replay.mp4")) > 1000
    with open(os.path.join(staged, "README.md")) as f:
        readme = f.read()
    meta = front_matter(readme)
    assert meta["library_name"] == "sf_core" and "CartPole-v1" in meta["tags"]
    result = meta["model-index"][0]["results"][0]
    assert result["dataset"]["name"] == "CartPole-v1"
    assert result["metrics"][0] == {"type": "mean_reward", "name": "mean_reward", "verified": False,
                                    "value": f"{results['mean_return']:.2f} +/- {results['std_return']:.2f}"}
    assert "python -m sf_core.train --env=CartPole-v1" in readme and f"--hf_repository={REPO_ID}" in readme

    hub_cache(str(tmp_path / "hf_cache"), REPO_ID, staged)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf_cache"))
    downloaded = str(tmp_path / "downloaded")
    run_ok([f"--hf_repository={REPO_ID}", f"--train_dir={downloaded}"], "sf_core.huggingface.load_from_hub")
    loaded = os.path.join(downloaded, "cartpole_agent")
    assert not os.path.islink(os.path.join(loaded, "checkpoint", ckpt))
    run_ok([f"--train_dir={downloaded}", *enjoy], "sf_core.enjoy")
    with open(os.path.join(loaded, "eval_results.json")) as f:
        replayed = json.load(f)
    assert replayed["returns"] == results["returns"] and replayed["checkpoint"].endswith(ckpt)


@pytest.mark.slow
def test_load_from_hub_offline_without_a_cached_snapshot_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty_cache"))
    result = launch.run(["--hf_repository=nobody/nothing", f"--train_dir={tmp_path}"], timeout=60,
                        module="sf_core.huggingface.load_from_hub")
    assert result.returncode == 1 and "error" in result.stderr and not os.path.exists(tmp_path / "nothing")


class RecordingApi:
    def __init__(self):
        self.calls = []

    def create_repo(self, **kwargs):
        self.calls.append(("create_repo", kwargs))
        return f"https://huggingface.co/{kwargs['repo_id']}"

    def upload_folder(self, **kwargs):
        self.calls.append(("upload_folder", kwargs))


def test_upload_creates_the_repository_then_uploads_the_staged_folder(tmp_path):
    api = RecordingApi()
    url = upload(str(tmp_path), REPO_ID, private=True, api=api)
    assert url.endswith(REPO_ID)
    (first, created), (second, uploaded) = api.calls
    assert first == "create_repo" and created["private"] and created["exist_ok"]
    assert second == "upload_folder" and uploaded["folder_path"] == str(tmp_path) and uploaded["repo_id"] == REPO_ID


def test_the_model_card_command_trains_the_same_agent():
    cfg, _ = parse_args(["--env=Pendulum-v1", "--use_rnn=True", "--encoder_mlp_layers", "32", "16",
                         "--learning_rate=0.0003", "--seed=5", "--num_workers=1"])
    command = shlex.split(train_command(cfg))
    assert command[:3] == ["python", "-m", "sf_core.train"]
    again, _ = parse_args(command[3:])
    differ = [k for k, v in vars(cfg).items() if getattr(again, k) != v and k not in UNREPRODUCED]
    assert not differ


@pytest.mark.slow
def test_an_experiment_without_evaluation_is_refused_with_the_command_to_run(tmp_path):
    random_policy_experiment(tmp_path, "raw", "CartPole-v1", steps=50, encoder_mlp_layers=[8])
    result = launch.run([f"--train_dir={tmp_path}", "--experiment=raw", f"--hf_repository={REPO_ID}",
                         "--dry_run=True"], timeout=60, module="sf_core.huggingface.push_to_hub")
    assert result.returncode == 2 and "python -m sf_core.enjoy" in result.stderr
    assert load_config(os.path.join(str(tmp_path), "raw")).env == "CartPole-v1"
