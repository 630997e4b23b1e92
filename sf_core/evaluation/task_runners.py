"""Task runners: what an evaluation task does with the env slots it leased.

A task names its runner (`"runner": "sim_with_reward"`, default `"episodes"`) and the pools it needs
(`"needs": ["sim", "reward"]`, default one pool, named after its env). The runner gets the leased envs,
one `gymnasium.Env` per pool name, the task (a dict: id, seed, episodes, options, any other field the task
line has, and `folder`: the task's own folder, empty at the start of each attempt, for whatever the task
leaves behind; sf_core/evaluation/task_folders.py) and the policy, and returns the episodes' returns and
lengths:

    from sf_core import register_task_runner

    def sim_with_reward(envs, task, policy):
        sim, reward_model = envs["sim"], envs["reward"]
        ...
        act = policy.start_episode("sim")       # the policy acts in the sim's spaces
        obs, _, terminated, truncated, _ = sim.step(act(obs))
        _, reward, *_ = reward_model.step(obs)  # the reward model scores what the policy did
        ...
        return returns, lengths

    register_task_runner("sim_with_reward", sim_with_reward)

A runner must let an env's exception through (or re-raise it): that is how a failed slot is noticed,
and the task retried on another one. Runners travel to worker processes as `UserCode` (by value if
need be), and `--env_module` imports the module that registers them in the coordinator.
"""

from __future__ import annotations

from typing import Any, Callable

import gymnasium as gym
import numpy as np

from sf_core.common.user_code import UserCode, user_code

DEFAULT_RUNNER = "episodes"

EpisodeActor = Callable[[Any], Any]  # observation -> action, for one episode
Actor = Callable[[np.random.Generator], EpisodeActor]  # starts an episode; the rng is the task's


class TaskPolicy:
    """The evaluated policy during one attempt of one task. `start_episode(pool)` begins an episode in
    that pool's env (its spaces; default: the task's first pool) and returns observation -> action.
    Random actions draw from a generator seeded by the task's seed, so an attempt retried on another
    slot acts as the first one did."""

    def __init__(self, actor_for: Callable[[str, gym.Env], Actor], envs: dict[str, gym.Env], seed: int | None):
        self.actor_for, self.envs = actor_for, envs
        self.rng = np.random.default_rng(seed)

    def start_episode(self, pool: str | None = None) -> EpisodeActor:
        name = next(iter(self.envs)) if pool is None else pool
        if name not in self.envs:
            raise KeyError(f"start_episode({pool!r}): this task leased {', '.join(self.envs)}")
        return self.actor_for(name, self.envs[name])(self.rng)


TaskRunner = Callable[[dict[str, gym.Env], dict, TaskPolicy], tuple[list[float], list[int]]]


def play_episodes(envs: dict[str, gym.Env], task: dict, policy: TaskPolicy) -> tuple[list[float], list[int]]:
    """The default runner: the task's episodes on its one env, episode k seeded seed + k."""
    (env,) = envs.values()
    seed, options = task.get("seed"), task.get("options")
    returns, lengths = [], []
    for episode in range(task["episodes"]):
        obs, _ = env.reset(seed=None if seed is None else seed + episode, options=options)
        act = policy.start_episode()
        total, length, done = 0.0, 0, False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(act(obs))
            total, length, done = total + float(reward), length + 1, terminated or truncated
        returns.append(total)
        lengths.append(length)
    return returns, lengths


_RUNNERS: dict[str, UserCode] = {}


def register_task_runner(name: str, fn: TaskRunner) -> None:
    """Make `name` usable as a task's `"runner"`: `fn(envs, task, policy) -> (returns, lengths)`."""
    if not isinstance(name, str) or not name:
        raise TypeError(f"register_task_runner: the name must be a non-empty string, got {name!r}")
    _RUNNERS[name] = user_code(fn, f"the task runner registered as {name!r}")


def runners_snapshot() -> dict[str, Callable]:
    """Every registered runner and the default one: what the coordinator ships to its workers."""
    return {DEFAULT_RUNNER: play_episodes, **_RUNNERS}
