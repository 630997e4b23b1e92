"""Whole episodes played by a trained policy outside training: `sf_core.enjoy`, `evaluate_policy` and the periodic
evaluation (--eval_every_env_steps) all play them here."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import gymnasium as gym
import numpy as np

from sf_core.envs.multi_agent import as_multi_agent
from sf_core.sampling.split_runner import episode_outcome
from sf_core.sampling.trained_policy import TrainedPolicy


@dataclass(frozen=True)
class PlayedEpisode:
    ret: float
    length: int
    agent: int  # which agent of a multi-agent env (0 for a single-agent one)
    info: dict  # its last step's (the episode metrics, sf_core/sampling/episode_metrics.py)


def play_episodes(env: gym.Env, policy: TrainedPolicy, count: int, seed: int | None = 0,
                  deterministic: bool | None = None, before_step: Callable[[], None] | None = None,
                  stopping: Callable[[], bool] | None = None) -> Iterator[PlayedEpisode]:
    """`count` episodes, each as it ends. Every agent of a multi-agent env acts with the policy and each agent's
    episode counts (it resets itself; its first reset takes `seed`). A single-agent env plays through the
    multi-agent adapter, which resets it when an episode ends: episode k with seed `seed + k`. Returns and lengths are the env's own statistics where its info has
    them (Atari: whole games), as in training. `deterministic` as in TrainedPolicy.act; `before_step` runs before
    every step (a video takes its frame there); the episodes end early once `stopping()` is true."""
    env = as_multi_agent(env, reseed=True)
    obs, infos = env.reset(seed=seed)
    state = policy.start_episode(agents=len(obs))
    totals: np.ndarray = np.zeros(len(obs))
    steps: np.ndarray = np.zeros(len(obs), dtype=np.int64)
    played = 0
    while played < count and not (stopping is not None and stopping()):
        active = [info.get("is_active", True) for info in infos]
        if before_step is not None:
            before_step()
        obs, rewards, terminated, truncated, infos = env.step(policy.act(obs, state, deterministic))
        for i in np.flatnonzero(active):
            totals[i] += float(rewards[i])
            steps[i] += 1
            if not (terminated[i] or truncated[i]):
                continue
            outcome = episode_outcome(infos[i], float(totals[i]), int(steps[i]))
            totals[i], steps[i] = 0.0, 0
            state.agent_done(int(i))
            if outcome is not None and played < count:
                played += 1
                yield PlayedEpisode(outcome[0], outcome[1], int(i), infos[i])
