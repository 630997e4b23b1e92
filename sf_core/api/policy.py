"""A trained policy in one's own loop: `load_policy(...)` and `Policy.predict(obs, state, episode_start,
deterministic)`, with Stable-Baselines3's signature."""

from __future__ import annotations

import os
from typing import Any

import gymnasium as gym
import numpy as np

from sf_core.cli import import_experiment_modules
from sf_core.config import Config
from sf_core.envs.registry import EnvContext, registry_snapshot
from sf_core.evaluation.policy import EpisodeState, PolicyCheckpoint, TrainedPolicy, load_checkpoint


class Policy:
    """A checkpoint's policy, acting in an env with the spaces it was trained on. `predict` takes one
    observation, or a batch of them along a leading axis (a vector env's, or one per agent of a multi-agent env)."""

    def __init__(self, loaded: PolicyCheckpoint, observation_space: gym.Space, action_space: gym.Space,
                 device: str = "cpu"):
        self.checkpoint = loaded
        self.observation_space, self.action_space = observation_space, action_space
        self.trained: TrainedPolicy = loaded.policy(observation_space, action_space, deterministic=False,
                                                    device=device)

    @property
    def config(self) -> Config:
        """The flags it was trained with (config.json)."""
        return self.checkpoint.cfg

    def predict(self, observation: Any, state: EpisodeState | None = None, episode_start: Any = None,
                deterministic: bool = False) -> tuple[Any, EpisodeState]:
        """The action for `observation` (an array of actions for a batch), and the recurrent state to pass back
        with the next observation of the same episode(s). `episode_start`: one flag per observation, True
        where an episode begins (its state starts from zeros). Without `state`, every episode starts here."""
        observations, batched = split_batch(observation, self.observation_space)
        if state is None:
            state = self.trained.start_episode(len(observations))
        elif state.rnn.shape[0] != len(observations):
            raise ValueError(f"predict: the state is for {state.rnn.shape[0]} observations, got {len(observations)}")
        if episode_start is not None:
            for row in np.flatnonzero(np.atleast_1d(episode_start)):
                state.agent_done(int(row))
        actions = self.trained.act(observations, state, deterministic)
        return (_stack(actions) if batched else actions[0]), state

    def make_env(self, env: str | None = None) -> gym.Env:
        """An env to evaluate in: `env` (a name `--env` takes), by default the one it trained on, made as
        `sf_core.enjoy` makes it (whole episodes, raw rewards)."""
        return make_evaluation_env(self.config, env)


def load_policy(path: str | os.PathLike, checkpoint: str = "best", device: str = "cpu",
                env: gym.Env | str | None = None, policy_index: int | None = None) -> Policy:
    """The policy of experiment folder `path` (checkpoint `best`, falling back to the latest, or `latest`), or of
    the checkpoint file `path`. Its spaces come from `env` (an env, or a name), by default from one env made as it
    trained; the modules that registered a custom env are imported again (config.json's --env_module), so an env
    registered in the training script itself must be registered before this call."""
    path = os.fspath(path)
    experiment, which = path, checkpoint
    if os.path.isfile(path):  # {experiment}/checkpoint[_pK]/file.pt
        experiment, which = os.path.dirname(os.path.dirname(os.path.abspath(path))), path
    import_experiment_modules(None, experiment)
    loaded = load_checkpoint(experiment, which, device, policy_index)
    if isinstance(env, gym.Env):
        return Policy(loaded, env.observation_space, env.action_space, device)
    probe = make_evaluation_env(loaded.cfg, env)
    try:
        return Policy(loaded, probe.observation_space, probe.action_space, device)
    finally:
        probe.close()


def make_evaluation_env(cfg: Config, env: str | None = None) -> gym.Env:
    """Env `env` (default: the one `cfg` trained on) as `sf_core.enjoy` makes it: whole episodes, raw rewards."""
    context = EnvContext(worker_index=-1, env_index=0, seed=0, evaluation=True)
    return registry_snapshot().make(env or cfg.env, cfg, context)


def split_batch(observation: Any, space: gym.Space) -> tuple[list[Any], bool]:
    """One observation of `space` as a list of one, or a batch (leading axis) as a list of observations."""
    if not _is_batch(observation, space):
        return [observation], False
    if isinstance(space, gym.spaces.Dict) and isinstance(observation, dict):  # a dict of stacked fields
        n = len(next(iter(observation.values())))
        return [{key: value[i] for key, value in observation.items()} for i in range(n)], True
    return list(observation), True


def _is_batch(observation: Any, space: gym.Space) -> bool:
    if isinstance(observation, list) and isinstance(space, (gym.spaces.Dict, gym.spaces.Tuple)):
        return True  # a list of structured observations (a tuple observation is a tuple)
    if isinstance(space, gym.spaces.Dict):
        key = next(iter(space.spaces))
        return _is_batch(observation[key], space[key])
    if isinstance(space, gym.spaces.Tuple):
        return False
    extra = np.ndim(observation) - len(space.shape or ())
    if extra not in (0, 1):
        raise ValueError(f"predict: an observation of shape {np.shape(observation)} is neither one observation of "
                         f"{space} nor a batch of them")
    return extra == 1


def _stack(actions: list[Any]) -> Any:
    try:
        return np.stack([np.asarray(a) for a in actions])
    except ValueError:  # actions of another shape each (a tuple space): as a list
        return actions
