"""Batched sampling (--batched_sampling=True): a split's single-agent envs stepped as one batch.

One row per env. The envs step in one loop and the split's rewards and flags are written with one
array operation each: the fast path for single-agent envs. Multi-agent envs need the non-batched
runner (sf_core/nonbatched_env_runner.py); the runner refuses them here before anything starts.
"""

from __future__ import annotations

import numpy as np

from sf_core.split_runner import SplitRunner


class VectorEnvRunner(SplitRunner):
    def reset(self, slot: int) -> None:
        self.begin(slot)
        for e, env in enumerate(self.envs):
            obs, _ = self.call(e, env.reset, seed=self.seeds[e])
            self.writer.write(obs, self.obs[self.slot, 0, e])

    def step(self) -> bool:
        slot, t = self.slot, self.t
        actions = self.actions[slot, t]
        rewards = np.empty(len(self.envs), dtype=np.float64)
        terminated = np.zeros(len(self.envs), dtype=bool)
        truncated = np.zeros(len(self.envs), dtype=bool)
        next_obs = self.obs[slot, t + 1]
        for e, env in enumerate(self.envs):
            obs, reward, term, trunc, info = self.call(e, env.step, self.to_env_action(actions[e]))
            rewards[e] = reward
            if term or trunc:
                self.record_episode(e, reward, info)
                if trunc and not term:  # the value of this final state bootstraps the cut episode
                    truncated[e] = True
                    self.writer.write(obs, self.final_obs[e])
                terminated[e] = term
                obs, _ = self.call(e, env.reset)
            else:
                self.episode_return[e] += reward
                self.episode_length[e] += 1
            self.writer.write(obs, next_obs[e])
        self.store_step(rewards, terminated, truncated)
        return bool(truncated.any())
