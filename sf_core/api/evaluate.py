"""`evaluate_policy`: a policy's mean return over whole episodes, as Stable-Baselines3's helper of that name."""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from sf_core.api.policy import Policy
from sf_core.sampling.episodes import play_episodes


def evaluate_policy(policy: Policy, env: gym.Env | str | None = None, n_eval_episodes: int = 10,
                    deterministic: bool = True, seed: int | None = 0, return_episode_rewards: bool = False
                    ) -> tuple[float, float] | tuple[list[float], list[int]]:
    """(mean, std) of the returns of `n_eval_episodes` episodes, or with `return_episode_rewards` the returns and
    lengths themselves. `env`: a gymnasium env, a name `--env` takes, or by default the env the policy trained on,
    made as `sf_core.enjoy` makes it (whole episodes, raw rewards); a multi-agent env plays in self-play, each
    agent's episode counting. Episode k of a single-agent env resets with seed `seed + k` (None: unseeded)."""
    own = not isinstance(env, gym.Env)
    played = policy.make_env(env) if own else env
    try:
        episodes = list(play_episodes(played, policy.trained, n_eval_episodes, seed, deterministic))
    finally:
        if own:
            played.close()
    returns = [e.ret for e in episodes]
    if return_episode_rewards:
        return returns, [e.length for e in episodes]
    return float(np.mean(returns)), float(np.std(returns))
