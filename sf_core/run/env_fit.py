"""Defaults fitted to the env's spaces, for an env no preset covers: applied under the user's flags, as a
preset is, and announced on the console.

`Config`'s defaults are Sample Factory's, sized for Atari: a 512x512 MLP at a learning rate of 1e-4 and one
epoch over 1024-sample minibatches. On a small vector env that learns several times slower than a 64x64 MLP at
1e-3 with 512-sample minibatches and two epochs (docs/results.md, "Defaults fitted to the env"), so an env
with a small vector observation and a few actions gets those. Image observations keep the conv defaults, and larger
spaces keep Sample Factory's: nothing measured here says what fits them better.

The spaces come from one instance of the env made while the flags are parsed (the runner makes one more to
read them again), so it is done only where that is cheap and safe: not with --env_service (the envs live in
servers), and not for an env a preset covers or points to (`parse_args` decides; --fit_defaults_to_env=False
turns it off).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from sf_core.config import Config
from sf_core.envs.registry import EnvContext, make_env

SMALL_OBSERVATION = 64  # numbers in a vector observation (CartPole: 4, Acrobot: 6; MuJoCo's Ant-v5: 105)
SMALL_ACTIONS = 16  # discrete choices (summed over a MultiDiscrete's dimensions), or dimensions of a Box

SMALL_VECTOR_ENV: dict[str, Any] = {
    "encoder_mlp_layers": [64, 64],
    "learning_rate": 1e-3,
    "batch_size": 512,
    "num_epochs": 2,
}


@dataclass(frozen=True)
class EnvFit:
    values: dict[str, Any]
    spaces: str  # what they were fitted to, for the console: "a vector observation of 4 numbers and 2 actions"


def fit_to_spaces(observation_space: gym.Space, action_space: gym.Space) -> EnvFit | None:
    """The defaults for an env of these (per-agent) spaces, or None where Sample Factory's stay."""
    numbers = vector_size(observation_space)
    actions = action_count(action_space)
    if numbers is None or actions is None or numbers > SMALL_OBSERVATION or actions > SMALL_ACTIONS:
        return None
    kind = "continuous action dimension" if isinstance(action_space, gym.spaces.Box) else "action"
    return EnvFit(dict(SMALL_VECTOR_ENV), f"a vector observation of {_count(numbers, 'number')} and "
                                          f"{_count(actions, kind)}")


def _count(n: int, thing: str) -> str:
    return f"{n} {thing}{'' if n == 1 else 's'}"


def vector_size(space: gym.Space) -> int | None:
    """Numbers the MLP encoder sees for an observation of `space`, or None if it holds an image (3 dims)."""
    if isinstance(space, gym.spaces.Dict):
        sizes = [vector_size(sub) for sub in space.spaces.values()]
    elif isinstance(space, gym.spaces.Tuple):
        sizes = [vector_size(sub) for sub in space.spaces]
    elif isinstance(space, gym.spaces.Box):
        return None if len(space.shape) == 3 else int(np.prod(space.shape, dtype=np.int64))
    else:
        return int(gym.spaces.flatdim(space))  # Discrete (one-hot) and MultiBinary leaves
    return None if None in sizes else sum(sizes)  # type: ignore[arg-type]


def action_count(space: gym.Space) -> int | None:
    """How many actions (or action dimensions) the policy chooses among; None for a space it cannot act in."""
    if isinstance(space, gym.spaces.Discrete):
        return int(space.n)
    if isinstance(space, gym.spaces.MultiDiscrete):
        return int(np.sum(space.nvec))
    if isinstance(space, gym.spaces.Box) and len(space.shape) == 1:
        return int(space.shape[0])
    return None


def probe_spaces(values: dict[str, Any]) -> tuple[gym.Space, gym.Space] | None:
    """The (per-agent) spaces of one instance of --env made here with these flag values, or None if it
    cannot be made here: the runner makes it again and reports why in its own words, with the traceback."""
    seed = values["seed"] if values["seed"] >= 0 else 0
    try:
        env = make_env(values["env"], Config(**values), EnvContext(worker_index=-1, env_index=-1, seed=seed))
    except Exception:  # noqa: BLE001 (any error of a user's factory: reported by the runner)
        return None
    try:
        return env.observation_space, env.action_space
    finally:
        env.close()
