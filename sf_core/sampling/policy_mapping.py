"""Which policy controls which agent: chosen at every episode start, per agent of each env.

A mapping is a function `fn(env_index, agent_index, episode, num_policies) -> policy`, where
`env_index` counts every env of the run (0 .. num_workers × num_envs_per_worker - 1), `agent_index`
is the agent within its env (0 for single-agent envs) and `episode` counts that agent's episodes in
its env (0 for the first). It is called when the agent's episode starts, and the policy it returns
acts for the agent until the episode ends, so an episode never mixes policies for one agent.

Built-in (--policy_mapping):
- `random`: every agent draws a policy uniformly at every episode start (Sample Factory's default);
  in a 2-player game every pair of policies meets, each policy against itself included.
- `spread`: env k always plays policy `k * num_policies // num_envs`: contiguous blocks of envs, so
  a split of a rollout worker serves one policy and needs one inference request per step.
- `auto` (the default): random for multi-agent envs, spread for single-agent ones.

Users register their own with `register_policy_mapping(name, fn)` and pass `--policy_mapping=name`.
"""

from __future__ import annotations

import operator
import random
from typing import Callable

from sf_core.common.user_code import user_code
from sf_core.config import ConfigError

PolicyMapping = Callable[[int, int, int, int], int]

_MAPPINGS: dict[str, PolicyMapping] = {}
BUILT_IN = ("auto", "random", "spread")


def register_policy_mapping(name: str, fn: PolicyMapping) -> None:
    """Make `--policy_mapping=name` call `fn(env_index, agent_index, episode, num_policies)` at each episode
    start (in the rollout worker processes: a lambda or a notebook's function travels there by value)."""
    if name in BUILT_IN:
        raise ValueError(f"{name!r} is a built-in policy mapping; register yours under another name")
    _MAPPINGS[name] = user_code(fn, f"the policy mapping registered as {name!r}")


def known_mappings() -> list[str]:
    return [*BUILT_IN, *sorted(_MAPPINGS)]


def resolve(name: str) -> PolicyMapping | str:
    """A registered function, or the name of a built-in (built for each split by `AgentPolicies`)."""
    if name in BUILT_IN:
        return name
    if name not in _MAPPINGS:
        raise ConfigError(f"unknown --policy_mapping={name!r}; known: {', '.join(known_mappings())} "
                          f"(register others with sf_core.sampling.policy_mapping.register_policy_mapping)")
    return _MAPPINGS[name]


def built_in(mapping: PolicyMapping | str, multi_agent: bool) -> PolicyMapping | str:
    """`auto` resolved: random for multi-agent envs, spread otherwise; anything else as given."""
    if mapping == "auto":
        return "random" if multi_agent else "spread"
    return mapping


class AgentPolicies:
    """The mapping as a split runner uses it: the policy of each of its rows, redrawn at episode starts."""

    def __init__(self, mapping: PolicyMapping | str, num_policies: int, total_envs: int, multi_agent: bool,
                 seed: int):
        mapping = built_in(mapping, multi_agent)
        self.num_policies, self.total_envs = num_policies, total_envs
        self.rng = random.Random(seed)
        self.fn: PolicyMapping
        if mapping == "random":
            self.fn = lambda env, agent, episode, n: self.rng.randrange(n)
        elif mapping == "spread":
            self.fn = lambda env, agent, episode, n: env * n // self.total_envs
        else:
            assert callable(mapping)
            self.fn = mapping

    def choose(self, env_index: int, agent_index: int, episode: int) -> int:
        if self.num_policies == 1:
            return 0
        found = self.fn(env_index, agent_index, episode, self.num_policies)
        try:
            policy = operator.index(found)
        except TypeError:
            policy = -1
        if not 0 <= policy < self.num_policies:
            raise ValueError(f"the policy mapping returned {found!r} for env {env_index}, agent {agent_index}: "
                             f"expected a policy index in [0, {self.num_policies})")
        return policy
