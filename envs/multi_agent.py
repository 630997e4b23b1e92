"""The multi-agent env contract, and the adapter that lets a single-agent env follow it.

A multi-agent env is a `gymnasium.Env` with `is_multiagent = True` and `num_agents` agents that
share `observation_space` and `action_space` (the spaces of one agent). Every agent is a trajectory
of its own, acting with the one shared policy (self-play):

- `reset(seed=None, options=None) -> (obs, infos)`: `num_agents` observations and info dicts.
- `step(actions) -> (obs, rewards, terminated, truncated, infos)`: `actions` holds one action per
  agent; every return value holds one entry per agent.
- The env resets itself (auto-reset): when `terminated[i]` or `truncated[i]`, `obs[i]` is already
  the first observation of agent i's next episode. An agent cut by a time limit (`truncated[i]` and
  not `terminated[i]`) puts its last observation in `infos[i]["final_obs"]`: its value bootstraps
  the cut episode.
- `infos[i]["is_active"] = False` (returned by `reset` or `step`) says agent i has no observation to
  act on now, e.g. it finished early and waits for the others. Its next action is ignored, and that
  step is left out of training (the `inactive` mask) and of the episode statistics. An agent may go
  inactive only on the step that ends its episode (or at reset) and comes back at the start of a
  new one: a turn-based game should give waiting agents a no-op step instead.
- `infos[i]["episode_return"]` / `["episode_length"]` on the step that ends agent i's episode
  override its episode statistics, as for single-agent envs.
- `render()` draws the whole env (`render_mode="rgb_array"` for videos).

See docs/custom_env.md ("Multi-agent envs") for an example, and envs/pettingzoo.py for PettingZoo.
"""

from __future__ import annotations

from typing import Any, Sequence

import gymnasium as gym

from sf_core.envs.env_check import EnvContractError, reset_rule, step_rule


class MultiAgentEnv(gym.Env):
    """Base class for multi-agent envs: set `num_agents` and the per-agent spaces in `__init__`."""

    is_multiagent = True
    num_agents: int = 1


def is_multi_agent(env: gym.Env) -> bool:
    # gymnasium wrappers no longer forward unknown attributes: look at the innermost env as well
    return bool(getattr(env, "is_multiagent", False) or getattr(env.unwrapped, "is_multiagent", False))


def num_agents(env: gym.Env) -> int:
    if not is_multi_agent(env):
        return 1
    count = getattr(env, "num_agents", None) or getattr(env.unwrapped, "num_agents", None)
    if not isinstance(count, int) or count < 1:
        raise ValueError(f"multi-agent env {type(env).__name__} must set num_agents to a positive int, got {count!r}")
    return count


class SingleAgentAdapter:
    """A single-agent gymnasium env seen through the multi-agent contract (one agent, auto-reset),
    so the non-batched runner has one code path for every env. `reseed`: each automatic reset takes the seed
    after the last one (episode k of a reset with seed s plays seed s + k), as evaluation wants; otherwise it
    continues the env's own random sequence."""

    is_multiagent = True
    num_agents = 1

    def __init__(self, env: gym.Env, reseed: bool = False):
        self.env, self.reseed, self.seed = env, reseed, None
        self.observation_space, self.action_space = env.observation_space, env.action_space

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[list, list[dict]]:
        self.seed = seed
        obs, info = self._reset(seed=seed, options=options)
        return [obs], [info]

    def step(self, actions: Sequence[Any]) -> tuple[list, list[float], list[bool], list[bool], list[dict]]:
        result = self.env.step(actions[0])
        try:
            obs, reward, terminated, truncated, info = result
            if terminated or truncated:
                info = dict(info)  # the step's info (episode statistics) stays; the reset's is dropped
                if truncated and not terminated:
                    info["final_obs"] = obs
                obs, _ = self._reset(seed=self._next_seed())
        except (TypeError, ValueError):  # what the env returned does not unpack or test: say which rule it broke
            rule = step_rule(result, self.observation_space)
            if rule is None:
                raise
            raise EnvContractError(rule) from None
        return [obs], [reward], [terminated], [truncated], [info]

    def _next_seed(self) -> int | None:
        if not self.reseed or self.seed is None:
            return None
        self.seed += 1
        return self.seed

    def _reset(self, **kwargs: Any) -> tuple[Any, dict]:
        result = self.env.reset(**kwargs)
        if not isinstance(result, tuple) or len(result) != 2:  # a bare observation of 2 would unpack silently
            raise EnvContractError(str(reset_rule(result, self.observation_space)))
        return result

    def render(self) -> Any:
        return self.env.render()

    def close(self) -> None:
        self.env.close()


def as_multi_agent(env: gym.Env, reseed: bool = False):
    """The env itself if it follows the multi-agent contract, else the single-agent adapter (`reseed`: see there)."""
    return env if is_multi_agent(env) else SingleAgentAdapter(env, reseed)
