"""Envs the env-service tests serve (`python -m sf_core.env_server --env_module=tests.service_envs`)."""

from __future__ import annotations

import time
from collections import Counter

import gymnasium as gym
import numpy as np

from envs.memory import MemoryCueEnv
from sf_core import register_env

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
