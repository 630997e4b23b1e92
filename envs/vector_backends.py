"""Natively vectorized envs: who can build one `gymnasium.vector.VectorEnv` for a rollout worker's split.

A split of `envs_per_split` envs is normally that many gymnasium envs, stepped one Python call each. A backend
builds the split as one VectorEnv instead, stepped with one call (sf_core/sampling/native_vector_runner.py).
--env_vectorization chooses:

- `none`: one gymnasium env per env (the path every env can take);
- `gymnasium`: an id registered with gymnasium with a `vector_entry_point` (CartPole-v0/v1), made with
  `gymnasium.make_vec(id, num_envs=N, vectorization_mode="vector_entry_point")` and the id's registered kwargs
  (its max_episode_steps included); ids this package shapes itself (Atari, MuJoCo, registered factories) are not
  served here;
- `user`: a factory registered with `register_env(name, factory, vectorized=True)` (envs/registry.py,
  `VectorEnvContext`);
- `ale`: ale-py's AtariVectorEnv for the Atari names envs/atari.py serves, preprocessed as it does
  (envs/atari_vector.py);
- `mujoco`: the MuJoCo ids with a batched step of their own (the v5 locomotion ids): gymnasium's env objects,
  their physics stepped one by one and the observations, rewards and terminations computed for the split at once,
  equal to gymnasium's (envs/mujoco_vector.py);
- `auto` (the default): the first backend of `BACKENDS` that serves the env and that `auto` may pick, else
  `none`. `ale` is not one of those yet: `auto` keeps Atari on the per-env path until the vector env is
  measured faster there.

Each backend is a `VectorBackend`; another (EnvPool) is one more subclass in `BACKENDS`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

import gymnasium as gym
from gymnasium.vector import VectorEnv

from sf_core.config import ConfigError, register_check
from sf_core.envs.atari import ale_id
from sf_core.envs.atari_vector import is_atari_name, make_atari_vector_env
from sf_core.envs import mujoco_vector
from sf_core.envs.registry import (EnvContext, EnvNotFoundError, EnvRegistry, VectorEnvContext, registry_snapshot,
                                   require_ale)
from sf_core.envs.vector_of_one import VectorOfOne

if TYPE_CHECKING:
    from sf_core.config import Config

AUTO, NONE = "auto", "none"


class VectorBackend:
    """Builds the VectorEnv of a split for the envs it `supports`."""

    name = ""
    # the envs this backend serves, in words ("--env_vectorization=NAME ... serves <this>")
    serves = ""
    # whether --env_vectorization=auto may pick it (else only by name)
    auto = True

    def cores_per_worker(self, envs_per_worker: int) -> int:
        """Cores the machine fit (sf_core/machine/fit.py) gives each rollout worker of this many envs whose splits
        this backend builds, where nobody chose --num_workers: one, as for envs stepped one by one."""
        return 1

    def supports(self, env_name: str, registry: EnvRegistry) -> bool:
        raise NotImplementedError

    def make(self, env_name: str, cfg: Config, ctx: VectorEnvContext, registry: EnvRegistry) -> VectorEnv:
        raise NotImplementedError


class GymnasiumBackend(VectorBackend):
    name = "gymnasium"
    serves = "gymnasium ids registered with a vector_entry_point, such as CartPole-v1"

    def cores_per_worker(self, envs_per_worker: int) -> int:
        """Two from 256 envs a worker: one numpy call steps a whole split, so a large worker mostly waits for its
        actions, and the core it leaves serves inference and the learner; with fewer envs two workers were faster
        (the sweep in docs/performance.md, "Natively vectorized envs")."""
        return 2 if envs_per_worker >= 256 else 1

    def supports(self, env_name: str, registry: EnvRegistry) -> bool:
        spec = gym.registry.get(env_name)
        return spec is not None and spec.vector_entry_point is not None and registry.hands_to_gymnasium(env_name)

    def make(self, env_name: str, cfg: Config, ctx: VectorEnvContext, registry: EnvRegistry) -> VectorEnv:
        # the same kwargs as the per-env path's gymnasium.make(env_name): render_mode only when rendering
        kwargs = {"render_mode": ctx.render_mode} if ctx.render_mode else {}
        return gym.make_vec(env_name, num_envs=ctx.num_envs, vectorization_mode="vector_entry_point", **kwargs)


class UserBackend(VectorBackend):
    name = "user"
    serves = "envs registered with register_env(name, factory, vectorized=True)"

    def supports(self, env_name: str, registry: EnvRegistry) -> bool:
        return env_name in registry.vectorized

    def make(self, env_name: str, cfg: Config, ctx: VectorEnvContext, registry: EnvRegistry) -> VectorEnv:
        return registry.make_vector(env_name, cfg, ctx)


class AleVectorBackend(VectorBackend):
    name = "ale"
    serves = "atari_* names and ALE/... ids that no registered factory shapes"
    auto = False  # not until it is measured faster than the per-env path (issue 38)

    def supports(self, env_name: str, registry: EnvRegistry) -> bool:
        # the game itself is resolved in make(), which names an unknown one as the per-env path does
        return is_atari_name(env_name) and env_name not in registry.factories

    def make(self, env_name: str, cfg: Config, ctx: VectorEnvContext, registry: EnvRegistry) -> VectorEnv:
        require_ale(env_name)
        try:
            ale_id(env_name)  # an unknown game, as the per-env path names it
        except ValueError as exc:
            raise EnvNotFoundError(str(exc)) from None
        return make_atari_vector_env(env_name, cfg, ctx)


class MujocoBackend(VectorBackend):
    name = "mujoco"
    serves = (f"the MuJoCo ids with a batched step ({', '.join(mujoco_vector.KINDS)}) that no registered factory "
              f"shapes, with the [mujoco] extra installed")

    def supports(self, env_name: str, registry: EnvRegistry) -> bool:
        return (env_name in mujoco_vector.KINDS and mujoco_vector.available() and env_name not in registry.factories
                and env_name not in registry.vectorized)

    def make(self, env_name: str, cfg: Config, ctx: VectorEnvContext, registry: EnvRegistry) -> VectorEnv:
        return mujoco_vector.make_mujoco_vector_env(env_name, ctx.num_envs, ctx.render_mode)


# in the order `auto` tries them: a user's own vector env first, since it registered it for this run
BACKENDS: tuple[VectorBackend, ...] = (UserBackend(), GymnasiumBackend(), AleVectorBackend(), MujocoBackend())
CHOICES = (AUTO, NONE, *(backend.name for backend in BACKENDS))


@register_check
def check_vectorization(cfg: Config) -> None:
    if cfg.env_vectorization not in (AUTO, NONE) and not cfg.batched_sampling:
        raise ConfigError(f"--env_vectorization={cfg.env_vectorization} steps each split's envs as one vector env, "
                          f"which --batched_sampling=False (each env stepped on its own) rules out: use "
                          f"--env_vectorization=none or auto")


def vector_backend(cfg: Config, registry: EnvRegistry) -> VectorBackend | None:
    """The backend that builds the run's splits (None: one gymnasium env per env), as --env_vectorization says.
    ConfigError, in one line, where the backend asked for cannot serve the env. (With --env_service no split
    makes envs at all: sf_core/service/endpoints.py refuses a backend asked for by name.)"""
    return _backend(cfg.env_vectorization, cfg.batched_sampling, cfg.env, registry)


def _backend(choice: str, batched: bool, env: str, registry: EnvRegistry) -> VectorBackend | None:
    if choice == NONE or (choice == AUTO and not batched):
        return None
    if choice == AUTO:
        return next((b for b in BACKENDS if b.auto and b.supports(env, registry)), None)
    backend = next(b for b in BACKENDS if b.name == choice)
    if not backend.supports(env, registry):
        raise ConfigError(f"--env_vectorization={choice} cannot serve env {env!r}: it serves {backend.serves}; "
                          f"--env_vectorization=none steps one env at a time")
    return backend


def planned_backend(values: Mapping[str, Any]) -> VectorBackend | None:
    """The backend a run with these flag values (before its Config exists) would build its splits with: what
    presets and the machine fit size the workers for. None where envs are served (--env_service) or a backend asked
    for cannot serve the env (the flag checks say so, later)."""
    if values.get("env_service") or not values.get("env"):
        return None
    try:
        return _backend(values["env_vectorization"], values["batched_sampling"], values["env"],
                        registry_snapshot(only=values["env"]))
    except ConfigError:
        return None


def probe_env(cfg: Config, registry: EnvRegistry, ctx: EnvContext, backend: VectorBackend | None) -> gym.Env:
    """One env of the kind the run trains on, for the runner to read its spaces and check it: where a `backend`
    builds the splits, a vector env of one from it, whose spaces are its single_* spaces."""
    if backend is None:
        return registry.make(cfg.env, cfg, ctx)
    return VectorOfOne(backend.make(cfg.env, cfg, VectorEnvContext.of_one(ctx), registry))
