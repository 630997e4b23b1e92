"""Which function builds an env for a given name.

Users call `register_env(name, factory)`. Names nobody registered go to a built-in env of this package
(`BUILTIN_ENVS`: `nim21`, envs/nim.py) or to an integration: `atari_*` names
and `ALE/...` ids to envs/atari.py (ale-py), `pettingzoo:<module>` names to envs/pettingzoo.py, the
MuJoCo v5 locomotion ids to envs/mujoco.py (`gymnasium.make`, with a tracking camera when rendering),
anything else to `gymnasium.make`.

Worker processes do not inherit module globals under the `spawn` start method, so the runner takes a
snapshot of the registry (`registry_snapshot`) and ships it to every component; workers build envs
from that snapshot, never from the global. Factories travel as `sf_core.common.user_code.UserCode`, so a
lambda, a closure or a notebook's function works as well as a module-level function.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping

import gymnasium as gym

from sf_core.envs.mujoco import is_mujoco_name, make_mujoco_env
from sf_core.envs.nim import make_nim

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


EnvFactory = Callable[[str, Any, EnvContext], gym.Env]


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
    def __init__(self, factories: Mapping[str, EnvFactory] | None = None):
        self.factories: dict[str, UserCode] = {}
        for name, factory in (factories or {}).items():
            self.register(name, factory)

    def register(self, name: str, factory: EnvFactory) -> None:
        # imported here: sf_core's package imports this module, so a module-level import would be circular
        from sf_core.common.user_code import user_code

        if not callable(factory):
            raise TypeError(f"register_env({name!r}, ...): factory must be callable, got {type(factory)}")
        self.factories[name] = user_code(factory, f"the factory registered for env {name!r}")

    def make(self, name: str, cfg: Config, ctx: EnvContext) -> gym.Env:
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

    def check_picklable(self) -> None:
        """Factories travel to worker processes by pickling (by value where need be); fail early, naming
        the one that cannot travel at all."""
        for factory in self.factories.values():
            factory.check()


def _make_atari(name: str, cfg: Config, ctx: EnvContext) -> gym.Env:
    """`atari_*` names and `ALE/...` ids: the Atari integration (envs/atari.py, needs ale-py)."""
    try:
        import ale_py  # noqa: F401
    except ImportError as exc:
        raise EnvNotFoundError(
            f"env {name!r} is an Atari game, which needs ale-py ({exc}): pip install -e '.[atari]'"
        ) from None
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


def register_env(name: str, factory: EnvFactory) -> None:
    """Make `name` usable as `--env=name`. `factory(name, cfg, ctx)` returns a gymnasium.Env."""
    _REGISTRY.register(name, factory)


def registry_snapshot(only: str | None = None) -> EnvRegistry:
    """An independent copy: later registrations do not change a run already started. With `only`,
    just that env's factory (what a run ships to its worker processes)."""
    if only is None:
        return EnvRegistry(_REGISTRY.factories)
    return EnvRegistry({only: _REGISTRY.factories[only]} if only in _REGISTRY.factories else {})


def make_env(name: str, cfg: Config, ctx: EnvContext, registry: EnvRegistry | None = None) -> gym.Env:
    return (registry or _REGISTRY).make(name, cfg, ctx)
