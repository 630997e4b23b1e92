"""Whole episodes of a single-agent env played by a trained policy: `sf_core.enjoy`, `evaluate_policy` and the
periodic evaluation all play them this way."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import gymnasium as gym

from sf_core.evaluation.policy import TrainedPolicy


def play_episodes(env: gym.Env, policy: TrainedPolicy, count: int, seed: int | None = 0,
                  deterministic: bool | None = None, before_step: Callable[[], None] | None = None
                  ) -> Iterator[tuple[float, int]]:
    """(return, length) of each of `count` episodes, as each ends. Episode k resets with `seed + k` (None: the
    env's own sequence); `deterministic` as in TrainedPolicy.act; `before_step` runs before every step (a video
    takes its frame there)."""
    for k in range(count):
        obs, _ = env.reset(seed=None if seed is None else seed + k)
        state = policy.start_episode()
        total, length, done = 0.0, 0, False
        while not done:
            if before_step is not None:
                before_step()
            obs, reward, terminated, truncated, _ = env.step(policy.act([obs], state, deterministic)[0])
            total, length, done = total + float(reward), length + 1, bool(terminated or truncated)
        yield total, length
