"""A composed env of three services for the benchmarks (benchlib/service_calls.py): a driver, a sensor and a
physics service, each a slow simulator on its own pool (`SleepyCartPole-v1` servers, benchlib/slow_env.py).

Each step sends the same action to all three. They start from the same seed, so their CartPoles stay the
same and their episodes end together; the driver's observation and reward are the env's. `ThreeServices-v1`
calls them at once (`ctx.services.step`), `ThreeServicesInTurn-v1` one after the other, as a composed env
did before calls at once existed. Imported by the trainer with `--env_module=benchlib.composed_env`.
"""

from __future__ import annotations

import gymnasium as gym

from sf_core import register_env

POOLS = ("driver", "sensors", "physics")


class ThreeServices(gym.Env):
    def __init__(self, services, at_once: bool):
        self.services, self.at_once = services, at_once
        self.observation_space = services["driver"].observation_space
        self.action_space = services["driver"].action_space

    def reset(self, *, seed=None, options=None):
        if self.at_once:
            out = self.services.reset(seed=seed)
        else:
            out = {name: self.services[name].reset(seed=seed) for name in POOLS}
        return out["driver"]

    def step(self, action):
        if self.at_once:
            out = self.services.step({name: action for name in POOLS})
        else:
            out = {name: self.services[name].step(action) for name in POOLS}
        return out["driver"]


def make_at_once(name, cfg, ctx):
    return ThreeServices(ctx.services, at_once=True)


def make_in_turn(name, cfg, ctx):
    return ThreeServices(ctx.services, at_once=False)


register_env("ThreeServices-v1", make_at_once)
register_env("ThreeServicesInTurn-v1", make_in_turn)
