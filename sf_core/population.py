"""The runner's side of several policies: where each resumes from, what each checkpoint keeps, and PBT.

Every policy saves its own checkpoints (`checkpoint_p{K}/` when --num_policies > 1), each with the
run's shared counters and that policy's statistics; policy 0's counters restore the run's. With
--with_pbt the runner owns the decisions (sf_core/pbt.py) and tells the learners: `pbt_replace`.
"""

from __future__ import annotations

import logging
import os

from sf_core import checkpoint
from sf_core.config import Config
from sf_core.stats import TrainingStats

log = logging.getLogger("sf_core")


class Population:
    def __init__(self, cfg: Config, experiment_path: str):
        self.cfg, self.experiment_path = cfg, experiment_path
        n = cfg.num_policies
        self.dirs = [checkpoint.checkpoint_dir(experiment_path, p, n) for p in range(n)]
        self.resume_from: list[str | None] = [None] * n
        self.states: list[dict | None] = [None] * n
        self.pbt = None  # PopulationBasedTraining, made by start_pbt

    # ---------------------------------------------------------------- resume
    def find_checkpoints(self) -> None:
        """Each policy's latest checkpoint, loaded (a policy without one starts afresh)."""
        self.resume_from = [checkpoint.latest_checkpoint(d) for d in self.dirs]
        self.states = [checkpoint.load(path) if path else None for path in self.resume_from]
        missing = [p for p, state in enumerate(self.states) if state is None]
        if self.states[0] is not None and missing:
            log.warning("policies %s have no checkpoint to resume from: they start afresh", missing)

    @property
    def resumed(self) -> dict | None:
        """The run's counters from the checkpoint it resumes from (policy 0's), or None."""
        state = self.states[0]
        return state["runner"] if state is not None else None

    def restore(self, stats: TrainingStats) -> None:
        if self.resumed is None:
            return
        stats.restore(self.resumed)
        # a checkpoint written before several policies existed keeps the best return at its top level
        stats.policies[0].best_mean_return = self.resumed.get("best_mean_return", float("-inf"))
        for p, state in enumerate(self.states):
            if state is not None:
                stats.restore_policy(p, state["runner"])

    # ---------------------------------------------------------------- checkpoints
    def checkpoint_requests(self, stats: TrainingStats) -> list[tuple[dict, bool]]:
        """(runner state, is best) for each policy's next checkpoint."""
        requests = []
        for p, policy in enumerate(stats.policies):
            mean = policy.mean_return()
            is_best = mean is not None and mean > policy.best_mean_return
            if is_best:
                policy.best_mean_return = mean
            state = stats.checkpoint_state(policy.best_mean_return, p)
            if self.pbt is not None:
                state["pbt"] = self.pbt.state_dict()
            requests.append((state, is_best))
        return requests

    def last_checkpoints(self) -> list[str | None]:
        return [checkpoint.latest_checkpoint(d) for d in self.dirs]

    # ---------------------------------------------------------------- population-based training
    def start_pbt(self, seed: int) -> None:
        if not self.cfg.with_pbt or self.pbt is not None:
            return
        from sf_core.pbt import PopulationBasedTraining

        state = self.resumed.get("pbt") if self.resumed else None
        self.pbt = PopulationBasedTraining(self.cfg, seed, os.path.join(self.experiment_path, "pbt.jsonl"), state)

    def pbt_step(self, stats: TrainingStats) -> list:
        """PBT's replacements due now (each policy's frames are the samples its learner trained on)."""
        if self.pbt is None:
            return []
        frames = [p.samples_trained * self.cfg.env_frameskip for p in stats.policies]
        objectives = [stats.objective(p, self.cfg.pbt_target_objective) for p in range(len(stats.policies))]
        replacements = self.pbt.update(frames, objectives)
        for r in replacements:  # its recent returns were the replaced weights'
            stats.policies[r.policy].returns.clear()
            stats.policies[r.policy].objectives.clear()
        return replacements
