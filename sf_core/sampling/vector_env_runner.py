"""Batched sampling (--batched_sampling=True): a split's single-agent envs stepped as one batch.

One row per env. The envs step in one loop and the split's rewards and flags are written with one
array operation each: the fast path for single-agent envs. Multi-agent envs need the non-batched
runner (sf_core/sampling/nonbatched_env_runner.py); the runner refuses them here before anything starts.

With --env_service the split's envs step remotely all at once: one `steps` message per server, the
servers reset finished episodes themselves, and the replies are awaited together
(sf_core/service/batch_step.py).
"""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np

from sf_core.envs.env_check import observation_rule, reset_rule, step_rule
from sf_core.sampling.split_runner import STORE_ERRORS, EnvStepError, SplitRunner
from sf_core.service.batch_step import BatchStepper, StepResult
from sf_core.service.env_pool import EnvPool, SlotLost


class VectorEnvRunner(SplitRunner):
    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        # one pool of served envs: their steps go out together (composed envs of named pools step one by one)
        self.batch = BatchStepper(self.cfg.env_service_timeout) if isinstance(self.pool, EnvPool) else None

    def reset(self, slot: int) -> None:
        self.begin(slot)
        for e, env in enumerate(self.envs):
            obs = self._reset(e, seed=self.seeds[e])
            try:
                self.writer.write(obs, self.obs[self.slot, 0, e])
            except STORE_ERRORS as exc:
                self.raise_if_broken(e, observation_rule("reset", obs, env.observation_space), exc)
                raise

    def step(self) -> bool:
        slot, t = self.slot, self.t
        actions = [self.to_env_action(a) for a in self.actions[slot, t]]
        steps = self._remote_steps(actions) if self.batch is not None else self._local_steps(actions)
        rewards = np.empty(len(self.envs), dtype=np.float64)
        terminated = np.zeros(len(self.envs), dtype=bool)
        truncated = np.zeros(len(self.envs), dtype=bool)
        next_obs = self.obs[slot, t + 1]
        for e, (obs, reward, term, trunc, info, reset_obs) in enumerate(steps):
            try:  # costs nothing until it raises: then the env's values are checked to say what broke
                rewards[e] = reward
                if term or trunc:
                    self.record_episode(e, reward, info)
                    if trunc and not term:  # the value of this final state bootstraps the cut episode
                        truncated[e] = True
                        self.writer.write(obs, self.final_obs[e])
                    terminated[e] = term
                    obs = reset_obs
                else:
                    self.episode_return[e] += reward
                    self.episode_length[e] += 1
                self.writer.write(obs, next_obs[e])
            except STORE_ERRORS as exc:
                self._diagnose(e, (obs, reward, term, trunc, info), reset_obs, exc)
                raise
        self.store_step(rewards, terminated, truncated)
        return bool(truncated.any())

    def _local_steps(self, actions: list) -> Iterable[tuple]:
        """Each env steps, and resets when its episode ended, one after the other (plain tuples, as
        StepResult's fields: this is the hot loop of in-process sampling)."""
        for e, env in enumerate(self.envs):
            result = self.call(e, env.step, actions[e])
            try:
                obs, reward, term, trunc, info = result
                ended = term or trunc
            except (TypeError, ValueError) as exc:
                self.raise_if_broken(e, step_rule(result, env.observation_space), exc)
                raise
            yield obs, reward, term, trunc, info, (self._reset(e) if ended else None)

    def _reset(self, e: int, **kwargs: Any) -> Any:
        """Env e's first observation of a new episode (its reset's info is not read)."""
        result = self.call(e, self.envs[e].reset, **kwargs)
        if not isinstance(result, tuple) or len(result) != 2:  # a reset returning only obs would unpack silently
            self.raise_if_broken(e, reset_rule(result, self.envs[e].observation_space), None)
        return result[0]

    def _diagnose(self, e: int, returned: tuple, reset_obs: Any, error: Exception) -> None:
        """Storing env e's step (`returned`) failed with `error`: raise the rule it broke, if any."""
        space = self.envs[e].observation_space
        rule = step_rule(returned, space)
        if rule is None and reset_obs is not None:
            rule = observation_rule("reset", reset_obs, space)
        self.raise_if_broken(e, rule, error)

    def _remote_steps(self, actions: list) -> list[StepResult]:
        results = self.batch.step(self.envs, actions, autoreset=True)
        lost = [(e, r) for e, r in enumerate(results) if isinstance(r, SlotLost)]
        if lost:  # the worker drops the split's trajectory and resets its envs, on other slots where needed
            e, error = lost[0]
            raise EnvStepError(f"{self.env_name(e)} raised in step(): SlotLost: {error}"
                               + (f" (and {len(lost) - 1} more of the split's slots)" if len(lost) > 1 else "")
                               ) from error
        return results

    def close(self) -> None:
        super().close()
        if self.batch is not None:
            self.batch.close()
