"""Envs the env-service tests serve (`python -m sf_core.env_server --env_module=tests.service_envs`)."""

from __future__ import annotations

import json
import os
import time
from collections import Counter

import gymnasium as gym
import numpy as np

from sf_core.envs.memory import MemoryCueEnv
from sf_core import register_env
from sf_core import register_task_runner

_built: Counter = Counter()  # instances built per index in this server process (restores rebuild)


class TaggedCartPole(gym.Wrapper):
    """CartPole whose observation ends with a tag naming the server that produced it."""

    def __init__(self, tag: float):
        super().__init__(gym.make("CartPole-v1"))
        low, high = self.env.observation_space.low, self.env.observation_space.high
        self.observation_space = gym.spaces.Box(np.append(low, 0.0).astype(np.float32),
                                                np.append(high, 1e6).astype(np.float32), dtype=np.float32)
        self.tag = np.float32(tag)

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        return np.append(obs, self.tag).astype(np.float32), info

    def step(self, action):
        obs, *rest = self.env.step(action)
        return (np.append(obs, self.tag).astype(np.float32), *rest)


class FlakyCartPole(gym.Wrapper):
    """CartPole that raises at its third step: the first incarnation of instance 0 of every server."""

    def __init__(self, flaky: bool, step_seconds: float = 0.0):
        super().__init__(gym.make("CartPole-v1"))
        self.flaky, self.steps, self.step_seconds = flaky, 0, step_seconds

    def step(self, action):
        self.steps += 1
        if self.flaky and self.steps == 3:
            raise RuntimeError("simulated simulator crash")
        if self.step_seconds:
            time.sleep(self.step_seconds)
        return self.env.step(action)


class DictMemoryCue(gym.ObservationWrapper):
    """sf_core/MemoryCue-v0 with a Dict observation: the cue (shown at the first step only) and whether
    it is asked for now; only a recurrent policy can answer better than chance."""

    def __init__(self):
        super().__init__(MemoryCueEnv())
        cues = self.env.num_cues
        self.observation_space = gym.spaces.Dict({"cue": gym.spaces.Box(0.0, 1.0, (cues,), np.float32),
                                                  "asked": gym.spaces.Discrete(2)})

    def observation(self, obs):
        return {"cue": obs[:-1].copy(), "asked": int(obs[-1])}


class ObsReward(gym.Env):
    """A reward model behind a server: the action is a CartPole observation, the reward scores it (1 when
    the pole is upright, less as it leans). Optionally slow, so a test can kill its server mid-task."""

    def __init__(self, step_seconds: float = 0.0):
        self.observation_space = gym.spaces.Box(0.0, 1.0, (1,), np.float32)
        self.action_space = gym.spaces.Box(-1e6, 1e6, (4,), np.float32)
        self.step_seconds = step_seconds

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {}

    def step(self, action):
        if self.step_seconds:
            time.sleep(self.step_seconds)
        return np.zeros(1, np.float32), 1.0 - min(1.0, 4.0 * abs(float(action[2]))), False, False, {}


class SlotLogCartPole(FlakyCartPole):
    """Slow CartPole that logs, to the file $SLOT_LOG, each reset (with its seed) and each restore of its
    instance: what the server saw, to prove no two tasks used one slot at once."""

    def __init__(self, index: int):
        super().__init__(flaky=False, step_seconds=0.01)
        self.index = index

    def _log(self, **event):
        with open(os.environ["SLOT_LOG"], "a") as f:
            f.write(json.dumps({"pid": os.getpid(), "slot": self.index, "t": time.time(), **event}) + "\n")

    def reset(self, *, seed=None, options=None):
        self._log(event="reset", seed=seed)
        return super().reset(seed=seed, options=options)

    def restore_snapshot(self):
        self._log(event="restore")
        self.steps = 0


def sim_with_reward(envs, task, policy):
    """Task runner of two pools: the policy plays CartPole on `sim`, and the reward model on `reward`
    scores every observation it reaches; returns the reward model's sums."""
    sim, reward_model = envs["sim"], envs["reward"]
    returns, lengths = [], []
    for episode in range(task["episodes"]):
        obs, _ = sim.reset(seed=task["seed"] + episode)
        reward_model.reset()
        act = policy.start_episode("sim")
        total, length, done = 0.0, 0, False
        while not done:
            obs, _, terminated, truncated, _ = sim.step(act(obs))
            _, reward, *_ = reward_model.step(obs)
            total, length, done = total + reward, length + 1, terminated or truncated
        returns.append(total)
        lengths.append(length)
    return returns, lengths


def recorded_episodes(envs, task, policy):
    """The default runner's episodes, leaving in the task's folder what a benchmark's runner would: every
    step in trajectory.jsonl, and a file named after this attempt (attempt-PID-NS.txt)."""
    folder = task["folder"]
    with open(os.path.join(folder, f"attempt-{os.getpid()}-{time.monotonic_ns()}.txt"), "w") as f:
        f.write(task["id"])
    (env,) = envs.values()
    returns, lengths = [], []
    with open(os.path.join(folder, "trajectory.jsonl"), "w") as trajectory:
        for episode in range(task["episodes"]):
            obs, _ = env.reset(seed=task["seed"] + episode)
            act = policy.start_episode()
            total, length, done = 0.0, 0, False
            while not done:
                action = act(obs)
                obs, reward, terminated, truncated, _ = env.step(action)
                trajectory.write(json.dumps({"episode": episode, "action": int(action), "reward": reward}) + "\n")
                total, length, done = total + reward, length + 1, terminated or truncated
            returns.append(total)
            lengths.append(length)
    return returns, lengths


def make_tagged(name, cfg, ctx):
    return TaggedCartPole(tag=(ctx.seed - ctx.env_index) // 100)  # servers are started with --seed=100, 200, ...


def make_flaky(name, cfg, ctx):
    incarnation = _built[ctx.env_index]
    _built[ctx.env_index] += 1
    return FlakyCartPole(flaky=ctx.env_index == 0 and incarnation == 0)


def make_slow(name, cfg, ctx):
    return FlakyCartPole(flaky=False, step_seconds=0.02)


register_env("TaggedCartPole-v1", make_tagged)
register_env("FlakyCartPole-v1", make_flaky)
register_env("SlowCartPole-v1", make_slow)
register_env("DictMemoryCue-v0", lambda name, cfg, ctx: DictMemoryCue())
register_env("ObsReward-v0", lambda name, cfg, ctx: ObsReward())
register_env("SlowObsReward-v0", lambda name, cfg, ctx: ObsReward(step_seconds=0.01))
register_env("SlotLogCartPole-v1", lambda name, cfg, ctx: SlotLogCartPole(ctx.env_index))
register_task_runner("sim_with_reward", sim_with_reward)
register_task_runner("recorded_episodes", recorded_episodes)
