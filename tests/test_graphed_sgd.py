"""--sgd_cuda_graphs (algo/graphed_sgd.py): the learner's SGD step recorded once and replayed for each minibatch.

A CUDA graph replays the kernels it recorded on the memory they used: Python does not run again, every float
argument is a constant, and a host read of a tensor cannot be recorded at all. `Replay` makes such a recording
on the CPU: the step's aten operations, recorded with the tensors they read and wrote, are replayed on those
tensors, each new result written where the recorded one was. A step that relied on Python between replays (a
learning rate passed as a float, a flag reassigned rather than written in place, a minibatch not copied in)
would then train otherwise than eager steps, and these tests would fail. tests/test_gpu.py replays real CUDA
graphs the same way.
"""

from __future__ import annotations

import dataclasses

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from sf_core.algo.adam import FusedAdam
from sf_core.algo.model import ActorCritic, ModelSpec
from sf_core.algo.params import LearningParams
from sf_core.config import Config
from sf_core.algo.graph import Context, ModelSlot
from sf_core.algo.graphed_sgd import GraphedSGD
from sf_core.algo.nodes import _ppo_policy_loss, _sgd_step, step_guard
from tests.conftest import extra
from tests.test_sgd_step import step_context


class _Operations(TorchDispatchMode):
    """Every aten operation run under it, with its arguments and its result; a host read is refused."""

    def __init__(self):
        super().__init__()
        self.ops: list = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten._local_scalar_dense.default:
            raise RuntimeError("a tensor read on the host while recording (.item(), bool(), float())")
        result = func(*args, **kwargs)
        self.ops.append((func, args, kwargs, result))
        return result


class Replay:
    """A recording as a CUDA graph is one: `record` runs the step once and keeps its aten operations; `replay` runs
    those operations again on the tensors they used, writing each result into the tensor recorded for it."""

    replays = 0

    def warm(self, fn):
        return fn()

    def record(self, fn):
        with _Operations() as recorded:
            output = fn()
        self.ops = recorded.ops
        return output

    def replay(self) -> None:
        Replay.replays += 1
        with torch.no_grad():
            for func, args, kwargs, recorded in self.ops:
                for old, new in zip(tree_flatten(recorded)[0], tree_flatten(func(*args, **kwargs))[0]):
                    if isinstance(old, torch.Tensor) and new is not old:
                        old.copy_(new)


def dataset(seed: int, steps: int = 5, short_last: bool = True, poisoned: int | None = None) -> list[dict]:
    """A dataset's minibatches: `steps` of the template's size, then a shorter one."""
    _, _, template = step_context()
    gen = torch.Generator().manual_seed(seed)
    made = []
    for k in range(steps + short_last):
        rows = template["obs"].shape[1] if k < steps else 5
        mb = {key: value[:, :rows].clone() if value.dim() > 1 and key != "initial_states" else value[:rows].clone()
              for key, value in template.items()}
        mb["obs"] = torch.randn(mb["obs"].shape, generator=gen)
        mb["advantages"] = torch.randn(mb["advantages"].shape, generator=gen)
        mb["log_prob"] = -torch.rand(mb["log_prob"].shape, generator=gen)
        if k == poisoned:
            mb["targets"][0, 1] = float("nan")
        made.append(mb)
    return made


def train(datasets: list[tuple[float, list[dict]]], graphed: bool, between=lambda ctx, k: None,
          lr_in_tensor: bool = True, device: str = "cpu", recording=None, context=step_context):
    """Trains `context()`'s model on each (learning rate, minibatches) in turn; the model, its Adam, each step's
    statistics and each dataset's error (None, or the non-finite step's message). Eager steps read the rate from
    a tensor too (`lr_in_tensor`), as recorded ones do: the fused kernel rounds a float32 rate otherwise than a
    double."""
    ctx, model, _ = context()
    model.to(device)
    adam = FusedAdam(list(model.parameters()))
    if lr_in_tensor:
        adam.keep_lr_in_tensor()
    ctx = Context({"actor_critic": ModelSlot(model, adam, device)}, ctx.params, finite_check_on_device=True)
    # on a GPU, real CUDA graphs (tests/test_gpu.py)
    recording = recording or (Replay if device == "cpu" else None)
    recorded = GraphedSGD(model, adam, device, recording=recording, warmup_steps=2) if graphed else None
    stats, errors = [], []
    for k, (lr, minibatches) in enumerate(datasets):
        between(ctx, k)
        adam.param_groups[0]["lr"] = lr
        if not graphed:  # the recorded steps' `begin` loads it
            adam.load_lr()
        guard = recorded.begin(ctx.params) if graphed else step_guard(ctx, ctx.models["actor_critic"])

        def run(mb):
            return _sgd_step(ctx, mb, _ppo_policy_loss, guard)

        for mb in minibatches:
            mb = {key: value.to(device) for key, value in mb.items()}
            step_stats, _ = recorded.step(mb, run) if graphed else run(mb)
            stats.append(step_stats)
        try:
            guard.finish()
            errors.append(None)
        except FloatingPointError as exc:
            errors.append(str(exc))
    return model, adam, stats, errors, recorded


def assert_same(eager, graphed) -> None:
    (model, adam, stats, errors, _), (g_model, g_adam, g_stats, g_errors, _) = eager, graphed
    assert errors == g_errors
    for a, b in zip(model.parameters(), g_model.parameters()):
        assert torch.equal(a, b)
        assert all(torch.equal(adam.state[a][key], g_adam.state[b][key]) for key in adam.state[a])
    assert len(stats) == len(g_stats)
    for a, b in zip(stats, g_stats):  # a non-finite step's statistics hold NaN
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)


def test_replayed_steps_train_as_eager_steps_across_datasets_and_learning_rates():
    Replay.replays = 0
    datasets = [(1e-2, dataset(1)), (5e-3, dataset(2)), (2e-3, dataset(3))]
    eager, graphed = train(datasets, graphed=False), train(datasets, graphed=True)
    assert_same(eager, graphed)
    recorded = graphed[-1]
    shapes = {name: shape for name, shape, _ in recorded.recorded.key}
    assert shapes["obs"] == (1, 64, 4)  # the full minibatches' shape; the short one of 5 stays eager
    assert Replay.replays == 3 * 5 - 2 - 1  # all full steps but the two warm-up steps and the recording's own
    assert not torch.equal(graphed[2][0], graphed[2][5])  # each replay's statistics are its own minibatch's
    as_floats = train(datasets, graphed=False, lr_in_tensor=False)[0]  # the rate as the group's float
    for a, b in zip(as_floats.parameters(), graphed[0].parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def test_a_non_finite_replayed_step_stops_its_dataset_and_the_next_dataset_trains_again():
    datasets = [(1e-2, dataset(1)), (1e-2, dataset(2, poisoned=3)), (1e-2, dataset(3))]
    eager, graphed = train(datasets, graphed=False), train(datasets, graphed=True)
    assert_same(eager, graphed)
    assert graphed[3][0] is None and graphed[3][2] is None
    assert "value loss nan" in graphed[3][1]


@pytest.mark.parametrize("change", ["fresh_moments", "clip_ratio"])
def test_new_optimizer_state_or_hyperparameters_are_recorded_again(change):
    def between(ctx: Context, k: int) -> None:
        if k != 2:
            return
        if change == "fresh_moments":  # what PBT's exploit does
            ctx.models["actor_critic"].optimizer.state.clear()
        else:
            ctx.params = dataclasses.replace(ctx.params, ppo_clip_ratio=0.05)

    datasets = [(1e-2, dataset(seed)) for seed in (1, 2, 3, 4)]
    Replay.replays = 0
    eager, graphed = train(datasets, False, between), train(datasets, True, between)
    assert_same(eager, graphed)
    assert Replay.replays == 2 * (2 * 5 - 2 - 1)  # recorded twice: two datasets before the change, two after


class Unrecordable(Replay):
    def record(self, fn):
        raise RuntimeError("operation not permitted when stream is capturing")


def test_a_step_that_cannot_be_recorded_runs_eagerly_from_then_on(caplog):
    datasets = [(1e-2, dataset(1)), (5e-3, dataset(2))]
    eager = train(datasets, graphed=False)
    graphed = train(datasets, graphed=True, recording=Unrecordable)
    assert_same(eager, graphed)
    assert graphed[-1].failed is not None and graphed[-1].recorded is None
    assert "could not be recorded as a CUDA graph (RuntimeError: operation not permitted" in caplog.text


@pytest.mark.parametrize("flags, named", [(["--overlap_graph_nodes=True"], "--overlap_graph_nodes=True"),
                                          (["--num_learners=2"], "--num_learners=2")])
def test_what_a_recording_cannot_hold_is_refused_with_the_flag_named(flags, named):
    from sf_core.cli.arguments import parse_args
    from sf_core.config import ConfigError

    with pytest.raises(ConfigError, match=f"--sgd_cuda_graphs=True .*{named}"):
        parse_args(["--env=CartPole-v1", "--sgd_cuda_graphs=True", *flags])
    parse_args(["--env=CartPole-v1", "--sgd_cuda_graphs=True"])  # alone it is taken



@pytest.mark.parametrize("split", [False, True], ids=["actor_critic", "split_actor_critic"])
def test_a_trainers_updates_replayed_train_as_eager_ones(monkeypatch, split):
    """Through the learner's Trainer: the actor-critic's update, or the actor's and the critic's of
    --split_actor_critic, each recorded and replayed, end where eager updates end, bit for bit."""
    from tests.test_split_actor_critic import small_config

    cfg = small_config(split_actor_critic=split, sgd_cuda_graphs=True)
    eager = trained_with(monkeypatch, cfg, {}, recording=Replay, warmup_steps=10**9)  # never recorded
    Replay.replays = 0
    made: dict = {}
    graphed = trained_with(monkeypatch, cfg, made, recording=Replay, warmup_steps=2)
    assert len(made) == (2 if split else 1) and all(g.recorded is not None for g in made.values())
    steps = 4 * 2  # minibatches a dataset, epochs
    assert Replay.replays == len(made) * (4 * steps - 2 - 1)
    for a, b in zip(trainer_state(eager), trainer_state(graphed), strict=True):
        assert torch.equal(a, b)


def trained_with(monkeypatch, cfg, made: dict, device: str = "cpu", datasets: int = 4, **graphed):
    """tests.test_split_actor_critic.trained(cfg), each update's steps through a GraphedSGD(**graphed) made
    wherever the learner asks for one (and put in `made`), whatever the device: eager steps with the rate
    in a tensor, if it never records."""
    from sf_core.algo import nodes
    from tests.test_split_actor_critic import trained

    def graphed_sgd(slot, key, enabled, gather, check_on_device):
        assert enabled and gather is None
        if key not in slot.sgd_graphs:
            made[key] = slot.sgd_graphs[key] = GraphedSGD(slot.module, slot.optimizer, slot.device, **graphed)
        return slot.sgd_graphs[key]

    with monkeypatch.context() as patched:
        patched.setattr(nodes, "graphed_sgd", graphed_sgd)
        return trained(cfg, datasets=datasets, device=device)


def trainer_state(trainer) -> list[torch.Tensor]:
    """Every model's weights and statistics, and every optimizer's moments."""
    found = [t for slot in trainer.models.values() for t in slot.module.state_dict().values()]
    optimizers = [slot.optimizer for slot in trainer.models.values() if slot.optimizer is not None]
    return found + [t for optimizer in optimizers for state in optimizer.state.values() for t in state.values()]


MODELS = {  # spaces, flags, sequence length
    "frames": (gym.spaces.Box(0, 255, (4, 84, 84), np.uint8), gym.spaces.Discrete(6), {}, 1),
    "gaussian": (gym.spaces.Box(-10, 10, (17,), np.float32), gym.spaces.Box(-1, 1, (6,), np.float32),
                 {"normalize_input": True, "actor_critic_share_weights": False}, 1),
    "recurrent": (gym.spaces.Box(-1, 1, (4,), np.float32), gym.spaces.Discrete(2),
                  {"use_rnn": True, "rnn_size": 16, "rollout": 4}, 4),
}


def model_context(kind: str):
    obs_space, action_space, flags, _ = MODELS[kind]

    def context():
        torch.manual_seed(0)
        cfg = Config(env="x", batch_size=8, encoder_mlp_layers=[16], **flags)
        model = ActorCritic(obs_space, action_space, ModelSpec.from_config(cfg))
        obs_space.seed(0)  # the same statistics for both models compared
        model.update_obs_stats(torch.as_tensor(np.stack([obs_space.sample() for _ in range(32)])), None)
        return Context({}, LearningParams.from_config(cfg)), model, None

    return context


def model_dataset(kind: str, seed: int, steps: int = 4, sequences: int = 8) -> list[dict]:
    """Minibatches of `sequences` sequences of MODELS[kind]'s length, as minibatch_sgd hands them to a step."""
    obs_space, action_space, flags, L = MODELS[kind]
    gen, rng = torch.Generator().manual_seed(seed), np.random.default_rng(seed)
    state = model_context(kind)()[1].rnn_state_size
    made = []
    for _ in range(steps):
        obs = torch.as_tensor(np.stack([obs_space.sample() for _ in range(L * sequences)]))
        actions = torch.as_tensor(np.stack([action_space.sample() for _ in range(L * sequences)]))
        made.append({"obs": obs.view(L, sequences, *obs.shape[1:]), "actions": actions.view(L, sequences,
                     *actions.shape[1:]), "log_prob": -torch.rand(L, sequences, generator=gen) - 1.0,
                     "advantages": torch.randn(L, sequences, generator=gen), "targets": torch.randn(L, sequences,
                     generator=gen), "old_values": torch.zeros(L, sequences), "mask": torch.ones(L, sequences),
                     "resets": torch.as_tensor(rng.random((L, sequences)) < 0.2),
                     "initial_states": torch.randn(sequences, state, generator=gen)})
    return made


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_the_step_of_every_kind_of_model_replays_as_its_eager_step(kind):
    """A conv encoder on uint8 frames, separate Gaussian actor and critic bodies on normalized observations, and a
    recurrent core unrolled over sequences: each model's step records without a host read and replays as it
    runs eagerly."""
    Replay.replays = 0
    datasets = [(3e-4, model_dataset(kind, seed)) for seed in (1, 2, 3)]

    def between(ctx: Context, k: int) -> None:  # each dataset moves the observations' statistics, as the learner's do
        model = ctx.models["actor_critic"].module
        model.update_obs_stats(datasets[k][1][0]["obs"].flatten(0, 1) * (k + 1), None)

    eager = train(datasets, False, between, context=model_context(kind))
    graphed = train(datasets, True, between, context=model_context(kind))
    assert graphed[-1].recorded is not None and graphed[-1].failed is None
    assert Replay.replays == 3 * 4 - 2 - 1
    assert_same(eager, graphed)


def preset(env: str, *flags: str):
    """The config `env`'s preset makes (with `flags`), and the env's spaces."""
    extra("ale_py" if env.startswith("atari") else "mujoco", "atari" if env.startswith("atari") else "mujoco")
    from sf_core.cli.arguments import parse_args
    from sf_core.envs.registry import EnvContext, registry_snapshot

    cfg, _ = parse_args([f"--env={env}", *flags])
    made = registry_snapshot().make(cfg.env, cfg, EnvContext(worker_index=-1, env_index=-1, seed=0))
    spaces = made.observation_space, made.action_space
    made.close()
    return cfg, *spaces


@pytest.mark.parametrize("env, flags", [("atari_pong", []), ("atari_pong", ["--mixed_precision=True"]),
                                        ("HalfCheetah-v5", []), ("Humanoid-v5", [])])
def test_the_presets_own_models_replay_as_their_eager_steps(env, flags):
    """Pong's Nature CNN (float32 and bf16 autocast) and the MuJoCo presets' models, as the presets build them."""
    cfg, obs_space, action_space = preset(env, *flags)
    rows = 32

    def context():
        torch.manual_seed(0)
        return Context({}, LearningParams.from_config(cfg)), ActorCritic(obs_space, action_space,
                                                                         ModelSpec.from_config(cfg)), None

    def minibatches(seed: int) -> list[dict]:
        gen = torch.Generator().manual_seed(seed)
        obs_space.seed(seed), action_space.seed(seed)
        return [{"obs": torch.as_tensor(np.stack([obs_space.sample() for _ in range(rows)]))[None],
                 "actions": torch.as_tensor(np.stack([action_space.sample() for _ in range(rows)]))[None],
                 "log_prob": -torch.rand(1, rows, generator=gen) - 1.0,
                 "advantages": torch.randn(1, rows, generator=gen), "targets": torch.randn(1, rows, generator=gen),
                 "old_values": torch.zeros(1, rows),
                 "mask": torch.ones(1, rows), "resets": torch.zeros(1, rows, dtype=torch.bool),
                 "initial_states": torch.zeros(rows, 0)} for _ in range(4)]

    datasets = [(cfg.learning_rate, minibatches(seed)) for seed in (1, 2, 3)]
    eager, graphed = train(datasets, False, context=context), train(datasets, True, context=context)
    assert graphed[-1].recorded is not None and graphed[-1].failed is None
    assert_same(eager, graphed)


def test_ants_preset_trains_its_split_actor_and_critic_through_the_trainer_as_eagerly(monkeypatch):
    """Ant-v5's preset (an actor and a critic, values recomputed, the critic trained after the release), three
    datasets through the Trainer: recorded and replayed, bit for bit as eager steps with the rate in a tensor."""
    from sf_core.algo import nodes
    from sf_core.algo.registry import algorithm_builder
    from sf_core.contracts.sample import SampleSpaces, batch_tensors
    from sf_core.learning.learner import Trainer

    cfg, obs_space, action_space = preset("Ant-v5", "--sgd_cuda_graphs=True")
    assert cfg.split_actor_critic
    trajectories = cfg.batch_size * cfg.num_batches_per_epoch // cfg.rollout

    def dataset(seed: int) -> dict[str, torch.Tensor]:
        gen = torch.Generator().manual_seed(seed)
        obs_space.seed(seed), action_space.seed(seed)
        data = batch_tensors(SampleSpaces(obs_space, action_space), cfg.rollout, trajectories)
        for key, space in (("obs", obs_space), ("actions", action_space)):
            rows = data[key].numel() // int(np.prod(space.shape))
            data[key].copy_(torch.as_tensor(np.stack([space.sample() for _ in range(rows)])).view_as(data[key]))
        data["log_prob"].copy_(-torch.rand(data["log_prob"].shape, generator=gen) - 2.0)
        data["rewards"].copy_(torch.rand(data["rewards"].shape, generator=gen))
        data["dones"].copy_(torch.rand(data["dones"].shape, generator=gen) < 0.02)
        return data

    def trained(made: dict, **graphed) -> Trainer:
        def graphed_sgd(slot, key, enabled, gather, check_on_device):
            if key not in slot.sgd_graphs:
                made[key] = slot.sgd_graphs[key] = GraphedSGD(slot.module, slot.optimizer, slot.device, **graphed)
            return slot.sgd_graphs[key]

        with monkeypatch.context() as patched:
            patched.setattr(nodes, "graphed_sgd", graphed_sgd)
            trainer = Trainer(cfg, obs_space, action_space, ModelSpec.from_config(cfg), "cpu", 3,
                              algorithm_builder(cfg.algo))
            trainer.build(None, None)
            torch.manual_seed(11)
            for k in range(3):
                trainer.train(dataset(k), cfg.learning_rate * (1 - 0.2 * k), k)
        return trainer

    eager = trained({}, recording=Replay, warmup_steps=10**9)
    made: dict = {}
    graphed = trained(made, recording=Replay)
    assert len(made) == 2 and all(g.recorded is not None and g.failed is None for g in made.values())
    for a, b in zip(trainer_state(eager), trainer_state(graphed), strict=True):
        assert torch.equal(a, b)

