"""--num_learners: a learner group trains as one learner with the whole batch would, every rank holding the
same weights; end to end it solves CartPole and leaves no process behind; bad flag combinations stop early."""

from __future__ import annotations

import dataclasses
import multiprocessing
import re

import gymnasium as gym
import psutil
import pytest
import torch

from sf_core.algo.model import ActorCritic, ModelSpec
from sf_core.algo.registry import algorithm_builder
from sf_core.cli.arguments import parse_args
from sf_core.config import Config, ConfigError
from sf_core.contracts.buffers import NoLock, SharedWeights
from sf_core.contracts.sample import SampleSpaces, batch_tensors
from sf_core.learning.dataset_shares import ShareLayout, share_of
from sf_core.learning.group.link import STOP, TRAIN, Command, GroupSpec, plan
from sf_core.learning.group.network import ADDRESS, free_port
from sf_core.learning.learner import Trainer
from tests import launch
from tests.helpers import kill_9_once, read_summary, run_to_the_end, wait_for

OBS, ACTIONS = gym.spaces.Box(-5.0, 5.0, (4,), dtype=float), gym.spaces.Discrete(2)
ROLLOUT, TRAJECTORIES, DATASETS, SEED = 8, 8, 3, 7
LEARNING_RATE = 1e-3
TOLERANCE = 1e-5


def small_config(**flags) -> Config:
    # a minibatch of 32 samples is 4 whole time rows of the 8 trajectories, and a rank's 16 the same rows of
    # its 4: without shuffling, the ranks' minibatch k together is the single learner's minibatch k
    return Config(env="CartPole-v1", rollout=ROLLOUT, batch_size=32, num_batches_per_epoch=2, num_epochs=2,
                  encoder_mlp_layers=[16, 16], normalize_advantage=False, shuffle_minibatches=False,
                  learning_rate=LEARNING_RATE, **flags)


def datasets(cfg: Config, rnn_state_size: int) -> list[dict[str, torch.Tensor]]:
    """Valid CartPole-shaped datasets with random contents, each taken by policy version 0 (no lag)."""
    g = torch.Generator().manual_seed(SEED)
    found = []
    for _ in range(DATASETS):
        d = batch_tensors(SampleSpaces(OBS, ACTIONS, rnn_state_size), ROLLOUT, TRAJECTORIES)
        d["obs"].copy_(torch.randn(d["obs"].shape, generator=g) * 2 + 1)
        d["actions"].copy_(torch.randint(2, d["actions"].shape, generator=g))
        d["log_prob"].copy_(-torch.rand(d["log_prob"].shape, generator=g) - 0.2)
        d["behaviour_values"].copy_(torch.randn(d["behaviour_values"].shape, generator=g))
        d["rewards"].copy_(torch.rand(d["rewards"].shape, generator=g))
        d["dones"].copy_(torch.rand(d["dones"].shape, generator=g) < 0.1)
        d["rnn_states"].copy_(torch.randn(d["rnn_states"].shape, generator=g) * 0.1)
        found.append(d)
    return found


def trainer(cfg: Config) -> Trainer:
    spec = ModelSpec.from_config(cfg)
    return Trainer(cfg, OBS, ACTIONS, spec, "cpu", SEED, algorithm_builder(cfg.algo))


def initial_weights(cfg: Config) -> SharedWeights:
    torch.manual_seed(SEED + 1)  # other weights than the trainers' own initialisation: load_into must count
    return SharedWeights(ActorCritic(OBS, ACTIONS, ModelSpec.from_config(cfg)), NoLock())


def run_rank(rank: int, spec: GroupSpec, cfg: Config, data: list, weights: SharedWeights, out: str) -> None:
    """One rank, through the code the learner and its followers train with: rank 0 names each dataset with
    a command, as the learner does; the others train on what the command names, as `follow` does. A rank
    "elsewhere" (spec.share_layout set) sees neither the datasets nor the shared weights: rank 0 sends it its
    share of each dataset, and its start."""
    torch.set_num_threads(1)
    link = spec.join(rank)
    t = trainer(cfg)
    elsewhere = rank > 0 and spec.share_layout is not None
    t.build(None if elsewhere else weights, None, link=link)
    stats = []
    for index in range(len(data)):
        if rank == 0:
            command = Command(TRAIN, index, LEARNING_RATE, 0)
            link.send_train(command.index, command.learning_rate, command.version)
        else:
            command = link.receive()
        stats.append(t.train(None if elsewhere else data[command.index], command.learning_rate, command.version))
    torch.save({"state": t.models["actor_critic"].module.state_dict(), "stats": stats}, out)
    if rank > 0:
        assert link.receive().kind == STOP
    link.close()  # rank 0: sends that stop


def train_as_group(tmp_path, cfg: Config, data: list, weights: SharedWeights, size: int = 2,
                   sent: bool = False) -> list[dict]:
    layout = ShareLayout.of(share_of(data[0], 1, size)) if sent else None
    spec = GroupSpec(size, free_port(), timeout=60.0, devices=("cpu",) * size, address=ADDRESS, share_layout=layout)
    return fork_ranks(tmp_path, size, run_rank, (spec, cfg, data, weights))


def fork_ranks(tmp_path, size: int, target, args: tuple) -> list[dict]:
    """`target(rank, *args, out)` in `size` forked processes; what each saved to its `out`."""
    ctx = multiprocessing.get_context("fork")
    outs = [str(tmp_path / f"rank_{r}.pt") for r in range(size)]
    procs = [ctx.Process(target=target, args=(r, *args, outs[r]), daemon=True) for r in range(size)]
    for p in procs:
        p.start()
    try:
        for p in procs:
            p.join(timeout=120)
        assert [p.exitcode for p in procs] == [0] * size
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(5)
    return [torch.load(out, weights_only=True) for out in outs]


def run_poisoned_rank(rank: int, spec: GroupSpec, cfg: Config, data: list, weights: SharedWeights, out: str) -> None:
    """One rank trains on dataset 0 (as `run_rank` does) and records what it raised, and whether its trainable
    weights are the ones it started from."""
    torch.set_num_threads(1)
    link = spec.join(rank)
    t = trainer(cfg)
    t.build(weights, None, link=link)
    model = t.models["actor_critic"].module
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    if rank == 0:
        link.send_train(0, LEARNING_RATE, 0)
    else:
        link.receive()
    try:
        t.train(data[0], LEARNING_RATE, 0)
        result = {"message": "trained"}
    except FloatingPointError as exc:
        result = {"message": str(exc)}
    result["unchanged"] = all(torch.equal(before[name], p) for name, p in model.named_parameters())
    torch.save(result, out)


def test_a_nan_in_one_ranks_share_stops_every_rank_at_the_same_step_with_the_weights_unchanged(tmp_path):
    """The non-finite check reads the gradient norm after the ranks have averaged their gradients: every rank
    sees the poisoned rank's NaN, and none takes the optimizer step."""
    # no return normalizer: its statistics, shared by the ranks, would carry the NaN to every rank's loss
    cfg = small_config(num_learners=2, normalize_returns=False)
    data = datasets(cfg, 0)
    data[0]["rewards"][:, -1] = float("nan")  # the last trajectory: in rank 1's share only
    weights = initial_weights(cfg)
    spec = GroupSpec(2, free_port(), timeout=30.0, devices=("cpu", "cpu"), address=ADDRESS)
    outs = [str(tmp_path / f"rank_{r}.pt") for r in range(2)]
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=run_poisoned_rank, args=(r, spec, cfg, data, weights, outs[r]), daemon=True)
             for r in range(2)]
    for p in procs:
        p.start()
    try:
        for p in procs:
            p.join(timeout=60)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(5)
    results = [torch.load(out, weights_only=True) for out in outs]
    for rank, result in enumerate(results):
        assert "non-finite loss or gradients" in result["message"] and result["unchanged"], (rank, result)


@pytest.mark.parametrize("recurrent, sent", [(False, False), (True, False), (False, True), (True, True)],
                         ids=["feed_forward", "gru", "feed_forward_sent", "gru_sent"])
def test_two_ranks_train_as_one_learner_with_the_whole_batch(tmp_path, recurrent, sent):
    """`sent`: rank 1 stands for a rank on another node (a Ray actor): its shares of the datasets and its start
    come from rank 0 as messages, not from shared memory."""
    rnn = {"use_rnn": True, "rnn_size": 8, "recurrence": 4} if recurrent else {}
    cfg = small_config(**rnn)
    rnn_state_size = ActorCritic(OBS, ACTIONS, ModelSpec.from_config(cfg)).rnn_state_size
    data = datasets(cfg, rnn_state_size)
    weights = initial_weights(cfg)

    # one learner on the whole datasets with the whole minibatch (first: the ranks, forked after it, find
    # what its first SGD step imported already imported)
    single = trainer(cfg)
    single.build(weights, None)
    single_stats = [single.train(d, LEARNING_RATE, 0) for d in data]
    reference = single.models["actor_critic"].module.state_dict()
    start = {name: t.double() for name, t in weights.tensors.items()}
    assert max((reference[n].double() - start[n]).abs().max().item() for n in start) > 100 * TOLERANCE  # it trained

    ranks = train_as_group(tmp_path, dataclasses.replace(cfg, num_learners=2), data, weights, sent=sent)

    # every rank holds the same weights, normalizers included, bit for bit
    assert ranks[0]["state"].keys() == ranks[1]["state"].keys() == reference.keys()
    for name, tensor in ranks[0]["state"].items():
        assert torch.equal(tensor, ranks[1]["state"][name]), name
    # and they are the one learner's
    difference = max((reference[name].double() - tensor.double()).abs().max().item()
                     for name, tensor in ranks[0]["state"].items())
    assert difference < TOLERANCE
    # the learner reports the group's statistics: the losses the one learner reports
    for group, one in zip(ranks[0]["stats"], single_stats):
        assert group.keys() == one.keys()
        for key in ("loss", "policy_loss", "value_loss", "entropy", "kl", "clip_fraction", "grad_norm", "value_mean",
                    "target_mean"):
            assert group[key] == pytest.approx(one[key], rel=1e-5, abs=1e-6), key


def train_in_a_group_of_one(device: str, out: str) -> None:
    """The learner alone on `device`, then rank 0 of a group of one rank there (gloo on the CPU, NCCL on a GPU),
    each from the same weights over the same datasets; saves both ends and the group's backend to `out`. Run in
    a process of its own: the group's process group, and on a GPU its CUDA context, stay there."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    cfg = small_config()
    data, weights = datasets(cfg, 0), initial_weights(cfg)
    ends = {}
    for grouped in (False, True):
        t = Trainer(cfg, OBS, ACTIONS, ModelSpec.from_config(cfg), device, SEED, algorithm_builder(cfg.algo))
        link = GroupSpec(1, free_port(), timeout=60.0, devices=(device,), address=ADDRESS).join(0) if grouped \
            else None
        t.build(weights, None, link=link)
        stats = []
        for index, dataset in enumerate(data):
            if link is not None:
                link.send_train(index, LEARNING_RATE, 0)
            stats.append(t.train(dataset, LEARNING_RATE, 0))
        state = {name: tensor.cpu() for name, tensor in t.models["actor_critic"].module.state_dict().items()}
        ends["group" if grouped else "alone"] = {"state": state, "stats": stats}
        if link is not None:
            ends["backend"] = str(dist.get_backend())
            link.close()
    torch.save(ends, out)


def assert_a_group_of_one_trains_as_the_learner_alone(ends: dict) -> None:
    alone, group = ends["alone"], ends["group"]
    assert group["state"].keys() == alone["state"].keys()
    for name, tensor in group["state"].items():
        assert (tensor.double() - alone["state"][name].double()).abs().max().item() < TOLERANCE, name
    for grouped, one in zip(group["stats"], alone["stats"]):
        assert grouped["loss"] == pytest.approx(one["loss"], rel=1e-5, abs=1e-6)


def group_of_one_ends(tmp_path, device: str, start_method: str, timeout: float) -> dict:
    """What `train_in_a_group_of_one` saved, run in a process of `start_method`."""
    out = str(tmp_path / "ends.pt")
    proc = multiprocessing.get_context(start_method).Process(target=train_in_a_group_of_one, args=(device, out))
    proc.start()
    proc.join(timeout=timeout)
    if proc.is_alive():
        proc.kill()
        proc.join(5)
    assert proc.exitcode == 0
    return torch.load(out, weights_only=True)


def test_a_group_of_one_rank_trains_as_the_learner_alone(tmp_path):
    """Every collective of a group (the start's broadcast, the commands, the gradients' all-reduce, the
    statistics' all-gather, the weights compared at close) over one rank: nothing changes what it learns.
    tests/test_gpu.py runs the same over NCCL."""
    ends = group_of_one_ends(tmp_path, "cpu", "fork", timeout=60)
    assert ends["backend"] == "gloo"
    assert_a_group_of_one_trains_as_the_learner_alone(ends)


def test_a_packed_share_unpacks_to_the_same_fields_of_every_dtype():
    share = share_of(datasets(small_config(use_rnn=True, rnn_size=8), 16)[1], 1, 2)
    share["empty"] = torch.zeros((ROLLOUT, TRAJECTORIES // 2, 0))
    layout = ShareLayout.of(share)
    buffer = torch.full((layout.nbytes,), 255, dtype=torch.uint8)
    layout.pack(share, buffer)
    unpacked = layout.unpack(buffer)
    assert unpacked.keys() == share.keys()
    assert {share[k].dtype for k in share} >= {torch.float32, torch.bool, torch.int64}  # the schema's mix
    for key, tensor in share.items():
        assert unpacked[key].dtype == tensor.dtype and torch.equal(unpacked[key], tensor), key
        assert unpacked[key].untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr()  # views, no copy


# ------------------------------------------------------------------------------------------ end to end

@pytest.mark.slow
@pytest.mark.timeout(240)
def test_cartpole_solved_by_two_learner_ranks_and_no_process_outlives_the_run(tmp_path):
    proc, output, descendants, alive = run_to_the_end(tmp_path, [
        "--env=CartPole-v1", "--num_learners=2", "--num_workers=2", "--seed=2", "--target_mean_return=475",
        "--train_for_seconds=180", "--train_for_env_steps=10000000"], 220)
    assert proc.returncode == 0, output[-3000:]
    assert "learner group: 2 ranks joined (gloo" in output
    summary = read_summary(tmp_path)
    assert summary["time_to_target"] is not None, summary
    assert summary["mean_return_at_target"] >= 475.0
    assert summary["samples_trained"] > 0 and "loss" in summary["final_learner_stats"]
    assert len(descendants) >= 5, descendants  # two rollout workers, inference, the learner and rank 1
    assert not alive, [p.pid for p in alive]


def _rank_1(trainer: psutil.Process, port: int) -> psutil.Process:
    """The trainer's child connected to rank 0's rendezvous port without listening on it (rank 0 does)."""
    for child in trainer.children():
        connections = child.net_connections(kind="tcp")
        if (any(c.raddr and c.raddr.port == port for c in connections)
                and not any(c.laddr.port == port and c.status == psutil.CONN_LISTEN for c in connections)):
            return child
    raise AssertionError(f"no process of the trainer is connected to port {port}")


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_a_dead_rank_stops_training_with_an_error_naming_it(tmp_path):
    log_path = tmp_path / "train.log"
    with open(log_path, "w") as log:
        proc = launch.start([f"--train_dir={tmp_path}", "--experiment=exp", "--env=CartPole-v1", "--num_learners=2",
                             "--num_workers=1", "--train_for_seconds=100", "--max_recoveries=0"], output=log)
    try:
        wait_for(lambda: (read_summary(tmp_path).get("samples_trained") or 0) > 0, 90, "the group to train")
        port = int(re.search(r"learner group: 2 ranks joined \(gloo, 127\.0\.0\.1:(\d+)\)", log_path.read_text())[1])
        trainer = psutil.Process(proc.pid)
        rank, descendants = _rank_1(trainer, port), trainer.children(recursive=True)
        rank.kill()
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    output = log_path.read_text()
    assert proc.returncode == 1, output[-3000:]
    assert (f"training stopped: learner_rank_1 failed: process learner_rank_1 (pid {rank.pid}) died with exit "
            f"code -9 (--max_recoveries=0: no recovery)") in output, output[-3000:]
    assert read_summary(tmp_path)["last_checkpoint"], output[-3000:]  # rank 0 outlives the group, and saves
    _, alive = psutil.wait_procs(descendants, timeout=10)
    assert not alive, [p.pid for p in alive]


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_a_dead_rank_is_recovered_from_with_nothing_trained_lost(tmp_path):
    """Rank 0 outlives rank 1 and saves on the way down; the group is made again (the ranks now start from a
    forkserver) from that checkpoint and trains to the target."""
    log_path = tmp_path / "train.log"
    with open(log_path, "w") as log:
        proc = launch.start([f"--train_dir={tmp_path}", "--experiment=exp", "--env=CartPole-v1", "--num_learners=2",
                             "--num_workers=1", "--seed=2", "--target_mean_return=450", "--train_for_seconds=100",
                             "--train_for_env_steps=10000000", "--experiment_summaries_interval=0.5"], output=log)
    try:
        wait_for(lambda: (read_summary(tmp_path).get("policy_version") or 0) > 2, 90, "the group to train")
        port = int(re.search(r"learner group: 2 ranks joined \(gloo, 127\.0\.0\.1:(\d+)\)", log_path.read_text())[1])
        trainer = psutil.Process(proc.pid)
        rank = _rank_1(trainer, port)
        rank.kill()
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    output = log_path.read_text()
    assert proc.returncode == 0, output[-3000:]
    assert output.count("learner group: 2 ranks joined (gloo") == 2, output[-3000:]
    summary = read_summary(tmp_path)
    assert summary["time_to_target"] is not None, summary
    [fault] = summary["faults"]
    assert fault["component"] == "learner_rank_1" and fault["at"] < fault["recovered_at"]
    assert fault["frames_lost"] == summary["trained_frames_lost"] == 0 and summary["recoveries"] == 1


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_no_rank_outlives_a_killed_trainer(tmp_path):
    kill_9_once([f"--train_dir={tmp_path}", "--experiment=exp", "--env=CartPole-v1", "--num_learners=2",
                 "--num_workers=1", "--train_for_seconds=100"],
                lambda: (read_summary(tmp_path).get("samples_trained") or 0) > 0, 90, "the group to train")


# ------------------------------------------------------------------------------------------ bad input

@pytest.mark.parametrize("flags, message", [
    (["--num_learners=2", "--num_policies=2"], "--num_learners=2 needs --num_policies=1, got 2: a learner group "
                                               "trains one policy"),
    (["--num_learners=3"], "--num_learners=3 must divide the dataset's 64 trajectories (--batch_size × "
                           "--num_batches_per_epoch / --rollout = 1024 × 2 / 32): each rank trains on an equal share"),
])
@pytest.mark.slow  # starts a process
def test_bad_learner_group_flags_exit_2_with_one_message(tmp_path, flags, message):
    result = launch.run([f"--train_dir={tmp_path}", "--env=CartPole-v1", *flags], timeout=60)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [f"sf_core.train: error: {message}"]


@pytest.mark.parametrize("flags, message", [
    (["--num_learners=0"], "--num_learners must be at least 1, got 0"),
    (["--num_learners=2", "--serial_mode=True"], "--num_learners=2 cannot run with --serial_mode=True"),
    (["--num_learners=2", "--with_pbt=True", "--num_policies=4"], "--num_learners=2 cannot run with --with_pbt"),
    (["--num_learners=3", "--batch_size=32", "--num_batches_per_epoch=3", "--rollout=32"],
     "--num_learners=3 must divide --batch_size=32"),  # though its 3 trajectories split evenly
    (["--num_learners=2", "--use_rnn=True", "--batch_size=32"],
     "each rank's minibatch of --batch_size / --num_learners = 32 / 2 = 16 samples must be a multiple of "
     "--recurrence=32"),
])
def test_what_a_learner_group_needs_of_the_other_flags(flags, message):
    with pytest.raises(ConfigError) as err:
        parse_args(["--env=CartPole-v1", *flags])
    assert message in str(err.value)


def test_a_group_on_gpus_needs_one_per_rank():
    gpus = torch.cuda.device_count()
    with pytest.raises(ValueError, match=f"--num_learners={gpus + 1} on cuda:0 needs {gpus + 1} GPUs from cuda:0 on"):
        plan(small_config(num_learners=gpus + 1), "cuda:0")
