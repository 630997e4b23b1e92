"""Two-player games: the built-in race-to-21 env, and win rates between policies."""

import gymnasium as gym
import numpy as np
import pytest

from envs.multi_agent import is_multi_agent, num_agents
from envs.nim import Nim
from envs.registry import EnvContext, EnvRegistry, make_env, registry_snapshot
from sf_core.win_rates import WinRates

CTX = EnvContext(worker_index=-1, env_index=-1, seed=0)


def turn(obs: np.ndarray) -> bool:
    return bool(obs[-1])


def total_of(obs: np.ndarray) -> int:
    return int(np.argmax(obs[:-1]))


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
