"""Two-player games: the built-in race-to-21 env."""

import gymnasium as gym
import numpy as np
import pytest

from envs.multi_agent import is_multi_agent, num_agents
from envs.nim import Nim
from envs.registry import EnvContext, EnvRegistry, make_env, registry_snapshot

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
