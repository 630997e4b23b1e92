"""A corridor walked to its end, whose last info says how far the agent got and whether it made it: the env of the
episode-metric and periodic-evaluation runs (it learns in seconds)."""

from __future__ import annotations

import os

import gymnasium as gym
import numpy as np


class Corridor(gym.Env):
    """Walk right to the end of a corridor: a step right pays 0.1, a step that does not costs 0.1, the goal pays 1
    more (at best 1.7, in 7 steps; 50 steps at most). Its last info says how far the agent got and whether it made
    it."""

    observation_space = gym.spaces.Box(0.0, 1.0, (8,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def _obs(self):
        obs = np.zeros(8, np.float32)
        obs[self.pos] = 1.0
        return obs

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.pos, self.steps = 0, 0
        return self._obs(), {}

    def step(self, action):
        before, self.pos = self.pos, min(7, max(0, self.pos + (1 if action == 1 else -1)))
        self.steps += 1
        at_goal = self.pos == 7
        info = {}
        if at_goal or self.steps >= 50:
            info = {"episode_extra_stats": {"distance": self.pos / 7, "steps": self.steps}, "is_success": at_goal}
        reward = (0.1 if self.pos > before else -0.1) + (1.0 if at_goal else 0.0)
        return self._obs(), reward, at_goal, self.steps >= 50, info


def make_corridor(name, cfg, ctx):  # module level: worker processes import it by name
    return Corridor()


CORRIDOR = ["--env=Corridor-v0", "--num_envs_per_worker=8", "--rollout=16", "--batch_size=512",
            "--encoder_mlp_layers", "64", "--learning_rate=0.001", "--seed=3"]


def tb_scalars(experiment_path) -> dict[str, list]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(os.path.join(experiment_path, "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
