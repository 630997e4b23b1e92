"""Which function builds an env for a given name.

Users call `register_env(name, factory)`. Names nobody registered go to a built-in env of this package
(`BUILTIN_ENVS`: `nim21`, envs/nim.py) or to an integration: `atari_*` names
and `ALE/...` ids to envs/atari.py (ale-py), `pettingzoo:<module>` names to envs/pettingzoo.py, the
MuJoCo v5 locomotion ids to envs/mujoco.py (`gymnasium.make`, with a tracking camera when rendering),
anything else to `gymnasium.make`.

A factory registered with `vectorized=True` builds a whole `gymnasium.vector.VectorEnv` instead:
`factory(name, cfg, ctx: VectorEnvContext)`; a rollout worker's split then steps it as one env of
`ctx.num_envs` sub-envs (--env_vectorization, envs/vector_backends.py), and `make` serves a vector env of one
through `VectorOfOne` (envs/vector_of_one.py) wherever one env is played at a time.

Worker processes do not inherit module globals under the `spawn` start method, so the runner takes a
snapshot of the registry (`registry_snapshot`) and ships it to every component; workers build envs
from that snapshot, never from the global. Factories travel as `sf_core.common.user_code.UserCode`, so a
lambda, a closure or a notebook's function works as well as a module-level function.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping

import gymnasium as gym
from gymnasium.vector import VectorEnv

from sf_core.envs.mujoco import is_mujoco_name, make_mujoco_env
from sf_core.envs.nim import make_nim
from sf_core.envs.vector_of_one import VectorOfOne

if TYPE_CHECKING:
    from sf_core.common.user_code import UserCode
    from sf_core.config import Config


@dataclass(frozen=True)
class EnvContext:
    """Where an env instance lives: lets a factory seed or configure per instance."""

    worker_index: int
    env_index: int  # global index over all workers
    seed: int | None
    render_mode: str | None = None  # "rgb_array" when evaluation records a video
    # True in sf_core.enjoy: integrations that shape training (Atari's episodic life and reward
    # clipping) then play whole episodes with raw rewards
    evaluation: bool = False
    # --env_service with named pools: one env per pool, each on a slot of it, for the factory to compose
    # the env being trained from (sf_core/service/service_set.py); None otherwise
    services: Mapping[str, gym.Env] | None = None


@dataclass(frozen=True)
class VectorEnvContext:
    """Where a vector env lives: the factory of a `vectorized=True` env gets this instead of an EnvContext.

    Its `num_envs` sub-envs are envs `first_env_index .. first_env_index + num_envs - 1` of the run (global
    indices, as EnvContext.env_index). The runner resets it with `reset(seed=s)`, an int: sub-env i should play
    seed `s + i` (gymnasium's SyncVectorEnv convention), which gives each sub-env the seed of the env it stands
    for; `seeds` lists those of the first reset, for a factory that seeds at construction."""

    worker_index: int
    first_env_index: int
    num_envs: int
    seeds: tuple[int, ...] | None
    render_mode: str | None = None
    evaluation: bool = False

    @property
    def env_indices(self) -> range:
        return range(self.first_env_index, self.first_env_index + self.num_envs)

    @classmethod
    def of_one(cls, ctx: EnvContext) -> VectorEnvContext:
        """The context of a vector env of one that stands for the env `ctx` describes."""
        return cls(ctx.worker_index, ctx.env_index, 1, None if ctx.seed is None else (ctx.seed,), ctx.render_mode,
                   ctx.evaluation)


EnvFactory = Callable[[str, Any, EnvContext], gym.Env]
VectorEnvFactory = Callable[[str, Any, VectorEnvContext], VectorEnv]


class EnvNotFoundError(ValueError):
    pass


class UnregisteredEnvError(EnvNotFoundError):
    """A name neither `register_env` (in this process) nor gymnasium knows: typically a custom env whose
    registering module was not imported (the command-line tools then say how: --env_module)."""


# Envs this package defines, by name. Looked up after user registrations, so a user may shadow one;
# module-level factories, so worker processes import them by name like any other module function.
BUILTIN_ENVS: dict[str, EnvFactory] = {
    "nim21": make_nim,  # race to 21, a two-player zero-sum game for self-play (envs/nim.py)
}


class EnvRegistry:
    def __init__(self, factories: Mapping[str, EnvFactory | VectorEnvFactory] | None = None,
                 vectorized: Iterable[str] = ()):
        self.factories: dict[str, UserCode] = {}
        self.vectorized: set[str] = set()  # names whose factory builds a VectorEnv
        for name, factory in (factories or {}).items():
            self.register(name, factory, vectorized=name in vectorized)

    def register(self, name: str, factory: EnvFactory | VectorEnvFactory, vectorized: bool = False) -> None:
        # imported here: sf_core's package imports this module, so a module-level import would be circular
        from sf_core.common.user_code import user_code

        if not callable(factory):
            raise TypeError(f"register_env({name!r}, ...): factory must be callable, got {type(factory)}")
        self.factories[name] = user_code(factory, f"the factory registered for env {name!r}")
        if vectorized:
            self.vectorized.add(name)
        else:
            self.vectorized.discard(name)

    def make_vector(self, name: str, cfg: Config, ctx: VectorEnvContext) -> VectorEnv:
        """The VectorEnv of a name registered with vectorized=True."""
        env = self.factories[name](name, cfg, ctx)
        if not isinstance(env, VectorEnv):
            raise ValueError(f"factory registered for {name!r} with vectorized=True returned {type(env).__name__}, "
                             f"not a gymnasium.vector.VectorEnv")
        if env.num_envs != ctx.num_envs:
            raise ValueError(f"factory registered for {name!r} returned a VectorEnv of {env.num_envs} envs; "
                             f"its context asked for {ctx.num_envs}")
        return env

    def make(self, name: str, cfg: Config, ctx: EnvContext) -> gym.Env:
        if name in self.vectorized:
            return VectorOfOne(self.make_vector(name, cfg, VectorEnvContext.of_one(ctx)))
        if name in self.factories:
            env = self.factories[name](name, cfg, ctx)
            if not isinstance(env, gym.Env):
                hint = (" (a PettingZoo env: wrap it in sf_core.envs.pettingzoo.PettingZooParallelEnv)"
                        if hasattr(env, "possible_agents") else "")
                raise ValueError(f"factory registered for {name!r} returned {type(env).__name__}, "
                                 f"not a gymnasium.Env{hint}")
            return env
        if name in BUILTIN_ENVS:
            return BUILTIN_ENVS[name](name, cfg, ctx)
        if name.startswith("atari_") or name.startswith("ALE/"):
            return _make_atari(name, cfg, ctx)
        if name.startswith("pettingzoo:"):
            return _make_pettingzoo(name, cfg, ctx)
        try:
            if is_mujoco_name(name):
                return make_mujoco_env(name, cfg, ctx)
            return gym.make(name, render_mode=ctx.render_mode) if ctx.render_mode else gym.make(name)
        except gym.error.Error as exc:
            if is_mujoco_name(name) and isinstance(exc, gym.error.DependencyNotInstalled):
                raise EnvNotFoundError(f"env {name!r} needs MuJoCo ({exc}): pip install -e '.[mujoco]'") from None
            known = ", ".join(sorted(self.factories)) or "none"
            raise UnregisteredEnvError(
                f"unknown env {name!r}: not registered with sf_core.register_env (registered: {known}) "
                f"and gymnasium says: {exc}"
            ) from None

    def hands_to_gymnasium(self, name: str) -> bool:
        """Whether `make` builds `name` with a plain `gymnasium.make(name)`: no registered factory, built-in env
        or integration (Atari, PettingZoo, MuJoCo) of this package shapes it."""
        return not (name in self.factories or name in BUILTIN_ENVS or name.startswith(("atari_", "ALE/"))
                    or name.startswith("pettingzoo:") or is_mujoco_name(name))

    def check_picklable(self) -> None:
        """Factories travel to worker processes by pickling (by value where need be); fail early, naming
        the one that cannot travel at all."""
        for factory in self.factories.values():
            factory.check()


def require_ale(name: str) -> None:
    """EnvNotFoundError, with the install command, where the Atari game `name` cannot be made: no ale-py."""
    try:
        import ale_py  # noqa: F401
    except ImportError as exc:
        raise EnvNotFoundError(
            f"env {name!r} is an Atari game, which needs ale-py ({exc}): pip install -e '.[atari]'"
        ) from None


def _make_atari(name: str, cfg: Config, ctx: EnvContext) -> gym.Env:
    """`atari_*` names and `ALE/...` ids: the Atari integration (envs/atari.py, needs ale-py)."""
    require_ale(name)
    from sf_core.envs.atari import make_atari_env

    try:
        return make_atari_env(name, cfg, ctx)
    except ValueError as exc:
        raise EnvNotFoundError(str(exc)) from None


def _make_pettingzoo(name: str, cfg: Config, ctx: EnvContext) -> gym.Env:
    """`pettingzoo:<module>`: that module's parallel env, adapted by envs/pettingzoo.py."""
    from sf_core.envs.pettingzoo import make_pettingzoo_env

    try:
        return make_pettingzoo_env(name, cfg, ctx)
    except ValueError as exc:
        raise EnvNotFoundError(str(exc)) from None


_REGISTRY = EnvRegistry()


def register_env(name: str, factory: EnvFactory | VectorEnvFactory, vectorized: bool = False) -> None:
    """Make `name` usable as `--env=name`. `factory(name, cfg, ctx)` returns a gymnasium.Env; with
    `vectorized=True`, `factory(name, cfg, ctx: VectorEnvContext)` returns a gymnasium.vector.VectorEnv of
    `ctx.num_envs` envs (docs/custom_env.md, "Vectorized envs")."""
    _REGISTRY.register(name, factory, vectorized)


def registry_snapshot(only: str | tuple[str, ...] | None = None) -> EnvRegistry:
    """An independent copy: later registrations do not change a run already started. With `only`,
    just that env's factory, or those envs' (what a run ships to its worker processes)."""
    if only is None:
        return EnvRegistry(_REGISTRY.factories, _REGISTRY.vectorized)
    names = {only} if isinstance(only, str) else set(only)
    return EnvRegistry({name: _REGISTRY.factories[name] for name in names if name in _REGISTRY.factories},
                       _REGISTRY.vectorized & names)


def make_env(name: str, cfg: Config, ctx: EnvContext, registry: EnvRegistry | None = None) -> gym.Env:
    return (registry or _REGISTRY).make(name, cfg, ctx)
