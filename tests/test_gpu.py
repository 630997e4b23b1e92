"""The CUDA path, where a GPU is: `python -m pytest -m gpu tests` (the README's test command runs them too).

Without CUDA every test here is skipped with that reason; CI's machines have none. Each training runs as its
own process (`python -m sf_core.train`), so this interpreter never holds a CUDA context that a later test's
forked workers would inherit, and what a run leaves on the GPU is attributable to its processes.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time

import numpy as np
import psutil
import pytest
import torch

from tests import launch
from tests.conftest import multiprocessing_helper
from tests.helpers import read_summary
from tests.test_recurrent import MEMORY

pytestmark = [
    pytest.mark.gpu, pytest.mark.slow,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here (torch.cuda.is_available() "
                       "is False): the GPU tests run on a machine with one"),
]

SOLVED = 475.0
CARTPOLE = ["--env=CartPole-v1", "--device=cuda", f"--target_mean_return={SOLVED}", "--train_for_seconds=150",
            "--train_for_env_steps=10000000"]


def train_on_gpu(tmp_path, *flags: str, timeout: float = 200) -> dict:
    proc = launch.run([f"--train_dir={tmp_path}", "--experiment=exp", *flags], timeout=timeout)
    summary = read_summary(tmp_path)
    assert proc.returncode == 0, (summary.get("error"), proc.stderr[-3000:])
    assert "CUDA is not available" not in proc.stderr  # it really ran on the GPU
    return summary


def assert_solved(summary: dict) -> None:
    assert summary["time_to_target"] is not None, summary
    assert summary["mean_return_at_target"] >= SOLVED


@pytest.mark.timeout(240)
def test_cartpole_solved_serial_on_the_gpu_then_played_on_a_cpu_only_machine(tmp_path):
    assert_solved(train_on_gpu(tmp_path, *CARTPOLE, "--serial_mode=True", "--seed=1"))
    with open(tmp_path / "exp" / "config.json") as f:
        assert json.load(f)["device"] == "cuda"
    # the checkpoint holds CUDA tensors; a process that cannot see a GPU must still load and play it
    code = ("import os, sys; os.environ['CUDA_VISIBLE_DEVICES'] = ''; import sf_core.enjoy; "
            "sys.exit(sf_core.enjoy.main(sys.argv[1:]))")
    proc = launch.run([f"--train_dir={tmp_path}", "--experiment=exp", "--device=cpu", "--max_num_episodes=3",
                       "--eval_deterministic=True"], timeout=120, code=code)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(tmp_path / "exp" / "eval_results.json") as f:
        assert json.load(f)["mean_return"] >= SOLVED


@pytest.mark.timeout(60)
def test_a_gpu_this_machine_lacks_is_one_clear_error(tmp_path):
    count = torch.cuda.device_count()
    proc = launch.run(["--env=CartPole-v1", f"--train_dir={tmp_path}", "--experiment=exp", f"--device=cuda:{count}"],
                      timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert f"this machine has {count} CUDA device(s)" in proc.stderr, proc.stderr[-3000:]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("flags", [(), ("--mixed_precision=True",)], ids=["float32", "bf16"])
def test_cartpole_solved_async_with_two_inference_workers_sharing_the_gpu(tmp_path, flags):
    summary = train_on_gpu(tmp_path, *CARTPOLE, "--num_workers=2", "--policy_workers_per_policy=2", "--seed=2",
                           *flags)
    assert_solved(summary)
    versions = summary["inference_versions"]  # the learner's weights reached both, throughout
    assert sorted(versions) == ["inference_worker_0", "inference_worker_1"], versions
    assert all(v > summary["policy_version"] // 2 > 0 for v in versions.values()), versions


@pytest.mark.timeout(240)
def test_a_recurrent_policy_learns_its_memory_task_on_the_gpu(tmp_path):
    summary = train_on_gpu(tmp_path, *MEMORY, "--num_workers=2", "--use_rnn=True", "--device=cuda")
    assert summary["time_to_target"] is not None, summary
    assert summary["mean_return_at_target"] >= 0.9, summary


@pytest.mark.timeout(180)
def test_a_short_atari_run_trains_on_the_gpu(tmp_path):
    pytest.importorskip("ale_py", reason="Atari needs the atari extra")
    summary = train_on_gpu(tmp_path, "--env=atari_breakout", "--device=cuda", "--num_workers=2",
                           "--num_envs_per_worker=8", "--train_for_env_steps=40000", "--seed=1")
    assert summary["frames"] >= 40000 and summary["policy_version"] >= 5, summary
    assert np.isfinite(summary["final_learner_stats"]["loss"]), summary["final_learner_stats"]


def gpu_pids() -> set[int]:
    """Processes holding memory on any GPU, as the driver sees them."""
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"], capture_output=True,
                         text=True, timeout=30).stdout
    return {int(line) for line in out.split() if line.strip().isdigit()}


def start_and_wait_for_training(tmp_path) -> tuple[subprocess.Popen, list[psutil.Process]]:
    proc = launch.start(["--env=CartPole-v1", "--device=cuda", "--num_workers=2", f"--train_dir={tmp_path}",
                         "--experiment=exp", "--train_for_seconds=120"])
    deadline = time.time() + 60
    while time.time() < deadline:
        if read_summary(tmp_path).get("policy_version", 0) >= 3:  # learning, so every process holds its GPU memory
            return proc, psutil.Process(proc.pid).children(recursive=True)
        time.sleep(0.5)
    proc.kill()
    raise AssertionError(f"no training within 60 s: {proc.communicate(timeout=10)[0][-3000:]}")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("stop", ["ctrl_c", "killed_worker"])
def test_a_stopped_run_leaves_no_process_and_no_gpu_memory(tmp_path, stop):
    if shutil.which("nvidia-smi") is None:
        pytest.skip("nvidia-smi is not on the PATH: cannot ask the driver which processes hold GPU memory")
    proc, children = start_and_wait_for_training(tmp_path)
    ours = {proc.pid} | {c.pid for c in children}
    try:
        assert gpu_pids() & ours, "the run holds no GPU memory: did it run on the GPU?"
        if stop == "ctrl_c":
            proc.send_signal(signal.SIGINT)
        else:
            next(c for c in children if not multiprocessing_helper(c)).kill()  # a component, not the forkserver
        output, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == (130 if stop == "ctrl_c" else 1), output[-3000:]
    _, alive = psutil.wait_procs(children, timeout=10)
    assert not alive, f"processes outlived the trainer: {alive}"
    deadline = time.time() + 10  # the driver frees a dead process's memory shortly after it exits
    while gpu_pids() & ours and time.time() < deadline:
        time.sleep(0.5)
    assert not gpu_pids() & ours, "GPU memory still held by the run's processes"
    if stop == "ctrl_c":
        assert read_summary(tmp_path)["last_checkpoint"], "Ctrl-C saves a checkpoint"


@pytest.mark.parametrize("use_rnn", [False, True], ids=["feed_forward", "gru"])
def test_inference_through_pinned_staging_on_the_gpu_writes_what_the_cpu_writes(use_rnn):
    from tests.test_device_io import act_once

    cpu, gpu = act_once(use_rnn), act_once(use_rnn, device="cuda")
    assert gpu["log_prob"].abs().sum() > 0
    for key in ("behaviour_values", "rnn_states", "rnn_latest", "policy_version"):  # actions: another RNG
        torch.testing.assert_close(gpu[key], cpu[key], rtol=1e-4, atol=1e-5, msg=key)


def test_the_learners_ceiling_is_measured_on_the_gpu():
    """scripts/bench_sgd_step.py --device=cuda: the Pong preset's SGD step and forward pass on the GPU (the
    learner's ceiling that scripts/gpu_machine.sh reports)."""
    proc = launch.run(["--env=atari_pong", "--device=cuda"], timeout=180, script="scripts/bench_sgd_step.py")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "samples/s per epoch on cuda" in proc.stdout, proc.stdout
    assert "the finite check on the device" in proc.stdout, proc.stdout


def test_a_datasets_sgd_steps_on_the_gpu_queue_without_a_host_sync():
    """The finite check stays on the device (algo/non_finite.py): between a dataset's SGD steps the host never
    waits for the GPU (torch's sync debug mode raises at any wait), and a NaN still stops the dataset, named."""
    from sf_core.algo.adam import FusedAdam
    from sf_core.algo.graph import Context, ModelSlot
    from sf_core.algo.nodes import _ppo_policy_loss, _sgd_step, step_guard
    from tests.test_non_finite import minibatches
    from tests.test_sgd_step import step_context

    ctx, model, _ = step_context()
    model.cuda()
    ctx = Context({"actor_critic": ModelSlot(model, FusedAdam(list(model.parameters())), "cuda")}, ctx.params)
    guard = step_guard(ctx, ctx.models["actor_critic"])
    assert guard.on_device  # where no flag names it: a CUDA model with the fused Adam
    batches = [{key: value.cuda() for key, value in mb.items()} for mb in minibatches(poisoned_step=2)]
    _sgd_step(ctx, dict(batches[0]), _ppo_policy_loss, guard)  # the first step: allocations, kernel choice
    torch.cuda.set_sync_debug_mode("error")
    try:
        for mb in batches[1:]:
            _sgd_step(ctx, dict(mb), _ppo_policy_loss, guard)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    with pytest.raises(FloatingPointError, match="value loss nan"):
        guard.finish()


def test_on_a_gpu_the_critic_trains_after_the_release_on_the_learner_s_own_copies():
    """--split_actor_critic with --recompute_values on a GPU: the batch the critic reads after the dataset is handed
    back is the learner's copy on the device, used as it is, and zeroing the host's dataset changes nothing."""
    from sf_core.algo.model import ModelSpec
    from sf_core.algo.registry import algorithm_builder
    from sf_core.learning.learner import Trainer
    from tests.test_split_actor_critic import ACTIONS, OBS, dataset, everything, small_config, trained

    cfg = small_config(recompute_values=True, device="gpu")
    trainer = Trainer(cfg, OBS, ACTIONS, ModelSpec.from_config(cfg), "cuda", 3, algorithm_builder(cfg.algo))
    trainer.build(None, None)
    host = dataset(0)
    batch = {key: t.cuda() for key, t in host.items()}
    data = dict(batch)
    trainer.executor._copy_batch_for_late_nodes(batch, data)
    assert all(data[key] is batch[key] for key in batch)  # the device copies are the learner's: no clone
    reference = trained(cfg, datasets=1, device="cuda")  # handed back at the end

    def release(held: dict) -> None:
        for value in host.values():
            value.zero_()

    torch.manual_seed(11)
    trainer.train(host, 1e-3, 0, release=release)
    for got, expected in zip(everything(trainer), everything(reference)):  # not trained on zeroed memory
        assert torch.allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_overlapped_graph_nodes_on_cuda_streams_give_the_sequential_results(tmp_path):
    """scripts/bench_graph_overlap.py --device=cuda: two independent inference nodes, each on its own stream."""
    out = tmp_path / "overlap.json"
    proc = launch.run(["--device=cuda", "--repeats=5", f"--output={out}"], timeout=120,
                      script="scripts/bench_graph_overlap.py")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert json.loads(out.read_text())["bit_identical"]


def test_an_offloaded_models_copy_overlaps_the_node_before_it(tmp_path):
    """scripts/bench_offload.py: a 512 MiB frozen model copied from pinned memory while the node before it computes;
    most of the copy must hide behind that compute, and the outputs equal those of a model that stays put."""
    out = tmp_path / "offload.json"
    proc = launch.run(["--device=cuda", "--repeats=5", f"--output={out}"], timeout=180,
                      script="scripts/bench_offload.py")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["same_outputs"], result
    assert result["compute_ms"] > result["copy_ms"], f"the compute must be able to hide the copy: {result}"
    assert result["copy_hidden_share"] >= 0.5, result


def test_a_one_rank_nccl_group_trains_as_the_learner_alone(tmp_path):
    """NCCL's collectives (broadcast, all-reduce, all-gather) over a group of one rank on the GPU: the learner
    in that group ends where the learner alone on the GPU ends. Spawned, so CUDA starts in that process only."""
    from tests.test_learner_group import assert_a_group_of_one_trains_as_the_learner_alone, group_of_one_ends

    ends = group_of_one_ends(tmp_path, "cuda:0", "spawn", timeout=120)
    assert ends["backend"] == "nccl"
    assert_a_group_of_one_trains_as_the_learner_alone(ends)


@pytest.mark.parametrize("mixed_precision", [False, True], ids=["float32", "bf16"])
def test_cuda_graphs_replay_the_eager_pass_at_every_batch_size_and_follow_new_weights(mixed_precision):
    """--cuda_graphs: the inference worker's forward pass and sampling, replayed per batch-size bucket, give the
    eager pass's distribution parameters, values and log-probs; weights and statistics loaded in place are seen."""
    import gymnasium as gym

    from sf_core.algo.model import ActorCritic, ModelSpec, autocast, store_weights_in_bfloat16
    from sf_core.config import Config
    from sf_core.sampling.graphed_acting import GraphedActing

    obs_space, action_space = gym.spaces.Box(-1, 1, (5,), np.float32), gym.spaces.Discrete(4)
    spec = ModelSpec.from_config(Config(env="x"))

    def make_model(seed: int) -> ActorCritic:
        torch.manual_seed(seed)
        model = ActorCritic(obs_space, action_space, spec).cuda().eval()
        if mixed_precision:
            store_weights_in_bfloat16(model)
        return model

    model = make_model(1)

    @torch.no_grad()
    def act(obs: torch.Tensor, graphed: bool = True) -> dict[str, torch.Tensor]:
        with autocast("cuda", mixed_precision, cache=not graphed):
            params, values = model(obs)
        dist = model.distribution(params.float())
        actions = dist.sample()
        return {"actions": actions, "log_prob": dist.log_prob(actions), "params": params.float(),
                "values": model.denormalize_value(values.float())}

    def check(outputs: dict[str, torch.Tensor], obs: torch.Tensor) -> None:
        eager = act(obs, graphed=False)
        tolerance = {"rtol": 2e-2, "atol": 2e-2} if mixed_precision else {"rtol": 1e-5, "atol": 1e-5}
        for key in ("params", "values"):
            torch.testing.assert_close(outputs[key], eager[key], **tolerance, msg=key)
        log_prob = model.distribution(outputs["params"]).log_prob(outputs["actions"])
        torch.testing.assert_close(outputs["log_prob"], log_prob, rtol=1e-5, atol=1e-5)

    graphed = GraphedActing(act, model, "cuda", min_rows=4)
    for rows in (3, 4, 7, 20, 4):
        obs = torch.randn(rows, 5, device="cuda")
        outputs = graphed(obs)
        assert outputs["actions"].shape == (rows,)
        check({k: v.clone() for k, v in outputs.items()}, obs)
    assert sorted(graphed.graphs) == [4, 8, 32]

    other = make_model(2)  # new weights and return statistics, loaded in place as SharedWeights.load_into does
    other.returns_norm.mean.fill_(3.0)
    other.returns_norm.var.fill_(4.0)
    model.load_state_dict(other.state_dict())
    obs = torch.randn(7, 5, device="cuda")
    check({k: v.clone() for k, v in graphed(obs).items()}, obs)
    assert graphed(obs)["values"].abs().mean() > 1.0  # the new statistics denormalize the values

    obs = torch.zeros(32, 5, device="cuda")  # fresh random draws on every replay, as eagerly
    draws = torch.stack([graphed(obs)["actions"].clone() for _ in range(4)])
    assert len({tuple(d.tolist()) for d in draws}) == 4


def test_sgd_steps_replayed_as_cuda_graphs_train_as_eager_steps():
    """--sgd_cuda_graphs (algo/graphed_sgd.py) with real CUDA graphs: across datasets, learning rates, a shorter
    last minibatch, a non-finite step and fresh Adam moments, the weights, Adam's state and every step's
    statistics are those of eager steps on the GPU."""
    from tests.test_graphed_sgd import dataset, train

    def between(ctx, k: int) -> None:
        if k == 3:
            ctx.models["actor_critic"].optimizer.state.clear()

    datasets = [(1e-2, dataset(1)), (5e-3, dataset(2, poisoned=3)), (5e-3, dataset(3)), (2e-3, dataset(4))]
    eager = train(datasets, False, between, device="cuda")
    graphed = train(datasets, True, between, device="cuda")
    assert eager[3] == graphed[3] and "value loss nan" in graphed[3][1]
    assert graphed[4].recorded is not None
    for a, b in zip(eager[0].parameters(), graphed[0].parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    for a, b in zip(eager[2], graphed[2]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, equal_nan=True)


@pytest.mark.parametrize("split", [False, True], ids=["actor_critic", "split_actor_critic"])
def test_a_trainers_updates_replayed_as_cuda_graphs_train_as_eager_ones(monkeypatch, split):
    """Through the Trainer on the GPU, the joint or the split updates as real CUDA graphs, against eager steps
    with the rate in a tensor too (never recorded)."""
    from tests.test_graphed_sgd import trained_with, trainer_state
    from tests.test_split_actor_critic import small_config

    cfg = small_config(split_actor_critic=split, sgd_cuda_graphs=True)
    eager = trained_with(monkeypatch, cfg, {}, device="cuda", warmup_steps=10**9)
    made: dict = {}
    graphed = trained_with(monkeypatch, cfg, made, device="cuda")
    assert len(made) == (2 if split else 1) and all(g.recorded and not g.failed for g in made.values())
    for a, b in zip(trainer_state(eager), trainer_state(graphed), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.timeout(240)
def test_cartpole_solved_with_the_sgd_step_replayed_as_a_cuda_graph(tmp_path):
    proc = launch.run([f"--train_dir={tmp_path}", "--experiment=exp", *CARTPOLE, "--num_workers=2", "--seed=2",
                       "--sgd_cuda_graphs=True"], timeout=200)
    summary = read_summary(tmp_path)
    assert proc.returncode == 0, (summary.get("error"), proc.stderr[-3000:])
    assert "recorded as a CUDA graph" in proc.stderr, proc.stderr[-3000:]
    assert_solved(summary)

