"""A stand-in for a slow simulator: CartPole whose every step sleeps SF_BENCH_STEP_MS milliseconds (20 by
default). Sleeping releases the GIL, as a simulator in C++, on a GPU or in another process would, so a
`--parallel=True` env server steps its instances at the same time. Imported by env servers with
`--env_module=benchlib.slow_env` (scripts/ on the path); the trainer learns its spaces from the servers."""

from __future__ import annotations

import os
import time

import gymnasium as gym

from sf_core import register_env

STEP_SECONDS = float(os.environ.get("SF_BENCH_STEP_MS", "20")) / 1000


class SleepyCartPole(gym.Wrapper):
    def step(self, action):
        time.sleep(STEP_SECONDS)
        return self.env.step(action)


register_env("SleepyCartPole-v1", lambda name, cfg, ctx: SleepyCartPole(gym.make("CartPole-v1")))
# also a gymnasium id, so `--env=benchlib.slow_env:SleepyCartPole-v1` works where sf_core's registry of this
# process is not the one that makes the env (a trainer started as `python -m sf_core.train`, Ray samplers)
gym.register("SleepyCartPole-v1", entry_point=lambda **kwargs: SleepyCartPole(gym.make("CartPole-v1", **kwargs)))
