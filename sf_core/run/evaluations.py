"""The run's periodic evaluations (--eval_every_env_steps, --eval_episodes): when one is due, which checkpoint it
plays, what it found, and which checkpoint is best.pt.

Every --eval_every_env_steps env frames the runner asks every policy for a checkpoint. The first checkpoint each
policy saves after that point is held under a second name (sf_core/records/checkpoint.py: its rotation by
--keep_checkpoints cannot take it) and sent to the evaluator (sf_core/sampling/periodic_evaluator.py), which plays
it in a process of its own while training goes on; a policy whose previous evaluation still runs skips the point.
Each result goes to TensorBoard and W&B (`eval/mean_return`, `eval/std_return`, `eval/mean_length`, `eval/<episode
metric>`, each under `policy_K/` for each of several policies, at the env frames of the evaluated weights), to the
console, to the policy's `evaluation.json` and to training_summary.json (`evaluation`: the last and the best). The
held checkpoint becomes best.pt if its mean return beats every earlier evaluation's, evaluation.json included, so
the best survives a resume. A run that ends on a stop condition evaluates each policy's final weights in the
runner's process, once the components stopped; a run stopped by an error or a signal does not (a signal asks to stop
now: a scheduler's SIGTERM is followed by SIGKILL).
"""

from __future__ import annotations

import logging
import os
from typing import Callable

import numpy as np

from sf_core.config import Config
from sf_core.contracts.signals import EvalReport, Report
from sf_core.records import checkpoint
from sf_core.run.stats import TrainingStats
from sf_core.sampling.periodic_evaluator import Evaluator

log = logging.getLogger("sf_core")


class Evaluations:
    def __init__(self, cfg: Config, dirs: list[str]):
        self.every, self.episodes, self.dirs = cfg.eval_every_env_steps, cfg.eval_episodes, dirs
        self.next_at = 0  # env frames of the next evaluation point (0: not started)
        self.waiting: set[int] = set()  # policies whose next checkpoint is to be evaluated
        self.in_flight: dict[int, str] = {}  # policy -> its held checkpoint, under evaluation
        self.records: list[dict] = [{} for _ in dirs]  # per policy: {"best": ..., "last": ...}

    def start(self, stats: TrainingStats) -> None:
        """The components (re)started: nothing is under evaluation. At the first start, the best and last
        evaluations of the run being resumed (its evaluation.json), and the first evaluation point."""
        if not self.every:
            return
        self.in_flight.clear()
        if not self.next_at:
            self.records = [checkpoint.load_evaluations(d) for d in self.dirs]
            self.next_at = (stats.frames // self.every + 1) * self.every
        for directory in self.dirs:
            checkpoint.drop_held(directory)
        stats.evaluation = self.summary()

    def due(self, frames: int) -> bool:
        """An evaluation point passed: ask every policy for a checkpoint (False: no point, or every policy is still
        under evaluation)."""
        if not self.every or frames < self.next_at:
            return False
        self.next_at = (frames // self.every + 1) * self.every
        self.waiting = {p for p in range(len(self.dirs)) if p not in self.in_flight}
        return bool(self.waiting)

    def saved(self, path: str, evaluate: Callable[[int, str], None]) -> None:
        """Checkpoint `path` was saved: `evaluate(its policy, its held file)` if that policy waits for one."""
        folder = os.path.abspath(os.path.dirname(path))
        policy = next((p for p, d in enumerate(self.dirs) if os.path.abspath(d) == folder), None)
        if policy is None or policy not in self.waiting:
            return
        held = checkpoint.hold_for_evaluation(path)
        if held is None:  # rotated away already (two saves in a row): the next checkpoint is evaluated
            return
        self.waiting.discard(policy)
        self.in_flight[policy] = held
        evaluate(policy, held)

    def take(self, report: Report, stats: TrainingStats) -> bool:
        """An evaluation's result (False for any other report): recorded, and best.pt if it is the best."""
        if not isinstance(report, EvalReport):
            return False
        self.in_flight.pop(report.policy, None)
        self._record(report, stats)
        return True

    def finish(self, evaluator: Evaluator | None, stats: TrainingStats, ended_well: bool) -> None:
        """The run ended: evaluate each policy's final weights if it `ended_well` (unless that checkpoint was the
        last one evaluated), and drop the checkpoints held for evaluations that never came."""
        if not self.every:
            return
        try:
            for policy in range(len(self.dirs)):
                if ended_well and evaluator is not None:
                    self._evaluate_final(evaluator, policy, stats)
        except KeyboardInterrupt:  # Ctrl-C during the final evaluation: the summary is still written
            log.warning("the final evaluation was interrupted")
        except Exception as exc:  # noqa: BLE001 - training ended well; its records must still be written
            log.error("the final evaluation failed: %s: %s", type(exc).__name__, exc)
        finally:
            if evaluator is not None:
                evaluator.close()
            for directory in self.dirs:
                checkpoint.drop_held(directory)

    def _evaluate_final(self, evaluator: Evaluator, policy: int, stats: TrainingStats) -> None:
        path = checkpoint.latest_checkpoint(self.dirs[policy])
        last = self.records[policy].get("last")
        if path is None or (last is not None and last["policy_version"] == checkpoint.version_of(path)):
            return  # nothing saved, or those weights were the last evaluated
        held = checkpoint.hold_for_evaluation(path)
        log.info("evaluating the final weights%s: %d episodes", self._of(policy), self.episodes)
        report = evaluator.evaluate_now(policy, held) if held else None
        if report is not None:
            self._record(report, stats)

    def _record(self, report: EvalReport, stats: TrainingStats) -> None:
        returns = np.asarray(report.returns, dtype=np.float64)
        result = {"frames": report.frames, "policy_version": report.version, "mean_return": float(returns.mean()),
                  "std_return": float(returns.std()), "episodes": len(report.returns),
                  "mean_length": float(np.mean(report.lengths)), "seconds": round(report.seconds, 3),
                  **({"episode_metrics": report.metrics} if report.metrics else {})}
        record = self.records[report.policy]
        best = record.get("best")
        is_best = best is None or result["mean_return"] > best["mean_return"]
        if is_best:
            checkpoint.make_best(report.path)
            record["best"] = result
        elif os.path.exists(report.path):
            os.remove(report.path)
        record["last"] = result
        checkpoint.save_evaluations(self.dirs[report.policy], record)
        self._write(stats, report.policy, result)
        log.info("eval%s at %s frames: mean return %.1f ± %.1f over %d episodes%s (%s)", self._of(report.policy),
                 f"{report.frames:,}", result["mean_return"], result["std_return"], result["episodes"],
                 "" if "success_rate" not in report.metrics else f", success {report.metrics['success_rate']:.0%}",
                 "best so far" if is_best else f"best {record['best']['mean_return']:.1f} at "
                                               f"{record['best']['frames']:,} frames")
        stats.evaluation = self.summary()

    def _write(self, stats: TrainingStats, policy: int, result: dict) -> None:
        if stats.writer is None:
            return
        prefix = f"policy_{policy}/eval/" if len(self.dirs) > 1 else "eval/"
        scalars = {k: result[k] for k in ("mean_return", "std_return", "mean_length")}
        for key, value in {**scalars, **result.get("episode_metrics", {})}.items():
            stats.writer.add_scalar(prefix + key, value, result["frames"])  # where the evaluated weights were
        stats.writer.flush()

    def _of(self, policy: int) -> str:
        return f" of policy {policy}" if len(self.dirs) > 1 else ""

    def summary(self) -> dict:
        """training_summary.json's `evaluation`: the last and best evaluation (of each policy, for several)."""
        found = {"every_env_steps": self.every, "episodes": self.episodes}
        if len(self.dirs) == 1:
            return {**found, **self.records[0]}
        return {**found, "policies": [{"policy": k, **record} for k, record in enumerate(self.records)]}
