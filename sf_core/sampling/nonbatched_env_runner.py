"""Non-batched sampling (--batched_sampling=False): each env of a split stepped on its own.

Every env follows the multi-agent contract (envs/multi_agent.py; a single-agent env is adapted to
one agent) and owns `agents_per_env` consecutive rows of the split: agent a of env e is row
`e × agents_per_env + a`. The env resets itself; this runner keeps per-agent episode statistics,
the final observation of agents cut by a time limit, and the `inactive` mask of agents that have no
observation to act on (finished early, waiting for the others).
"""

from __future__ import annotations

import numpy as np

from sf_core.envs.env_check import MULTI_AGENT_CONTRACT, reset_rule, step_rule
from sf_core.envs.multi_agent import SingleAgentAdapter, as_multi_agent, num_agents
from sf_core.envs.registry import EnvContext, EnvRegistry
from sf_core.sampling.split_runner import STORE_ERRORS, EnvStepError, SplitRunner


class NonBatchedEnvRunner(SplitRunner):
    def make_env(self, registry: EnvRegistry, ctx: EnvContext):
        env = super().make_env(registry, ctx)
        if num_agents(env) != self.layout.agents_per_env:  # the buffers are sized by the probe env
            e = ctx.env_index - self.split_index * self.layout.envs_per_split
            raise EnvStepError(f"{self.env_name(e)} has {num_agents(env)} agents, but the env the runner "
                               f"probed has {self.layout.agents_per_env}: every instance must have as many")
        return as_multi_agent(env)

    def rows_of(self, e: int) -> range:
        A = self.layout.agents_per_env
        return range(e * A, (e + 1) * A)

    def reset(self, slot: int) -> None:
        self.begin(slot)
        for e, env in enumerate(self.envs):
            result = self.call(e, env.reset, seed=self.seeds[e])
            try:
                obs, infos = result
                self._check_count(e, "reset", obs, infos)
                for a, row in enumerate(self.rows_of(e)):
                    self._store_obs(0, row, obs[a], infos[a])
            except STORE_ERRORS as exc:
                self._diagnose(e, "reset", result, exc)
                raise

    def step(self) -> bool:
        slot, t = self.slot, self.t
        actions, acting = self.actions[slot, t], ~self.inactive[slot, t]
        rows = self.layout.rows_per_split
        rewards = np.zeros(rows, dtype=np.float64)
        # an inactive row ends an "episode" of its own, so GAE never chains across the gap it leaves
        terminated = ~acting
        truncated = np.zeros(rows, dtype=bool)
        for e, env in enumerate(self.envs):
            env_rows = self.rows_of(e)
            # inactive agents get an action too (the env ignores it): the contract is one per agent
            result = self.call(e, env.step, [self.to_env_action(actions[r]) for r in env_rows])
            try:  # costs nothing until it raises: then the env's values are checked to say what broke
                obs, reward, term, trunc, infos = result
                self._check_count(e, "step", obs, reward, term, trunc, infos)
                for a, row in enumerate(env_rows):
                    if acting[row]:
                        self._agent_step(e, a, row, float(reward[a]), bool(term[a]), bool(trunc[a]), infos[a],
                                         rewards, terminated, truncated)
                    self._store_obs(t + 1, row, obs[a], infos[a])
            except STORE_ERRORS as exc:
                self._diagnose(e, "step", result, exc)
                raise
        self.store_step(rewards, terminated, truncated)
        return bool(truncated.any())

    def _agent_step(self, e: int, a: int, row: int, reward: float, term: bool, trunc: bool, info: dict,
                    rewards: np.ndarray, terminated: np.ndarray, truncated: np.ndarray) -> None:
        """Statistics and flags of one acting agent's step (its next observation is stored apart)."""
        rewards[row] = reward
        if term or trunc:
            self.record_episode(row, reward, info, agent=a)
            terminated[row] = term
            if trunc and not term:  # the value of this final state bootstraps the cut episode
                if "final_obs" not in info:
                    raise EnvStepError(f"{self.env_name(e)} truncated agent {a} without infos[{a}]['final_obs']: "
                                       f"a multi-agent env resets itself, so it must hand over the final "
                                       f"observation of a cut episode (or report the end as terminated)")
                truncated[row] = True
                self.writer.write(info["final_obs"], self.final_obs[row])
        else:
            self.episode_return[row] += reward
            self.episode_length[row] += 1
            if not info.get("is_active", True):
                raise EnvStepError(f"{self.env_name(e)} made agent {a} inactive in the middle of its episode: an "
                                   f"agent may go inactive only on the step that ends its episode")

    def _store_obs(self, t: int, row: int, obs, info: dict) -> None:
        inactive = not info.get("is_active", True)
        self.inactive[self.slot, t, row] = inactive
        # an inactive agent's observation is never acted on: zeros keep the finite checks meaningful
        if inactive:
            self.obs[self.slot, t, row] = 0
        else:
            self.writer.write(obs, self.obs[self.slot, t, row])

    def _check_count(self, e: int, call: str, *values) -> None:
        A = self.layout.agents_per_env
        if any(len(v) != A for v in values):
            raise IndexError(f"{call}() returned {[len(v) for v in values]} entries, not one per agent ({A})")

    def _diagnose(self, e: int, call: str, result: object, error: Exception) -> None:
        """Storing what env e's `call` returned failed with `error`: raise the contract rule it broke, if any. A
        single-agent env's values are the adapter's lists of one: the env itself is held to the gymnasium API."""
        env = self.envs[e]
        rule_of = reset_rule if call == "reset" else step_rule
        if isinstance(env, SingleAgentAdapter):  # its values are lists of one, as the adapter builds them
            self.raise_if_broken(e, rule_of(tuple(v[0] for v in result), env.observation_space), error)
        else:
            self.raise_if_broken(e, rule_of(result, env.observation_space, self.layout.agents_per_env), error,
                                 MULTI_AGENT_CONTRACT)
