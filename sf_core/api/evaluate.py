"""`evaluate_policy`: a policy's mean return over whole episodes, as Stable-Baselines3's helper of that name."""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from sf_core.api.policy import Policy
from sf_core.envs.multi_agent import is_multi_agent
from sf_core.evaluation.episodes import play_episodes


def evaluate_policy(policy: Policy, env: gym.Env | str | None = None, n_eval_episodes: int = 10,
                    deterministic: bool = True, seed: int | None = 0, return_episode_rewards: bool = False
                    ) -> tuple[float, float] | tuple[list[float], list[int]]:
    """(mean, std) of the returns of `n_eval_episodes` episodes, or with `return_episode_rewards` the returns and
    lengths themselves. `env`: a single-agent gymnasium env, a name `--env` takes, or by default the env the
    policy trained on, made as `sf_core.enjoy` makes it (whole episodes, raw rewards). Episode k resets with
    seed `seed + k` (None: unseeded)."""
    own = not isinstance(env, gym.Env)
    played = policy.make_env(env) if own else env
    try:
        if is_multi_agent(played):
            raise ValueError("evaluate_policy plays single-agent envs; `python -m sf_core.enjoy` plays a multi-agent "
                             "env in self-play, or against an opponent (--opponent)")
        episodes = list(play_episodes(played, policy.trained, n_eval_episodes, seed, deterministic))
    finally:
        if own:
            played.close()
    returns = [r for r, _ in episodes]
    if return_episode_rewards:
        return returns, [n for _, n in episodes]
    return float(np.mean(returns)), float(np.std(returns))
