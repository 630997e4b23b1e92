"""Two-player games: the built-in race-to-21 env, win rates between policies, head-to-head play, and
(slow) self-play that learns the game well enough to beat a random player."""

import json

import gymnasium as gym
import numpy as np
import pytest

from sf_core.envs.multi_agent import MultiAgentEnv, is_multi_agent, num_agents
from sf_core.envs.nim import Nim, make_nim
from sf_core.envs.registry import EnvContext, EnvRegistry, make_env, registry_snapshot
from sf_core.evaluation.head_to_head import play_matches
from sf_core.run.win_rates import WinRates
from tests import launch

CTX = EnvContext(worker_index=-1, env_index=-1, seed=0)


def turn(obs: np.ndarray) -> bool:
    return bool(obs[-1])


def total_of(obs: np.ndarray) -> int:
    return int(np.argmax(obs[:-1]))


class PerfectNimPlayer:
    """Scripted perfect play (Nim.winning_action); any legal move from a lost total."""

    def __init__(self, env: Nim):
        self.env, self.games = env, 0

    def start_episode(self, agents: int = 1) -> None:
        self.games += 1

    def act(self, observations, episode) -> list[int]:
        return [self.env.winning_action(total_of(obs)) or 0 for obs in observations]


class FixedOutcome(MultiAgentEnv):
    """Every game lasts `length` steps and pays `returns` to agents 0 and 1, whoever plays them."""

    def __init__(self, returns=(1.0, -1.0), length: int = 2):
        self.num_agents, self.returns, self.length, self.t = 2, returns, length, 0
        self.observation_space = gym.spaces.Box(0.0, 1.0, (1,), np.float32)
        self.action_space = gym.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        self.t = 0
        return [np.zeros(1, np.float32)] * 2, [{}, {}]

    def step(self, actions):
        self.t += 1
        done = self.t == self.length
        self.t %= self.length
        rewards = list(self.returns) if done else [0.0, 0.0]
        return [np.zeros(1, np.float32)] * 2, rewards, [done] * 2, [False] * 2, [{}, {}]


# ------------------------------------------------------------------------------------------ the env
def test_nim21_is_a_built_in_two_agent_env_that_a_user_registration_can_shadow():
    for env in (make_env("nim21", None, CTX), registry_snapshot(only="nim21").make("nim21", None, CTX)):
        assert isinstance(env, Nim) and is_multi_agent(env) and num_agents(env) == 2
        assert env.observation_space == gym.spaces.Box(0.0, 1.0, (22,), np.float32)
        assert env.action_space == gym.spaces.Discrete(3)
    shadowed = EnvRegistry({"nim21": lambda name, cfg, ctx: Nim(target=5)}).make("nim21", None, CTX)
    assert shadowed.target == 5


def test_nim_turns_observations_win_and_auto_reset():
    env = Nim()
    obs, _ = env.reset(seed=1)
    mover = env.to_move
    assert [turn(o) for o in obs] == [a == mover for a in range(2)] and [total_of(o) for o in obs] == [0, 0]
    # the waiting agent's action (even an out-of-range one) changes nothing; the mover's adds action + 1
    actions = [0, 0]
    actions[mover], actions[1 - mover] = 2, 7
    obs, rewards, terminated, truncated, _ = env.step(actions)
    assert [total_of(o) for o in obs] == [3, 3] and rewards == [0.0, 0.0] and terminated == [False, False]
    assert turn(obs[1 - mover]) and not turn(obs[mover])
    env.total, env.to_move = 19, mover  # 19 + 3 overshoots 21: reaching or passing the target wins
    actions[mover], actions[1 - mover] = 99, 0  # out of range: clipped to the largest move
    obs, rewards, terminated, truncated, _ = env.step(actions)
    assert rewards[mover] == 1.0 and rewards[1 - mover] == -1.0
    assert terminated == [True, True] and truncated == [False, False]
    assert [total_of(o) for o in obs] == [0, 0] and sum(turn(o) for o in obs) == 1  # the next game's start
    assert env.render().shape == (24, 21 * 12, 3)


def test_nim_first_mover_is_drawn_per_game_from_the_seed():
    def first_movers(seed: int) -> list[int]:
        env = Nim(target=3, max_add=3)
        env.reset(seed=seed)
        movers = []
        for _ in range(200):
            movers.append(env.to_move)
            env.step([2, 2])  # adds 3: every game ends in one move
        return movers

    movers = first_movers(seed=4)
    assert movers == first_movers(seed=4) and movers != first_movers(seed=5)
    assert 70 <= sum(movers) <= 130, "both seats must move first about as often"


def test_nim_winning_action_is_the_known_solution():
    env = Nim()
    assert [t for t in range(21) if env.winning_action(t) is None] == [1, 5, 9, 13, 17]
    assert env.winning_action(0) == 0 and env.winning_action(19) in (1, 2) and env.winning_action(16) == 0
    with pytest.raises(ValueError):
        Nim(target=1)


# ------------------------------------------------------------------------------------------ head to head
def test_perfect_play_beats_random_from_both_seats_and_random_is_even_with_itself():
    env = make_nim("nim21", None, CTX)
    perfect = PerfectNimPlayer(env)
    result = play_matches(env, (perfect, None), games=400, seed=3)
    assert result["games"] == 400 and result["seats"] == [0, 1] * 200
    assert result["wins"] + result["losses"] + result["ties"] == 400 and result["ties"] == 0
    # random beats a perfect player only from the first seat, hitting 6 totals (1 in 729 there)
    assert result["win_rate"] >= 0.99, result["win_rate"]
    assert result["wins"] == sum(1 for mine, theirs in result["returns"] if (mine, theirs) == (1.0, -1.0))
    assert all(7 <= n <= 21 for n in result["lengths"])
    assert perfect.games == 1 + 400, "a fresh episode state for every game"

    mirrored = play_matches(Nim(), (None, PerfectNimPlayer(env)), games=400, seed=3)
    assert mirrored["win_rate"] <= 0.01
    coin = play_matches(Nim(), (None, None), games=2000, seed=8)
    assert 0.44 <= coin["win_rate"] <= 0.56, coin["win_rate"]


def test_seats_alternate_and_ties_count_half():
    # agent 0 always wins: each player gets that seat in every other game
    result = play_matches(FixedOutcome((1.0, -1.0)), (None, None), games=9, seed=0)
    assert (result["wins"], result["losses"], result["ties"]) == (5, 4, 0)
    assert result["returns"][:2] == [[1.0, -1.0], [-1.0, 1.0]] and result["lengths"] == [2] * 9
    tied = play_matches(FixedOutcome((0.5, 0.5), length=3), (None, None), games=4, seed=0)
    assert (tied["ties"], tied["win_rate"]) == (4, 0.5)


def test_play_matches_refuses_other_than_two_agents():
    with pytest.raises(ValueError, match="two-agent"):
        play_matches(gym.make("CartPole-v1"), (None, None), games=2)
    with pytest.raises(ValueError, match="at least 1"):
        play_matches(Nim(), (None, None), games=0)


# ------------------------------------------------------------------------------------------ win rates
def test_win_rates_matrix_ties_symmetry_and_ignored_matches():
    rates = WinRates(num_policies=3)
    assert rates.matrix() == [[None] * 3] * 3 and rates.mean_win_rate(0) is None
    for match in [((0, 1), (1.0, -1.0)), ((1, 0), (-1.0, 1.0)), ((1, 0), (1.0, -1.0)), ((0, 1), (0.0, 0.0))]:
        rates.add(match)
    rates.add(((0, 1, 2), (1.0, 0.0, -1.0)))  # three agents: no pairwise winner, ignored
    rates.add(((2, 2), (1.0, -1.0)))  # self-play: the diagonal
    matrix = rates.matrix()
    assert matrix[0][1] == pytest.approx(2.5 / 4) and matrix[1][0] == pytest.approx(1.5 / 4)
    assert matrix[2][2] == 0.5 and matrix[0][2] is None and matrix[0][0] is None
    assert rates.games() == [[0, 4, 0], [4, 0, 0], [0, 0, 1]]
    assert rates.mean_win_rate(0) == pytest.approx(0.625) and rates.mean_win_rate(2) is None
    with pytest.raises(ValueError):
        rates.add(((0, 3), (1.0, 0.0)))


def test_win_rates_keep_a_window_per_pair_and_mean_over_opponents():
    rates = WinRates(num_policies=3, window=4)
    for _ in range(10):
        rates.add(((0, 1), (-1.0, 1.0)))  # old: 0 lost
    for _ in range(4):
        rates.add(((1, 0), (-1.0, 1.0)))  # recent: 0 won; the window forgets the losses
    for _ in range(3):
        rates.add(((0, 2), (-1.0, 1.0)))
    assert rates.matrix()[0][1] == 1.0 and rates.games()[0] == [0, 4, 3]
    assert rates.mean_win_rate(0) == pytest.approx(0.5)  # mean of 1.0 (vs p1) and 0.0 (vs p2)
    assert rates.mean_win_rate(2) == 1.0


def test_win_rates_scalars_and_console_lines():
    rates = WinRates(num_policies=2)
    rates.add(((0, 1), (1.0, -1.0)))
    rates.add(((0, 0), (1.0, -1.0)))
    assert rates.scalars() == {"policy_0/win_rate/vs_0": 0.5, "policy_0/win_rate/vs_1": 1.0,
                               "policy_0/win_rate/mean": 1.0, "policy_1/win_rate/vs_0": 0.0,
                               "policy_1/win_rate/mean": 0.0}
    lines = rates.console_lines()
    assert len(lines) == 3 and "p0" in lines[0] and "p1" in lines[0]
    assert lines[1].split() == ["p0", "50%", "100%", "100%", "2"]
    assert lines[2].split() == ["p1", "0%", "-", "0%", "1"]


# ------------------------------------------------------------------------------------------ learning
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_four_policies_learn_nim21_log_their_win_rates_and_the_best_beats_random_and_holds_against_perfect(tmp_path):
    """Four policies, agents mapped at random at each game start (the nim21 preset: 2 workers, non-batched
    sampling). Any policy wins about half its games against random play; the best must win 90% (perfect
    play wins all but 1 in 1458), and against a perfect player it must win the games it starts (perfect
    play against perfect play: half)."""
    from sf_core.cli.plot import read_scalars
    from sf_core.evaluation.policy import load_checkpoint

    trained = launch.run([f"--train_dir={tmp_path}", "--experiment=nim", "--env=nim21", "--seed=11",
                          "--num_policies=4", "--train_for_env_steps=400000"], timeout=180)
    assert trained.returncode == 0, trained.stdout[-3000:] + trained.stderr[-3000:]
    assert "win rate (row vs column)" in trained.stderr + trained.stdout  # the console's closing matrix
    with open(tmp_path / "nim" / "training_summary.json") as f:
        summary = json.load(f)
    games = np.array(summary["games"])
    assert games.shape == (4, 4) and (games[~np.eye(4, dtype=bool)] > 0).all()  # every pair met
    assert "policy_0/win_rate/vs_1" in read_scalars(str(tmp_path / "nim")).Tags()["scalars"]  # and in TensorBoard

    enjoy = launch.run([f"--train_dir={tmp_path}", "--experiment=nim", "--opponent=random",
                        "--max_num_episodes=200", "--seed=1"], timeout=60, module="sf_core.enjoy")
    assert enjoy.returncode == 0, enjoy.stderr[-3000:]
    with open(tmp_path / "nim" / "eval_results.json") as f:
        results = json.load(f)
    assert results["policy_index"] == summary["best_policy"]  # the default plays the best
    assert results["opponent"] == "random" and results["wins"] + results["losses"] + results["ties"] == 200
    assert results["win_rate"] >= 0.9, results["win_rate"]

    env = Nim()
    best = load_checkpoint(str(tmp_path / "nim"))
    policy = best.policy(env.observation_space, env.action_space, deterministic=True)
    against_perfect = play_matches(env, (policy, PerfectNimPlayer(env)), games=200, seed=2)
    assert against_perfect["win_rate"] >= 0.35, against_perfect["win_rate"]

    other = (summary["best_policy"] + 1) % 4
    rival = launch.run([f"--train_dir={tmp_path}", "--experiment=nim", f"--opponent={other}",
                        "--max_num_episodes=100"], timeout=60, module="sf_core.enjoy")
    assert rival.returncode == 0, rival.stderr[-3000:]
    with open(tmp_path / "nim" / "eval_results.json") as f:
        assert 0.2 <= json.load(f)["win_rate"] <= 0.8  # two trained policies: neither dominates
    missing = launch.run([f"--train_dir={tmp_path}", "--experiment=nim", "--opponent=4"], timeout=60,
                         module="sf_core.enjoy")
    assert missing.returncode == 2 and "--opponent must be 'random' or a policy index below 4" in missing.stderr
