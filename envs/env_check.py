"""The env contract, checked: one reset and one step of the env the runner probes, and the same rules
to name what a rollout worker's env returned when storing it failed.

A single-agent env keeps the gymnasium API; a multi-agent env (envs/multi_agent.py) the multi-agent
contract, whose values hold one entry per agent. What is checked:

- `observation_space` and `action_space` are gymnasium spaces (of kinds sf_core supports: the caller
  passes that check, which lives with the model);
- `reset(seed=...)` returns a tuple `(obs, info)`, `info` a dict;
- `step(action)` returns a tuple `(obs, reward, terminated, truncated, info)`;
- every observation conforms to the observation space: shape, and a dtype that stores without losing
  its meaning (a float64 observation of a float32 Box is fine; an int64 one is cast, with a warning; a
  float one of a uint8 Box would be truncated, an error);
- a reward is a real scalar (a python number, a numpy scalar or a 0-d array), terminated and truncated
  are bools (numpy bools too), an info is a dict.

Every rule returns what broke it as a sentence (None when the value keeps it), so the runner's check and
a worker's diagnosis after a failed write print the same words: `EnvContractError` turns it into one line,
`env 'Broken-v0' broke the gymnasium API: reset() must return (obs, info), got a numpy.ndarray of shape (2,)`.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Mapping
from typing import Any, Callable

import gymnasium as gym
import numpy as np

GYMNASIUM_API = "the gymnasium API"
MULTI_AGENT_CONTRACT = "the multi-agent env contract (envs/multi_agent.py)"
SPACES = "sf_core's env contract"
STEP_FIELDS = "(obs, reward, terminated, truncated, info)"


class EnvContractError(Exception):
    """An env that broke its contract: one line naming the env (`where`, once known) and the rule.

    Not a ValueError: the runner turns those into setup errors (exit code 1), while a broken contract found
    before training is exit code 2, and one found by a worker is printed without a traceback."""

    def __init__(self, rule: str, where: str = "an env", contract: str = GYMNASIUM_API):
        super().__init__(f"{where} broke {contract}: {rule}")
        self.rule, self.where, self.contract = rule, where, contract

    def named(self, where: str) -> EnvContractError:
        """The same error, naming the env instance (a worker knows its index, the env itself does not)."""
        return EnvContractError(self.rule, where, self.contract)

    def __reduce__(self):
        return EnvContractError, (self.rule, self.where, self.contract)


class EnvCheckError(RuntimeError):
    """The env raised while it was checked (its own error is the cause, with its traceback). Not a ValueError,
    which the runner would shorten to its message."""


def check_env(env: gym.Env, name: str, seed: int | None, agents: int | None = None,
              supported: Callable[[gym.Space, gym.Space], None] | None = None) -> list[str]:
    """Check `env` with one reset and one step; raise EnvContractError naming the first rule it breaks.
    `agents`: None for a single-agent env, else the number of agents of a multi-agent env. `supported(obs_space,
    action_space)` raises ValueError for spaces sf_core cannot train on. Returns warnings (observations that are
    cast on their way into the buffers). The env is left stepped once: check an env made for the purpose (the
    runner's probe env, closed afterwards)."""
    where = f"env {name!r}"
    contract = GYMNASIUM_API if agents is None else MULTI_AGENT_CONTRACT
    rule = (space_rule(env.observation_space, "observation_space") or space_rule(env.action_space, "action_space")
            or _reset_signature_rule(env))
    if rule is not None:
        raise EnvContractError(rule, where, contract)
    if supported is not None:
        try:
            supported(env.observation_space, env.action_space)
        except ValueError as exc:
            raise EnvContractError(str(exc), where, SPACES) from None
    notes: list[str] = []
    rule = reset_rule(_returned(env, "reset", seed, agents, where, contract), env.observation_space, agents, notes)
    if rule is None:
        rule = step_rule(_returned(env, "step", seed, agents, where, contract), env.observation_space, agents, notes)
    if rule is not None:
        raise EnvContractError(rule, where, contract)
    return [f"{where}: {note}" for note in dict.fromkeys(notes)]


def _returned(env: gym.Env, call: str, seed: int | None, agents: int | None, where: str, contract: str) -> Any:
    """What `env.reset(seed=seed)` or `env.step(<a sampled action>)` returns. Where a gymnasium wrapper raises
    on what the env under it returned, the rule that return broke, if any; else the env's own error."""
    try:
        return env.reset(seed=seed) if call == "reset" else env.step(sample_action(env, agents))
    except Exception as exc:  # noqa: BLE001 - re-raised unless the env under the wrappers explains it
        rule = _rule_under_wrappers(env, call, seed, agents, exc)
        if rule is not None:
            raise EnvContractError(rule, where, contract) from exc
        raise EnvCheckError(f"{where} raised in {call}() when the runner checked it (--check_env=False skips the "
                            f"check): {type(exc).__name__}: {exc}") from exc


def _reset_signature_rule(env: gym.Env) -> str | None:
    """sf_core seeds each env through reset(seed=...): an old-style reset() without it fails on the first call."""
    try:
        params = inspect.signature(env.reset).parameters.values()
    except (TypeError, ValueError):  # a builtin or an object inspect cannot read: the call itself will tell
        return None
    if any(p.name == "seed" or p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return "reset() must take a seed keyword argument: reset(self, *, seed=None, options=None)"


def sample_action(env: gym.Env, agents: int | None) -> Any:
    """A random action (one per agent for a multi-agent env), drawn from a copy of the action space seeded
    here: the env's own space and its generator stay as they were (a class-level space may be shared)."""
    space = copy.deepcopy(env.action_space)
    space.seed(0)
    return space.sample() if agents is None else [space.sample() for _ in range(agents)]


def _rule_under_wrappers(env: gym.Env, call: str, seed: int | None, agents: int | None,
                         exc: Exception) -> str | None:
    """A gymnasium wrapper (TimeLimit, the passive checker) raises on a broken return before the check sees it:
    ask the innermost env the same thing, and say what it returned. Only after a failure: this resets or steps
    the inner env once more."""
    inner = env.unwrapped
    if inner is env:
        return None
    try:
        if call == "reset":
            rule = reset_rule(inner.reset(seed=seed), inner.observation_space, agents, [])
        else:
            rule = step_rule(inner.step(sample_action(inner, agents)), inner.observation_space, agents, [])
    except Exception:  # noqa: BLE001 - the inner env fails too: the wrapper's error is the one to show
        return None
    return None if rule is None else f"{rule} (seen under its wrappers, which raised {type(exc).__name__})"


# ---------------------------------------------------------------- rules: what was returned, in words
def space_rule(space: Any, attribute: str) -> str | None:
    if isinstance(space, gym.spaces.Space):
        return None
    old_gym = type(space).__module__.split(".")[0] == "gym"
    return (f"{attribute} must be a gymnasium.spaces.Space, got {describe(space)}"
            + (" (a space of the old gym package: build it with gymnasium.spaces)" if old_gym else ""))


def reset_rule(result: Any, space: gym.Space, agents: int | None = None, notes: list[str] | None = None) -> str | None:
    """What is wrong with what reset() returned (None if nothing); `agents`: a multi-agent env's."""
    if not isinstance(result, tuple) or len(result) != 2:
        return f"reset() must return (obs, info), got {describe(result)}"
    obs, info = result
    if agents is None:
        if not isinstance(info, dict):
            return f"reset() must return (obs, info) with info a dict, got an info that is {describe(info)}"
        return observation_rule("reset", obs, space, notes)
    return (_per_agent("reset", ("observations", "infos"), result, agents)
            or _agents_rule("reset", obs, info, space, notes))


def step_rule(result: Any, space: gym.Space, agents: int | None = None, notes: list[str] | None = None) -> str | None:
    """What is wrong with what step() returned (None if nothing); `agents`: a multi-agent env's."""
    if not isinstance(result, tuple) or len(result) != 5:
        old = (" (the old gym API: return terminated and truncated instead of done)"
               if isinstance(result, tuple) and len(result) == 4 else "")
        return f"step() must return {STEP_FIELDS}, got {describe(result)}{old}"
    if agents is not None:
        return (_per_agent("step", ("observations", "rewards", "terminated flags", "truncated flags", "infos"),
                           result, agents)
                or _agents_rule("step", result[0], result[4], space, notes, result[1:4]))
    obs, reward, terminated, truncated, info = result
    return (scalar_rule(reward) or flag_rule("terminated", terminated) or flag_rule("truncated", truncated)
            or (None if isinstance(info, dict) else f"step() must return an info that is a dict, got {describe(info)}")
            or observation_rule("step", obs, space, notes))


def scalar_rule(reward: Any, agent: str = "") -> str | None:
    if np.ndim(reward) == 0 and np.asarray(reward).dtype.kind in "biuf":
        return None
    return (f"step() must return a reward{agent} that is a real scalar (a python number or a numpy scalar), "
            f"got {describe(reward)}")


def flag_rule(name: str, flag: Any, agent: str = "") -> str | None:
    if isinstance(flag, (bool, np.bool_)) or (isinstance(flag, np.ndarray) and flag.shape == () and flag.dtype == bool):
        return None
    return f"step() must return {name}{agent} as a bool (numpy bools too), got {describe(flag)}"


def _per_agent(call: str, names: tuple[str, ...], values: tuple, agents: int) -> str | None:
    """Every value a multi-agent env returns holds one entry per agent."""
    for name, value in zip(names, values):
        if isinstance(value, (str, bytes, Mapping)) or not hasattr(value, "__len__") or len(value) != agents:
            return f"{call}() must return {name} with one entry per agent ({agents}), got {describe(value)}"
    return None


def _agents_rule(call: str, obs: Any, infos: Any, space: gym.Space, notes: list[str] | None,
                 step: tuple | None = None) -> str | None:
    """Each agent's entries; `step`: step()'s (rewards, terminated, truncated)."""
    for a, info in enumerate(infos):
        agent = f" of agent {a}"
        if step is not None:
            rewards, terminated, truncated = step
            rule = (scalar_rule(rewards[a], agent) or flag_rule("terminated", terminated[a], agent)
                    or flag_rule("truncated", truncated[a], agent))
            if rule is not None:
                return rule
        if not isinstance(info, dict):
            return f"{call}() must return an info{agent} that is a dict, got {describe(info)}"
        if info.get("is_active", True):  # an inactive agent's observation is never read
            rule = observation_rule(call, obs[a], space, notes, a)
            if rule is not None:
                return rule
    return None


def observation_rule(call: str, obs: Any, space: gym.Space, notes: list[str] | None = None,
                     agent: int | None = None) -> str | None:
    """What is wrong with an observation `call`() returned; dtype casts go to `notes`."""
    whose = "" if agent is None else f" for agent {agent}"
    found = _conforms(obs, space, "", notes if notes is not None else [])
    return None if found is None else f"{call}() returned{whose} {found}"


def _conforms(obs: Any, space: gym.Space, path: str, notes: list[str]) -> str | None:
    """`obs` against `space` (recursively for Dict and Tuple spaces); `path` names a field."""
    what = f"an observation whose {path!r}" if path else "an observation that"
    if isinstance(space, gym.spaces.Dict):
        if not isinstance(obs, Mapping):
            return f"{what} is {describe(obs)}, but the observation space is a Dict of {list(space.spaces)}"
        missing = [key for key in space.spaces if key not in obs]
        if missing:
            return f"{what} lacks {missing} of the keys of its Dict space"
        fields = ((obs[key], sub, f"{path}/{key}") for key, sub in space.spaces.items())
    elif isinstance(space, gym.spaces.Tuple):
        if not isinstance(obs, (tuple, list)) or len(obs) != len(space.spaces):
            return f"{what} is {describe(obs)}, but the observation space is a Tuple of {len(space.spaces)}"
        fields = ((o, sub, f"{path}/{i}") for i, (o, sub) in enumerate(zip(obs, space.spaces)))
    else:
        return _leaf_rule(obs, space, what, notes)
    return next(filter(None, (_conforms(o, sub, key.lstrip("/"), notes) for o, sub, key in fields)), None)


def _leaf_rule(obs: Any, space: gym.Space, what: str, notes: list[str]) -> str | None:
    try:
        array = np.asarray(obs)
    except ValueError:  # a ragged list
        return f"{what} is {describe(obs)}, which is not an array"
    if isinstance(space, gym.spaces.Discrete):
        if array.shape != () or array.dtype.kind not in "biu":
            return f"{what} is {describe(obs)}, but its space {space} takes one integer"
        return None if space.contains(np.int64(array)) else f"{what} is {int(array)}, outside its space {space}"
    if not isinstance(space, (gym.spaces.Box, gym.spaces.MultiBinary)):
        return None if space.contains(obs) else f"{what} is not in its space {space}"
    if array.shape != space.shape:
        return f"{what} has shape {array.shape}, but the observation space {space} has shape {space.shape}"
    dtype, want = array.dtype, np.dtype(space.dtype)
    if dtype.kind not in "biuf":
        return f"{what} has dtype {dtype}, but the observation space {space} holds numbers ({want})"
    if isinstance(space, gym.spaces.MultiBinary):  # stored as float32: any number of 0s and 1s will do
        return None
    if want == np.uint8 and dtype.kind == "f":  # stored as uint8 (an image): 0.5 would become 0
        return f"{what} has dtype {dtype}, but the observation space {space} is uint8: its values would be cut"
    if not (np.can_cast(dtype, want) or dtype.kind == want.kind == "f"):  # float64 for float32: harmless
        notes.append(f"observations of dtype {dtype} are cast to the observation space's {want}")
    return None


def describe(value: Any) -> str:
    """A value in a few words: its type, and its shape or length."""
    if value is None:
        return "None"
    kind = type(value)
    package = kind.__module__.split(".")[0]
    name = kind.__qualname__ if package == "builtins" else f"{package}.{kind.__qualname__}"
    article = "an" if name[0].lower() in "aeiou" else "a"
    if isinstance(value, np.generic):
        return f"{article} {name}"
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return f"{article} {name} of shape {tuple(value.shape)}"
    if isinstance(value, (tuple, list)):
        return f"{article} {name} of {len(value)}"
    return f"{article} {name}"
