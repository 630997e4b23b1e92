"""A trained model acting in an env outside the rollout workers: `sf_core.enjoy`, `sf_core.evaluate` (through
sf_core/evaluation/policy.py's loader) and training's periodic evaluation (sf_core/sampling/periodic_evaluator.py).

It acts as the rollout workers do: observations packed by `ObsWriter` (Dict/Tuple spaces into one byte row), the
recurrent state carried from step to step, actions converted for `env.step`. The state lives in an
`EpisodeState`, not in the policy, so one policy (one copy of the weights) can serve many episodes at once: the
evaluator's task threads share it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import torch

from sf_core.algo.model import ActorCritic
from sf_core.algo.observations import ObsWriter, obs_storage
from sf_core.sampling.split_runner import env_action_converter


class EpisodeState:
    """What a recurrent policy remembers during one episode, one row per agent (zeros: nothing yet)."""

    def __init__(self, rnn: torch.Tensor):
        self.rnn = rnn  # [agents, rnn_state_size]

    def agent_done(self, agent: int) -> None:
        """That agent's episode ended (a multi-agent env goes on): its next one starts from zeros."""
        self.rnn[agent] = 0.0


class TrainedPolicy:
    """A loaded model acting in an env with the given spaces. Holds no per-episode state, so several
    threads may act with it at once, each with its own EpisodeState."""

    def __init__(self, model: ActorCritic, obs_space: gym.Space, action_space: gym.Space, deterministic: bool,
                 device: str = "cpu"):
        self.model, self.deterministic, self.device = model, deterministic, device
        self.writer = ObsWriter(obs_space)
        self.row_shape, self.row_dtype = obs_storage(obs_space)
        self.to_env_action = env_action_converter(action_space)

    def start_episode(self, agents: int = 1) -> EpisodeState:
        return EpisodeState(self.model.initial_state(agents, self.device))

    @torch.no_grad()
    def act(self, observations: Sequence[Any], episode: EpisodeState, deterministic: bool | None = None) -> list[Any]:
        """One env action per agent's observation; advances the episode's recurrent state. `deterministic`:
        the most likely action, or a sampled one (None: as the policy was made)."""
        rows = torch.zeros((len(observations), *self.row_shape), dtype=self.row_dtype)
        for i, obs in enumerate(observations):
            self.writer.write(obs, rows.numpy()[i])
        params, _, episode.rnn = self.model.step(rows.to(self.device), episode.rnn)
        dist = self.model.distribution(params)
        if deterministic is None:
            deterministic = self.deterministic
        actions = (dist.mode() if deterministic else dist.sample()).cpu().numpy()
        return [self.to_env_action(a) for a in actions]
