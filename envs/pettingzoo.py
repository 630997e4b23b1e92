"""PettingZoo parallel envs as sf_core multi-agent envs (extra `multiagent`: pip install -e '.[multiagent]').

`PettingZooParallelEnv(env)` wraps a `pettingzoo.ParallelEnv` whose agents share one observation
space and one action space into the contract of envs/multi_agent.py:

- Agent i is `env.possible_agents[i]`: a fixed row per agent, whoever is alive.
- Agents that finish early: PettingZoo drops an agent from `env.agents` once it is terminated or
  truncated, while the others play on. The adapter reports the agent's end on that step and marks
  it inactive (`is_active=False`, observation zeros, its actions are not passed to the env) until
  the episode of the whole env ends; its rows are then left out of training. Agents that appear
  later than reset (not yet in `env.agents`) are inactive until they do.
- When no agent is left the adapter resets the env itself (auto-reset); an agent cut by
  truncation hands its last observation over as `infos[i]["final_obs"]`.
- `Discrete` observations become one-hot float vectors (the policy's encoders take `Box`es);
  other spaces pass through unchanged.
- `render()` is the PettingZoo env's: make it with `render_mode="rgb_array"` for videos.

`--env=pettingzoo:<module>` (e.g. `pettingzoo:pettingzoo.classic.rps_v2`) needs no registration:
`make_pettingzoo_env` imports the module and calls its `parallel_env(render_mode=...)`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Sequence

import gymnasium as gym
import numpy as np

from sf_core.envs.multi_agent import MultiAgentEnv

if TYPE_CHECKING:
    from sf_core.config import Config

PREFIX = "pettingzoo:"


class PettingZooParallelEnv(MultiAgentEnv):
    def __init__(self, env: Any):
        self.env = env
        self.agent_ids = list(env.possible_agents)
        self.num_agents = len(self.agent_ids)
        obs_space = _same_space(env.observation_space, self.agent_ids, "observation")
        self.action_space = _same_space(env.action_space, self.agent_ids, "action")
        self.one_hot = obs_space.n if isinstance(obs_space, gym.spaces.Discrete) else None
        self.obs_start = int(obs_space.start) if self.one_hot else 0
        self.observation_space = (gym.spaces.Box(0.0, 1.0, (self.one_hot,), np.float32) if self.one_hot
                                  else obs_space)
        self.render_mode = getattr(env, "render_mode", None)
        self.metadata = dict(getattr(env, "metadata", {}) or {})

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[list, list[dict]]:
        obs, infos = self.env.reset(seed=seed, options=options)
        alive = set(self.env.agents)
        return ([self._obs(obs, agent, agent in alive) for agent in self.agent_ids],
                [self._info(infos, agent, agent in alive) for agent in self.agent_ids])

    def step(self, actions: Sequence[Any]) -> tuple[list, list[float], list[bool], list[bool], list[dict]]:
        acting = list(self.env.agents)
        obs, rewards, terms, truncs, infos = self.env.step(
            {agent: actions[i] for i, agent in enumerate(self.agent_ids) if agent in acting})
        ended = {agent for agent in acting if terms.get(agent, False) or truncs.get(agent, False)}
        finals = {agent: self._obs(obs, agent, True) for agent in ended if not terms.get(agent, False)}
        if not self.env.agents:  # everyone is done: start the next episode (the contract's auto-reset)
            obs, infos = self.env.reset()
        alive = set(self.env.agents)
        out_infos = []
        for agent in self.agent_ids:
            info = self._info(infos, agent, agent in alive)
            if agent in finals:
                info["final_obs"] = finals[agent]
            out_infos.append(info)
        return ([self._obs(obs, agent, agent in alive) for agent in self.agent_ids],
                [float(rewards.get(agent, 0.0)) for agent in self.agent_ids],
                [bool(terms.get(agent, False)) for agent in self.agent_ids],
                [bool(truncs.get(agent, False)) and not terms.get(agent, False) for agent in self.agent_ids],
                out_infos)

    def _obs(self, obs: dict, agent: str, alive: bool) -> np.ndarray:
        if not alive or agent not in obs:
            return np.zeros(self.observation_space.shape, self.observation_space.dtype)
        if self.one_hot:
            one_hot = np.zeros(self.one_hot, np.float32)
            one_hot[int(obs[agent]) - self.obs_start] = 1.0
            return one_hot
        return obs[agent]

    @staticmethod
    def _info(infos: dict, agent: str, alive: bool) -> dict:
        info = dict(infos.get(agent, {}) or {})
        info["is_active"] = alive
        return info

    def render(self) -> Any:
        return self.env.render()

    def close(self) -> None:
        self.env.close()


def _same_space(space_of, agents: list[str], kind: str) -> gym.Space:
    spaces = [space_of(agent) for agent in agents]
    if any(space != spaces[0] for space in spaces[1:]):
        raise ValueError(f"PettingZoo env with different {kind} spaces per agent ({dict(zip(agents, spaces))}): "
                         f"one shared policy needs the same spaces for every agent")
    return spaces[0]


def make_pettingzoo_env(name: str, cfg: Config, ctx: Any) -> PettingZooParallelEnv:
    """`pettingzoo:<module>`: the module's `parallel_env()`, rendering as the context asks."""
    module_name = name[len(PREFIX):]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"env {name!r}: cannot import {module_name!r} ({exc}); install pettingzoo with the "
                         f"env's extra, e.g. pip install -e '.[multiagent]'") from None
    if not hasattr(module, "parallel_env"):
        raise ValueError(f"env {name!r}: module {module_name!r} has no parallel_env()")
    kwargs = {"render_mode": ctx.render_mode} if ctx.render_mode else {}
    return PettingZooParallelEnv(module.parallel_env(**kwargs))
