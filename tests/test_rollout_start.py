"""How a rollout worker starts its splits (sf_core/sampling/rollout_worker.py)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from sf_core.envs.registry import register_env
from tests.helpers import train

EVENTS: list[tuple[str, int]] = []  # (what, env index), in the order they happened: serial mode, one process


class Recorded(gym.Wrapper):
    def __init__(self, env: gym.Env, index: int):
        super().__init__(env)
        self.index, self.stepped = index, False

    def step(self, action):
        if not self.stepped:
            EVENTS.append(("first step", self.index))
            self.stepped = True
        return self.env.step(action)


def make_recorded(name, cfg, ctx) -> gym.Env:
    EVENTS.append(("made", ctx.env_index))
    return Recorded(gym.make("CartPole-v1"), ctx.env_index)


register_env("RecordedCartPole-v1", make_recorded)


def test_the_first_split_steps_before_the_next_splits_envs_are_made(tmp_path):
    """The second split's envs are made after the first split's first step, so that step's frames need not wait
    for every env of the worker (an Atari env takes 0.2 s to make)."""
    EVENTS.clear()
    code, summary = train(tmp_path, "--env=RecordedCartPole-v1", "--serial_mode=True", "--num_workers=1",
                          "--num_envs_per_worker=4", "--worker_num_splits=2", "--train_for_env_steps=2000")
    assert code == 0, summary.get("error")
    made = [index for what, index in EVENTS if what == "made" and index >= 0]  # -1: the runner's probe
    assert sorted(made) == [0, 1, 2, 3]
    first_step = EVENTS.index(("first step", 0))
    assert EVENTS.index(("made", 2)) > first_step and EVENTS.index(("made", 1)) < first_step
    assert {index for what, index in EVENTS if what == "first step" and index >= 0} == {0, 1, 2, 3}
    # index -1: the main process's envs, before all: one read for the defaults fitted to its spaces, and the probe,
    # which the env check steps once
    assert EVENTS[:3] == [("made", -1), ("made", -1), ("first step", -1)]


class _ClosedEnvRefusesSteps(gym.Wrapper):
    def close(self):
        self.closed = True
        super().close()

    def step(self, action):
        if getattr(self, "closed", False):
            raise RuntimeError("stepped after close()")
        return super().step(action)


def test_actions_that_arrive_after_stop_are_not_stepped():
    """stop() closes the worker's envs; an `advance` still queued behind it must not step them (ale-py's vector
    env frees its threads at close)."""
    from signal_slot.signal_slot import EventLoop

    from sf_core.cli.arguments import parse_args
    from sf_core.contracts.buffers import BufferLayout, TrajectoryBuffers
    from sf_core.contracts.sample import SampleSpaces
    from sf_core.envs.registry import EnvRegistry
    from sf_core.sampling.rollout_worker import RolloutWorker

    cfg, _ = parse_args(["--env=Closing-v0", "--num_workers=1", "--num_envs_per_worker=2", "--worker_num_splits=1",
                         "--rollout=4", "--batch_size=8", "--serial_mode=True", "--env_vectorization=none"])
    registry = EnvRegistry({"Closing-v0": lambda name, cfg, ctx: _ClosedEnvRefusesSteps(gym.make("CartPole-v1"))})
    layout = BufferLayout.from_config(cfg)
    buffers = TrajectoryBuffers(layout, SampleSpaces(gym.spaces.Box(-np.inf, np.inf, (4,), np.float32),
                                                     gym.spaces.Discrete(2)))
    worker = RolloutWorker(EventLoop("test_loop", serial_mode=True), 0, cfg, registry, buffers, layout, 0)
    worker.emit = lambda *args, **kwargs: None
    worker.on_start()
    worker.stop()
    worker.advance(0, [0])  # stepped the closed envs before
    assert worker.runners[0].t == 0
