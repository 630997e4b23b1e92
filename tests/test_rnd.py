"""APPO + RND (algo/rnd.py) and the corridor it is shown on (envs/corridor.py): the graph, the intrinsic
reward's behaviour, what one training iteration changes, the env's contract, and one learning run."""

import importlib.util

import gymnasium as gym
import numpy as np
import pytest
import torch

import sf_core.envs  # noqa: F401  (registers sf_core/Corridor-v0)
from sf_core.algo import rnd
from sf_core.algo.adam import make_adam
from sf_core.algo.executor import GraphExecutor
from sf_core.algo.graph import Context, ModelSlot, build_graph
from sf_core.algo.model import ActorCritic, ModelSpec
from sf_core.algo.params import LearningParams
from sf_core.algo.registry import algorithm_builder, known_algorithms
from sf_core.envs.corridor import CorridorEnv
from sf_core.config import ConfigError
from sf_core.contracts.sample import BATCH_KEYS, SampleSpaces, batch_tensors
from tests.conftest import REPO
from tests.helpers import train

LENGTH = 30


def one_hot(cells: torch.Tensor, length: int = LENGTH) -> torch.Tensor:
    return torch.nn.functional.one_hot(cells, length).float()


def context(params: LearningParams, obs_space: gym.Space | None = None) -> Context:
    torch.manual_seed(0)
    env = CorridorEnv(LENGTH)
    model = ActorCritic(obs_space or env.observation_space, env.action_space, ModelSpec())
    models = {"actor_critic": ModelSlot(model, make_adam(model.parameters(), "cpu"))}
    models.update(rnd.appo_rnd(params).extra_models(models))
    return Context(models, params)


def corridor_batch(cells: torch.Tensor) -> dict[str, torch.Tensor]:
    """A dataset whose observations are the corridor cells `cells` [T+1, N]: random actions, no reward."""
    env = CorridorEnv(LENGTH)
    T, N = cells.shape[0] - 1, cells.shape[1]
    batch = batch_tensors(SampleSpaces(env.observation_space, env.action_space), T, N)
    batch.update(obs=one_hot(cells), actions=torch.randint(2, (T, N)), log_prob=torch.full((T, N), -np.log(2.0)))
    return batch


def test_graph_builds_with_the_two_rnd_networks_in_one_generation():
    assert "APPO_RND" in known_algorithms()
    graph = build_graph(algorithm_builder("APPO_RND")(LearningParams()).nodes, BATCH_KEYS)
    generation = next(g for g in graph.generations() if "rnd_target" in g)
    assert "rnd_predictor" in generation
    node = {name: graph.nodes[name]["node"] for name in graph}
    assert (node["rnd_target"].kind, node["rnd_target"].model) == ("inference", "rnd_target")
    assert (node["rnd_predictor"].kind, node["rnd_predictor"].model) == ("inference", "rnd_predictor")
    trained = {n.model for n in node.values() if n.kind == "train_step"}
    assert trained == {"actor_critic", "rnd_predictor", "intrinsic_critic"}  # never the target


def rnd_iteration(ctx: Context, cells: torch.Tensor, train: bool = True, observe=one_hot) -> dict:
    """The RND nodes' path on observations of `cells` [T+1, N] (as `observe` shows them): whiten, both
    networks, the error, and (`train`) the predictor's update."""
    x = {"obs": observe(cells), "mask": torch.ones(cells.shape[0] - 1, cells.shape[1])}
    with torch.no_grad():
        x.update(rnd.rnd_whiten(ctx, x))
        x.update(rnd.rnd_target(ctx, x), **rnd.rnd_predict(ctx, x))
        x.update(rnd.intrinsic_reward(ctx, x))
    if train:
        x.update(rnd.rnd_predictor_update(ctx, x))
    return x


def reward_of_stepping_into(ctx: Context, cells: torch.Tensor, observe=one_hot) -> tuple[torch.Tensor, torch.Tensor]:
    """(prediction errors, intrinsic rewards) of stepping from cell 0 into each of `cells`."""
    path = torch.cat([torch.zeros(1, dtype=torch.long), cells]).unsqueeze(1)
    x = rnd_iteration(ctx, path, train=False, observe=observe)
    return x["rnd_errors"].flatten(), x["intrinsic_rewards"].flatten()


def test_intrinsic_reward_falls_where_the_predictor_trained_and_stays_high_elsewhere():
    ctx = context(LearningParams(rnd_update_proportion=1.0, batch_size=256))
    seen, new = torch.arange(0, 5), torch.arange(10, 20)

    def visit_the_first_five_cells(datasets: int) -> None:
        for _ in range(datasets):
            rnd_iteration(ctx, torch.randint(0, 5, (33, 8)))

    visit_the_first_five_cells(10)  # the observation statistics settle: what both networks see stops moving
    seen_before, new_before = reward_of_stepping_into(ctx, seen)[0].mean(), reward_of_stepping_into(ctx, new)[0].mean()
    visit_the_first_five_cells(40)
    (seen_after, seen_reward), (new_after, new_reward) = reward_of_stepping_into(ctx, seen), reward_of_stepping_into(
        ctx, new)
    assert seen_after.mean() < 0.3 * seen_before, (seen_before, seen_after)
    assert new_after.mean() > 0.5 * new_before, (new_before, new_after)
    assert new_reward.min() > 10 * seen_reward.max(), (new_reward, seen_reward)


def test_one_iteration_trains_the_predictor_and_the_intrinsic_critic_but_not_the_target():
    ctx = context(LearningParams(batch_size=128))
    before = {name: [p.detach().clone() for p in slot.module.parameters()] for name, slot in ctx.models.items()}
    executor = GraphExecutor(build_graph(rnd.appo_rnd(ctx.params).nodes, BATCH_KEYS), ctx)
    out = executor.run(corridor_batch(torch.randint(0, LENGTH, (33, 8))))

    def changed(name: str) -> bool:
        return any(not torch.equal(a, b) for a, b in zip(before[name], ctx.models[name].module.parameters()))

    assert changed("rnd_predictor") and changed("intrinsic_critic") and changed("actor_critic")
    assert not changed("rnd_target")
    predictor = ctx.models["rnd_predictor"].module
    assert predictor.obs_norm.count > 32 * 8 - 1 and predictor.return_norm.count > 32 * 8 - 1  # statistics folded in
    assert out["rnd_predictor_stats"]["rnd_predictor_loss"] > 0
    assert 0.1 < out["rnd_predictor_stats"]["rnd_trained_fraction"] < 0.4  # about --rnd_update_proportion


def test_intrinsic_returns_run_across_episode_ends_and_advantages_combine():
    params = LearningParams(rnd_int_coeff=0.5, rnd_ext_coeff=3.0)
    ctx = Context({}, params)
    rewards, values = torch.rand(6, 2), torch.rand(7, 2)
    x = {"intrinsic_rewards": rewards, "intrinsic_values": values}
    out = rnd.intrinsic_gae(ctx, x)
    # non-episodic: the same as GAE with no episode end at all, whatever the batch's dones say
    expected = rnd.gae(rewards, values, torch.zeros(6, 2), params.rnd_gamma, params.gae_lambda)[0]
    torch.testing.assert_close(out["intrinsic_advantages"], expected)
    a_ext, a_int = torch.rand(6, 2), torch.rand(6, 2)
    combined = rnd.combine_advantages(ctx, {"extrinsic_advantages": a_ext, "intrinsic_advantages": a_int})
    torch.testing.assert_close(combined["advantages"], 3.0 * a_ext + 0.5 * a_int)


def test_an_observation_other_than_a_box_of_features_or_an_image_is_a_clear_error():
    structured = gym.spaces.Dict({"position": gym.spaces.Box(0, 1, (3,), np.float32), "key": gym.spaces.Discrete(2)})
    check = rnd.appo_rnd(LearningParams()).check_spaces  # what the runner asks before any process starts
    with pytest.raises(ConfigError, match=r"APPO_RND supports Box observations of 1 dim.*Dict\('key': Discrete\(2\)"):
        check(structured, gym.spaces.Discrete(2))
    with pytest.raises(ConfigError, match=r"APPO_RND supports Box observations of 1 dim.*Box\(0.0, 1.0, \(4, 4\)"):
        check(gym.spaces.Box(0.0, 1.0, (4, 4), np.float32), gym.spaces.Discrete(2))
    check(gym.spaces.Box(0, 1, (LENGTH,), np.float32), gym.spaces.Discrete(2))  # the corridor's: fine
    check(gym.spaces.Box(0, 255, (84, 84, 4), np.uint8), gym.spaces.Discrete(6))  # an image: fine
    with pytest.raises(ConfigError, match=r"APPO_RND supports Box observations of 1 dim.*Dict"):  # and in the learner
        context(LearningParams(), structured)


# ------------------------------------------------------------------------------------------------ images
IMAGE_SPACE = gym.make("sf_core/CorridorImage-v0").observation_space


def corridor_images(cells: torch.Tensor) -> torch.Tensor:
    """The image corridor's observations of `cells` [...]: [..., 1, 6, 6] uint8, the cell's pixel lit."""
    side = IMAGE_SPACE.shape[-1]
    images = torch.zeros(*cells.shape, side * side, dtype=torch.uint8)
    images.scatter_(-1, cells.unsqueeze(-1), 255)
    return images.reshape(*cells.shape, 1, side, side)


@pytest.mark.parametrize("shape, channels_last", [((4, 84, 84), False), ((84, 84, 4), True)])
def test_rnd_reads_an_images_newest_frame_and_whitens_it_per_pixel(shape, channels_last):
    inp = rnd.RNDInput.of(gym.spaces.Box(0, 255, shape, np.uint8))
    assert inp.chw == (4, 84, 84) and inp.channels_last == channels_last and inp.stats_shape == (1, 84, 84)
    stored = torch.randint(0, 256, (5, 3, *shape), dtype=torch.uint8)  # [T, N, stored shape]
    newest = stored[..., 3] if channels_last else stored[:, :, 3]
    torch.testing.assert_close(inp.read(stored), newest.unsqueeze(-3).float())
    predictor = rnd.RNDPredictor(inp, 32)
    predictor.update_obs_stats(stored.flatten(0, 1))
    assert predictor.obs_norm.mean.shape == (1, 84, 84)  # a mean per pixel
    torch.testing.assert_close(predictor.obs_norm.mean[0], newest.flatten(0, 1).double().mean(0), atol=0.5, rtol=0)
    assert predictor(predictor.whiten(stored)).shape == (5, 3, 32)  # the Nature CNN's embedding, per sample
    assert rnd.IntrinsicCritic(inp, 32)(stored).shape == (5, 3)


@pytest.mark.slow  # trains the conv predictor for about 4 s
def test_on_images_the_intrinsic_reward_falls_where_the_predictor_trained_and_stays_high_elsewhere():
    """The same as on one-hot cells, with the conv networks on the image corridor (smaller: 32 features)."""
    ctx = context(LearningParams(rnd_update_proportion=1.0, batch_size=128, num_epochs=4, rnd_hidden=32),
                  IMAGE_SPACE)
    seen, new = torch.arange(0, 5), torch.arange(10, 20)

    def visit_the_first_five_cells(datasets: int) -> None:
        for _ in range(datasets):
            rnd_iteration(ctx, torch.randint(0, 5, (33, 8)), observe=corridor_images)

    visit_the_first_five_cells(10)
    seen_before = reward_of_stepping_into(ctx, seen, corridor_images)[0].mean()
    new_before = reward_of_stepping_into(ctx, new, corridor_images)[0].mean()
    visit_the_first_five_cells(40)
    seen_after, seen_reward = reward_of_stepping_into(ctx, seen, corridor_images)
    new_after, new_reward = reward_of_stepping_into(ctx, new, corridor_images)
    assert seen_after.mean() < 0.3 * seen_before, (seen_before, seen_after)
    assert new_after.mean() > 0.5 * new_before, (new_before, new_after)
    assert new_reward.min() > 10 * seen_reward.max(), (new_reward, seen_reward)


# ------------------------------------------------------------------------------------------------ the corridor
def test_corridor_right_action_moves_wrong_action_ends_and_only_the_goal_pays():
    env = gym.make("sf_core/Corridor-v0").unwrapped
    assert env.length == LENGTH and env.action_space.n == 2
    right = env.right_actions
    assert np.array_equal(right, CorridorEnv().right_actions)  # every instance is the same corridor
    assert 0 < right.sum() < LENGTH  # both actions are right somewhere
    obs, _ = env.reset(seed=5)
    assert obs.argmax() == 0 and obs.sum() == 1
    for cell in range(LENGTH - 1):
        obs, reward, terminated, truncated, _ = env.step(right[cell])
        assert obs.argmax() == cell + 1 and reward == 0.0 and not terminated and not truncated
    obs, reward, terminated, truncated, _ = env.step(right[-1])
    assert reward == 1.0 and terminated and not truncated

    for cell in (0, 7, LENGTH - 1):  # a wrong action anywhere, the last cell included, ends it unpaid
        env.reset()
        for c in range(cell):
            env.step(right[c])
        obs, reward, terminated, truncated, _ = env.step(1 - right[cell])
        assert reward == 0.0 and terminated and not truncated and obs.argmax() == cell


def test_corridor_truncates_at_max_steps():
    env = CorridorEnv(length=10, max_steps=3)
    env.reset()
    flags = [env.step(env.right_actions[c])[2:4] for c in range(3)]
    assert flags == [(False, False), (False, False), (False, True)]


# ------------------------------------------------------------------------------------------------ learning
def benchmark_flags() -> tuple[str, ...]:
    """The trainer flags scripts/exploration_benchmark.py runs both algorithms with."""
    spec = importlib.util.spec_from_file_location("exploration_benchmark", f"{REPO}/scripts/exploration_benchmark.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.TRAINER_FLAGS


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_appo_rnd_reaches_the_end_of_the_corridor(tmp_path):
    """The default corridor (30 cells): about 130k frames and 15 s on 2 cores, where APPO does not reach the
    goal in 1M frames (docs/algorithms.md)."""
    code, summary = train(tmp_path, "--env=sf_core/Corridor-v0", "--algo=APPO_RND", "--seed=1",
                          "--target_mean_return=0.9", "--train_for_env_steps=1000000", "--train_for_seconds=60",
                          *benchmark_flags())
    assert code == 0, summary.get("error")
    assert summary["time_to_target"] is not None, summary
    assert summary["mean_return_at_target"] >= 0.9


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_appo_rnd_reaches_the_end_of_the_image_corridor(tmp_path):
    """A corridor of 20 cells seen as 5×5 images: RND's networks and the policy's encoder are CNNs. (The
    30-cell one, sf_core/CorridorImage-v0, takes about twice as long: docs/algorithms.md.) About 90k frames
    and 32 s on 2 cores."""
    code, summary = train(tmp_path, "--env=CorridorImage20-v0", "--env_module=tests.small_envs", "--algo=APPO_RND",
                          "--seed=1", "--target_mean_return=0.9", "--train_for_env_steps=1000000",
                          "--train_for_seconds=100", *benchmark_flags())
    assert code == 0, summary.get("error")
    assert summary["time_to_target"] is not None, summary
    assert summary["mean_return_at_target"] >= 0.9


@pytest.mark.parametrize("flag, message", [("--rnd_update_proportion=0", "rnd_update_proportion must be in"),
                                           ("--rnd_gamma=1.5", "rnd_gamma must be in"),
                                           ("--rnd_hidden=0", "rnd_hidden at least 1")])
def test_an_rnd_flag_out_of_range_is_one_clear_error(flag, message):
    from sf_core.cli.arguments import parse_args
    from sf_core.config import ConfigError

    with pytest.raises(ConfigError, match=message):
        parse_args(["--env=sf_core/Corridor-v0", "--algo=APPO_RND", flag])
