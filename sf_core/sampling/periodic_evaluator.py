"""The evaluator (--eval_every_env_steps): plays --eval_episodes deterministic episodes with a checkpoint the runner
names, on an env of its own, and reports how it did.

Signals in: evaluate, stop. Out: report (an `EvalReport`) (sf_core/contracts/signals.py).

In async mode it has a process of its own, so training goes on while it plays; in serial mode it runs on the
runner's loop, and training waits. Its env is made with `EnvContext(evaluation=True)` (Atari: whole games, raw
scores) and reset with the same seed, apart from training's, at every evaluation: each checkpoint plays the same
episodes as far as the policy's actions allow. Every agent of a multi-agent env acts with the policy (self-play)
and each agent's episode counts, as in training. The runner evaluates the final weights itself, with
`evaluate_now`, once the components stopped (sf_core/run/evaluations.py).
"""

from __future__ import annotations

import time
from typing import Callable

import gymnasium as gym
import numpy as np

from sf_core.algo.model import ActorCritic, ModelSpec
from sf_core.config import Config
from sf_core.contracts.component import Component, guarded
from sf_core.contracts.control import ControlBlock
from sf_core.contracts.signals import REPORT, EvalReport
from sf_core.envs.registry import EnvContext, EnvRegistry
from sf_core.records import checkpoint
from sf_core.sampling.episode_metrics import episode_metrics
from sf_core.sampling.episodes import PlayedEpisode, play_episodes
from sf_core.sampling.trained_policy import TrainedPolicy
from signal_slot.signal_slot import EventLoop

EVALUATOR = "evaluator"
EVAL_SEED_OFFSET = 987_654_321  # from --seed: far from the training envs' seeds (--seed + env index, + 1,000,003 ...)


class Evaluator(Component):
    def __init__(self, loop: EventLoop, cfg: Config, registry: EnvRegistry, obs_space: gym.Space,
                 action_space: gym.Space, spec: ModelSpec, control: ControlBlock | None = None):
        super().__init__(loop, EVALUATOR, control)
        self.cfg, self.registry, self.control = cfg, registry, control
        self.obs_space, self.action_space, self.spec = obs_space, action_space, spec
        self.seed = cfg.seed + EVAL_SEED_OFFSET
        self.env = None  # made at the first evaluation, not at the start: training's first frames come first
        self.policy: TrainedPolicy | None = None
        self.stopped = False

    @guarded
    def evaluate(self, policy: int, path: str) -> None:
        if self.stopped:  # serial mode: a checkpoint saved on the way out (the runner evaluates the last itself)
            return
        stopping = self.control.stop_requested if self.control is not None else lambda: False
        report = self.evaluate_now(policy, path, stopping)
        if report is not None:  # None: the run stops, and nobody waits for it
            REPORT.emit(self, report)

    def evaluate_now(self, policy: int, path: str, stopping: Callable[[], bool] = lambda: False
                     ) -> EvalReport | None:
        """Play the episodes with checkpoint `path` of `policy`; None if `stopping()` became true meanwhile."""
        started = time.time()
        state = checkpoint.load(path)
        trained = self._trained_policy(state["model"])
        if self.env is None:
            self.env = self.registry.make(self.cfg.env, self.cfg, EnvContext(-1, 0, self.seed, evaluation=True))
        count = self.cfg.eval_episodes
        played = list(play_episodes(self.env, trained, count, self.seed, before_step=lambda: self.beat(
            "evaluating a checkpoint"), stopping=stopping))
        if len(played) < count:  # the run stops, and nobody waits for the result
            return None
        return EvalReport(policy, path, int(state["version"]), int(state["runner"]["frames"]),
                          [e.ret for e in played], [e.length for e in played], mean_metrics(played),
                          time.time() - started)

    def _trained_policy(self, weights: dict) -> TrainedPolicy:
        if self.policy is None:  # one model, loaded with each checkpoint's weights in turn
            model = ActorCritic(self.obs_space, self.action_space, self.spec)
            model.eval()
            self.policy = TrainedPolicy(model, self.obs_space, self.action_space, deterministic=True)
        self.policy.model.load_state_dict(weights)
        return self.policy

    @guarded
    def stop(self) -> None:
        self.stopped = True
        self.close()
        self.stop_loop()

    def close(self) -> None:
        if self.env is not None:
            env, self.env = self.env, None
            env.close()


def mean_metrics(played: list[PlayedEpisode]) -> dict[str, float]:
    """The mean of each episode metric the episodes reported (training's statistics warned of any other value)."""
    metrics: dict[str, list[float]] = {}
    for episode in played:
        for key, value in episode_metrics(episode.info):
            if isinstance(value, float):
                metrics.setdefault(key, []).append(value)
    return {key: float(np.mean(values)) for key, values in sorted(metrics.items())}
