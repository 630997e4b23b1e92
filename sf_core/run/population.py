"""The runner's side of several policies: where each resumes from, what each checkpoint keeps, and PBT.

Every policy saves its own checkpoints (`checkpoint_p{K}/` when --num_policies > 1), each with the
run's shared counters and that policy's statistics; policy 0's counters restore the run's. With
--with_pbt the runner owns the decisions (sf_core/run/pbt.py) and tells the learners: `pbt_replace`.
"""

from __future__ import annotations

import dataclasses
import logging
import os

from sf_core.config import Config, ConfigError
from sf_core.records import checkpoint
from sf_core.records.experiment import load_config
from sf_core.run.stats import TrainingStats
from sf_core.sampling.policy_mapping import built_in

log = logging.getLogger("sf_core")

# What a checkpoint's weights were trained for: the env and the model's flags (those that only set the first
# weights or the learner's sequences, initial_log_std and recurrence, may change on resume)
SAME_ON_RESUME = ("env",) + tuple(f.name for f in dataclasses.fields(Config) if f.metadata.get("group") == "model"
                                  and f.name not in ("initial_log_std", "recurrence"))


class Population:
    def __init__(self, cfg: Config, experiment_path: str):
        self.cfg, self.experiment_path = cfg, experiment_path
        n = cfg.num_policies
        self.dirs = [checkpoint.checkpoint_dir(experiment_path, p, n) for p in range(n)]
        self.resume_from: list[str | None] = [None] * n
        self.states: list[dict | None] = [None] * n
        self.pbt = None  # PopulationBasedTraining, made by start_pbt

    # ---------------------------------------------------------------- resume
    def check(self, agents_per_env: int) -> None:
        """Flags that would leave a policy without samples, or PBT without an objective, fail here."""
        cfg = self.cfg
        spread = built_in(cfg.policy_mapping, agents_per_env > 1) == "spread"
        envs = cfg.num_workers * cfg.num_envs_per_worker
        if cfg.num_policies > 1 and spread and envs < cfg.num_policies:
            raise ConfigError(f"--num_policies={cfg.num_policies} with the spread mapping needs at least as many envs, "
                              f"got {envs} (--num_workers × --num_envs_per_worker): some policies would never play")
        if cfg.with_pbt and cfg.pbt_target_objective == "win_rate" and agents_per_env != 2:
            raise ConfigError(f"--pbt_target_objective=win_rate ranks policies by their 2-player matches, but the env "
                              f"has {agents_per_env} agent(s)")

    def find_checkpoints(self) -> None:
        """Each policy's latest checkpoint, loaded (a policy without one starts afresh)."""
        self._check_layout()
        self.resume_from = [checkpoint.latest_checkpoint(d) for d in self.dirs]
        if any(self.resume_from):
            self._check_same_model()
        self.states = [checkpoint.load(path) if path else None for path in self.resume_from]
        missing = [p for p, state in enumerate(self.states) if state is None]
        if self.states[0] is not None and missing:
            log.warning("policies %s have no checkpoint to resume from: they start afresh", missing)

    def _check_layout(self) -> None:
        """An experiment keeps the number of policies it started with."""
        n = self.cfg.num_policies
        other = (checkpoint.checkpoint_dir(self.experiment_path, 0, 2) if n == 1
                 else checkpoint.checkpoint_dir(self.experiment_path))
        if checkpoint.latest_checkpoint(other) is not None:
            trained = "several policies" if n == 1 else "one policy"
            raise ConfigError(f"{self.experiment_path} trained {trained} ({other}) and cannot resume with "
                              f"--num_policies={n}: start another experiment, or --restart_behavior=restart")

    def _check_same_model(self) -> None:
        """The experiment being resumed trained this env and this model, or nothing is loaded: one message
        naming what differs and the two ways out (its weights would not fit, or would act in another env)."""
        try:
            saved = load_config(self.experiment_path)
        except ConfigError:  # checkpoints without config.json: nothing to compare with
            return
        def plain(value):  # config.json holds lists where a Config built in Python may hold tuples
            return list(value) if isinstance(value, tuple) else value

        differ = [f"--{name}={getattr(saved, name)} there, {getattr(self.cfg, name)} now" for name in SAME_ON_RESUME
                  if plain(getattr(saved, name)) != plain(getattr(self.cfg, name))]
        if differ:
            raise ConfigError(f"{self.experiment_path} holds a run with other flags ({'; '.join(differ)}): it cannot "
                              f"be resumed by this one. Name another experiment (--experiment=NAME), or start this "
                              f"one afresh (--restart_behavior=overwrite){self._applied_now(saved)}")

    def _applied_now(self, saved: Config) -> str:
        """Values this run got under its flags that the saved one did not (a run from before an env fit or a
        preset applied to its env): how to type the saved run's values back."""
        fitted = [name for name in SAME_ON_RESUME if name in self.cfg.env_fit and name not in saved.env_fit]
        if fitted:
            return (f". {', '.join(fitted)} were fitted to the env's spaces now: --fit_defaults_to_env=False "
                    f"keeps Sample Factory's defaults")
        if self.cfg.preset and self.cfg.preset != saved.preset:
            return (f". This run's values come partly from the {self.cfg.preset} preset: type the saved run's "
                    f"values to resume it")
        return ""

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
            # with --eval_every_env_steps the evaluations choose best.pt (sf_core/run/evaluations.py)
            requests.append((state, is_best and not self.cfg.eval_every_env_steps))
        return requests

    def last_checkpoints(self) -> list[str | None]:
        return [checkpoint.latest_checkpoint(d) for d in self.dirs]

    # ---------------------------------------------------------------- population-based training
    def start_pbt(self, seed: int) -> None:
        if not self.cfg.with_pbt or self.pbt is not None:
            return
        from sf_core.run.pbt import PopulationBasedTraining

        state = self.resumed.get("pbt") if self.resumed else None
        try:
            self.pbt = PopulationBasedTraining(self.cfg, seed, os.path.join(self.experiment_path, "pbt.jsonl"), state)
        except ValueError as exc:  # a saved population of another size
            raise ConfigError(f"--with_pbt cannot resume this experiment's population: {exc}") from None

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
            stats.metrics.forget(r.policy)
            if stats.win_rates is not None:
                stats.win_rates.forget(r.policy)
        return replacements
