"""Training statistics: aggregated from component reports, written to TensorBoard and the console."""

from __future__ import annotations

import logging
import time
from collections import deque

import numpy as np

from sf_core.cluster.cluster_stats import ClusterStats
from sf_core.config import Config
from sf_core.contracts.signals import (InferenceReport, LearnerRankReport, LearnerReport, Report, RolloutReport,
                                       SamplerReport, inference_worker_name)
from sf_core.contracts.timing import TimingReport
from sf_core.run.busy_shares import MIN_TENSORBOARD_WINDOW_SEC, BusyShares
from sf_core.run.episode_metrics import EpisodeMetrics
from sf_core.run.fault_log import FaultLog
from sf_core.run.policy_stats import PolicyStats
from sf_core.run.time_accounting import TimeAccounting
from sf_core.run.win_rates import WinRates

log = logging.getLogger("sf_core")


class TrainingStats:
    def __init__(self, window: int, writer=None, started: float | None = None,
                 component_counts: dict[str, int] | None = None, num_policies: int = 1):
        self.started = started or time.time()
        self.policies = [PolicyStats(window) for _ in range(num_policies)]
        self.win_rates = WinRates(num_policies) if num_policies > 1 else None
        self.frames = 0
        self.samples_trained = 0
        self.policy_version = 0
        self.num_episodes = 0
        self.returns: deque[float] = deque(maxlen=window)
        self.lengths: deque[int] = deque(maxlen=window)
        # multi-agent envs: recent returns of each agent index (a competitive game averages to 0 overall)
        self.agent_returns: dict[int, deque[float]] = {}
        self.metrics = EpisodeMetrics(window, num_policies)  # the env's episode_extra_stats and is_success
        self.evaluation: dict = {}  # --eval_every_env_steps: the last and best evaluations (sf_core/run/evaluations.py)
        self.learner: dict[str, float] = {}
        self.fps_history: deque[tuple[float, int]] = deque(maxlen=64)
        self.seconds = {"env_step": 0.0, "inference": 0.0, "learner": 0.0}
        self.inference_versions: dict[str, int] = {}  # per inference worker, at its latest report
        self.inference_batches = 0
        self.inference_requests = 0
        self.first_frame_at: float | None = None
        self.target_reached_at: float | None = None
        # the mean return that met --target_mean_return: episodes finished during the shutdown that
        # follows still enter the window, so the closing mean can dip just under the target
        self.mean_return_at_target: float | None = None
        self.env_faults = 0
        self.worker_restarts = 0  # rollout worker processes that died and were restarted
        self.faults = FaultLog()  # deaths and hangs, and rollout workers replaced alone (sf_core/run/fault_log.py)
        self.checkpoints_saved = 0
        # --env_service: each worker's latest slot counts, and totals of slot failures and re-admissions
        self.service: dict[tuple[int, int], dict[str, int]] = {}  # (sampler, worker) -> its counts
        self.slot_faults = 0
        self.slot_readmissions = 0
        self.interrupted_episodes = 0
        self.elastic = {"slots_joined": 0, "slots_drained": 0, "drain_cut_episodes": 0}  # elastic pools, totals
        self.cluster: ClusterStats | None = None  # --ray_address: frames per node, samplers lost and restarted
        self.previous_seconds: float = 0.0  # training time of earlier sessions of a resumed experiment
        # how many components share each kind of work, to turn busy seconds into a busy fraction
        self.component_counts = component_counts or {"env_step": 1, "inference": 1, "learner": 1}
        self.console_busy = BusyShares(self.component_counts, self.seconds, time.time())
        self.summary_busy = BusyShares(self.component_counts, self.seconds, time.time())
        self.writer = writer
        self.accounting = TimeAccounting()  # where each kind of component's time went, and the start-up
        self.accounting.mark("main_started", self.started)  # sf_core.train's main: its imports done

    @classmethod
    def for_run(cls, cfg: Config, writer, started: float, marks: dict[str, float]) -> "TrainingStats":
        """A run's statistics: how many components share each kind of work, and the runner's start-up `marks`."""
        n = cfg.num_policies
        # --inference_in_rollout_workers: inference is the rollout workers' share of their time spent acting
        acting = cfg.num_workers if cfg.inference_in_rollout_workers else cfg.policy_workers_per_policy * n
        counts = {"env_step": cfg.num_workers, "inference": acting, "learner": n}
        stats = cls(cfg.stats_window, writer, started, counts, n)
        for name, at in marks.items():
            stats.accounting.mark(name, at)
        return stats

    # ---- ingest
    def add(self, report: Report) -> None:
        if isinstance(report, RolloutReport):
            self._add_rollout(report)
        elif isinstance(report, InferenceReport):
            self.seconds["inference"] += report.seconds
            self.inference_batches += report.batches
            self.inference_requests += report.requests
            self.inference_versions[inference_worker_name(report.policy, report.index, len(self.policies))] = \
                report.version
        elif isinstance(report, LearnerReport):
            self.samples_trained += report.samples
            self.seconds["learner"] += report.train_seconds
            policy = self.policies[report.policy]
            policy.samples_trained += report.samples
            policy.version, policy.learner = report.version, report.stats
            self.policy_version = max(p.version for p in self.policies)
            if len(self.policies) == 1:  # several: each policy's are in its own section
                self.learner = report.stats
        elif isinstance(report, TimingReport):
            self.accounting.add(report)
        elif isinstance(report, (SamplerReport, LearnerRankReport)):  # --ray_address
            self.cluster = self.cluster or ClusterStats()
            self.cluster.add(report)
        else:
            raise TypeError(f"unknown report {report!r}")

    def _add_rollout(self, report: RolloutReport) -> None:
        if report.frames and self.first_frame_at is None:
            self.first_frame_at = time.time()
            self.accounting.mark("first_frame", self.first_frame_at)
            # the rate's first point: a run shorter than a console line's interval gets a rate too
            self.fps_history.append((self.first_frame_at, self.frames))
        self.frames += report.frames
        self.seconds["env_step"] += report.env_seconds
        self.seconds["inference"] += report.act_seconds
        self.env_faults += report.env_faults
        if report.service is not None:
            service = report.service
            counts = {**service.slot_counts, "waiting_envs": service.waiting_envs}
            self.service[(report.sampler, report.worker)] = counts
            self.slot_faults += service.slot_faults
            self.slot_readmissions += service.readmitted
            self.interrupted_episodes += service.interrupted_episodes
            for key, n in zip(self.elastic, (service.joined, service.drained, service.drain_cut_episodes)):
                self.elastic[key] += n
        for ret, length, agent, policy in report.episodes:
            self.returns.append(ret)
            self.lengths.append(length)
            self.agent_returns.setdefault(agent, deque(maxlen=self.returns.maxlen)).append(ret)
            self.num_episodes += 1
            stats = self.policies[policy]
            stats.returns.append(ret)
            stats.lengths.append(length)
            stats.episodes += 1
        for policy, value in report.objectives:
            self.policies[policy].objectives.append(value)
        self.metrics.add(report.metrics, report.skipped_metrics)
        if self.win_rates is not None:
            for match in report.matches:
                self.win_rates.add(match)

    # ---- persistence across a resume
    def checkpoint_state(self, best_mean_return: float, policy: int = 0) -> dict:
        """The runner's counters, and what `policy` reached (its own checkpoint keeps it)."""
        policy_stats = {**self.policies[policy].state(), "recent_metrics": self.metrics.state(policy)}
        return {"policy_stats": policy_stats, "frames": self.frames, "samples_trained": self.samples_trained,
                "episodes": self.num_episodes, "policy_version": self.policy_version,
                "env_faults": self.env_faults, "worker_restarts": self.worker_restarts, **self.faults.state(),
                "training_seconds": self.training_seconds(),
                "mean_return": self.mean_return() if self.returns else None,
                "best_mean_return": float(best_mean_return), "recent_returns": [float(r) for r in self.returns],
                "recent_lengths": [int(n) for n in self.lengths], "recent_metrics": self.metrics.state()}

    def restore(self, state: dict) -> None:
        self.frames, self.samples_trained = state["frames"], state["samples_trained"]
        self.num_episodes, self.env_faults = state["episodes"], state["env_faults"]
        self.worker_restarts = state.get("worker_restarts", 0)
        self.faults.restore(state)
        self.policy_version = state["policy_version"]
        self.previous_seconds = state["training_seconds"]
        self.returns.extend(state["recent_returns"])
        self.lengths.extend(state["recent_lengths"])
        self.metrics.restore(state.get("recent_metrics", {}))  # absent in checkpoints of older versions
        self.fps_history.clear()

    def restore_policy(self, policy: int, state: dict) -> None:
        """One policy's part of its own checkpoint's runner state (absent in checkpoints of older versions)."""
        if "policy_stats" in state:
            self.policies[policy].restore(state["policy_stats"])
            self.metrics.restore(state["policy_stats"].get("recent_metrics", {}), policy)

    def objective(self, policy: int, name: str) -> float | None:
        """What PBT ranks `policy` by (--pbt_target_objective); None until it is known."""
        stats = self.policies[policy]
        if name == "episode_return":
            return stats.mean_return()
        if name == "win_rate":
            return self.win_rates.mean_win_rate(policy) if self.win_rates is not None else None
        # a number in the info's top level, else one of its episode_extra_stats (Sample Factory's place for it)
        return float(np.mean(stats.objectives)) if stats.objectives else self.metrics.mean(name, policy)

    def target_reached(self, target: float) -> bool:
        """The mean return of a full window reached `target`: with several policies, every policy's."""
        window = self.returns.maxlen or 0
        if len(self.policies) == 1:
            return len(self.returns) >= window and self.mean_return() >= target
        return all(len(p.returns) >= window and (m := p.mean_return()) is not None and m >= target
                   for p in self.policies)

    def mark_target_reached(self, now: float) -> None:
        """Keeps the means that met --target_mean_return: the closing window may dip after it."""
        self.target_reached_at = now
        self.mean_return_at_target = self.mean_return()
        for p in self.policies:
            p.mean_return_at_target = p.mean_return()

    def best_mean_return(self) -> float | None:
        """The best policy's best mean return at a checkpoint (what its best.pt holds), None before one."""
        best = self.policies[self.best_policy()].best_mean_return
        return best if np.isfinite(best) else None

    def best_policy(self) -> int:
        means = [p.mean_return() for p in self.policies]
        return max(range(len(means)), key=lambda k: float("-inf") if (m := means[k]) is None else m)

    # ---- derived
    def elapsed(self) -> float:
        return time.time() - self.started

    def training_seconds(self) -> float:
        """This session's seconds and those of the sessions it resumed."""
        return self.previous_seconds + self.elapsed()

    def fps(self) -> float:
        now = time.time()
        self.fps_history.append((now, self.frames))
        while len(self.fps_history) > 2 and now - self.fps_history[0][0] > 10.0:
            self.fps_history.popleft()
        (t0, f0), (t1, f1) = self.fps_history[0], self.fps_history[-1]
        return (f1 - f0) / (t1 - t0) if t1 > t0 else 0.0

    def mean_return(self) -> float:
        return float(np.mean(self.returns)) if self.returns else float("nan")

    def agent_mean_returns(self) -> dict[str, float]:
        """Mean recent return per agent index; empty for single-agent envs."""
        if len(self.agent_returns) < 2:
            return {}
        return {str(agent): float(np.mean(r)) for agent, r in sorted(self.agent_returns.items())}

    def summary(self, exit_code: int | None, error: str | None, running: bool = False) -> dict:
        """training_summary.json: rewritten every summary interval while `running`, and once at the end."""
        return {
            "running": running, "exit_code": exit_code, "error": error, "seconds": self.elapsed(),
            "training_seconds": self.training_seconds(), "frames": self.frames,
            "samples_trained": self.samples_trained, "policy_version": self.policy_version,
            "episodes": self.num_episodes, "mean_return": self.mean_return() if self.returns else None,
            "best_mean_return": self.best_mean_return(),
            "mean_length": float(np.mean(self.lengths)) if self.lengths else None,
            "time_to_first_frame": self.first_frame_at - self.started if self.first_frame_at else None,
            # over every session of a resumed experiment, as --train_for_seconds counts
            "time_to_target": (self.previous_seconds + self.target_reached_at - self.started
                               if self.target_reached_at else None),
            "mean_return_at_target": self.mean_return_at_target,
            "component_seconds": dict(self.seconds), "env_faults": self.env_faults,
            "worker_restarts": self.worker_restarts, **self.faults.summary(),
            "checkpoints_saved": self.checkpoints_saved,
            "slot_faults": self.slot_faults, "slot_readmissions": self.slot_readmissions,
            "interrupted_episodes": self.interrupted_episodes, **self.elastic,
            "final_learner_stats": dict(self.learner), "inference_versions": dict(self.inference_versions),
            "agent_mean_returns": self.agent_mean_returns(), "episode_metrics": self.metrics.means(),
            **({"evaluation": self.evaluation} if self.evaluation else {}),
            "time_accounting": self.accounting.summary(), "startup": self.accounting.startup(),
            **self.policy_summary(),
            **({"cluster": self.cluster.summary()} if self.cluster else {}),
        }

    def policy_summary(self) -> dict:
        """training_summary.json's section per policy (runs of several policies)."""
        if len(self.policies) == 1:
            return {}
        found = {"best_policy": self.best_policy(), "policies": [
            {"policy": k, "mean_return": p.mean_return(), "mean_return_at_target": p.mean_return_at_target,
             "episodes": p.episodes, "policy_version": p.version,
             "samples_trained": p.samples_trained, "best_mean_return": p.best_mean_return,
             "final_learner_stats": dict(p.learner), "episode_metrics": self.metrics.means(k)}
            for k, p in enumerate(self.policies)]}
        if self.win_rates is not None:
            found["win_rates"] = self.win_rates.matrix()
            found["games"] = self.win_rates.games()
        return found

    # ---- output
    def write_summaries(self, extra: dict[str, float] | None = None) -> None:
        """TensorBoard scalars now, with `extra` ones (PBT's hyperparameters)."""
        if self.writer is None:
            return
        step, w = self.frames, self.writer
        w.add_scalar("perf/fps", self.fps(), step)
        w.add_scalar("perf/samples_trained", self.samples_trained, step)
        for name, seconds in self.seconds.items():
            w.add_scalar(f"perf/{name}_seconds_total", seconds, step)
        busy = self.summary_busy.take(self.seconds, self._copies(), time.time(), MIN_TENSORBOARD_WINDOW_SEC)
        for name, share in busy.items():  # since the last summary that wrote them (sf_core/run/busy_shares.py)
            w.add_scalar(f"perf/{name}_busy", share, step)
        if self.returns:
            w.add_scalar("episode/return", self.mean_return(), step)
            w.add_scalar("episode/length", float(np.mean(self.lengths)), step)
            w.add_scalar("episode/count", self.num_episodes, step)
            for agent, mean in self.agent_mean_returns().items():
                w.add_scalar(f"episode/return_agent_{agent}", mean, step)
        self.metrics.write(w, step)
        w.add_scalar("faults/env_restarts", self.env_faults, step)
        w.add_scalar("faults/worker_restarts", self.worker_restarts, step)
        self.faults.write(w, step)
        if self.cluster:
            self.cluster.write(w, step)
        if self.service:
            for key, value in self.service_totals().items():
                w.add_scalar(f"service/{key}", value, step)
            w.add_scalar("service/slot_faults_total", self.slot_faults, step)
            w.add_scalar("service/readmissions_total", self.slot_readmissions, step)
            w.add_scalar("service/interrupted_episodes_total", self.interrupted_episodes, step)
        w.add_scalar("perf/training_hours", (self.previous_seconds + self.elapsed()) / 3600, step)
        if len(self.policies) == 1:
            self._write_learner(w, "", self.learner, step)
        else:
            self._write_policies(w, step)
        for tag, figure in (extra or {}).items():
            w.add_scalar(tag, figure, step)
        w.flush()

    @staticmethod
    def _write_learner(w, prefix: str, learner: dict[str, float], step: int) -> None:
        for key, figure in learner.items():
            if key == "policy_lag_mean":
                w.add_scalar(f"{prefix}train/policy_lag", figure, step)
            w.add_scalar(f"{prefix}train/{key}", figure, step)

    def _write_policies(self, w, step: int) -> None:
        for k, policy in enumerate(self.policies):
            prefix = f"policy_{k}/"
            self._write_learner(w, prefix, policy.learner, step)
            w.add_scalar(f"{prefix}perf/samples_trained", policy.samples_trained, step)
            if policy.returns:
                w.add_scalar(f"{prefix}episode/return", float(np.mean(policy.returns)), step)
                w.add_scalar(f"{prefix}episode/length", float(np.mean(policy.lengths)), step)
        if self.win_rates is not None:
            for tag, value in self.win_rates.scalars().items():
                w.add_scalar(tag, value, step)

    def service_totals(self) -> dict[str, int]:
        """Slot counts over all workers: idle (spare), busy, error, stopped, and envs waiting for a slot."""
        keys = ("idle", "busy", "error", "stopped", "joining", "draining", "waiting_envs")
        return {key: sum(s.get(key, 0) for s in self.service.values()) for key in keys}

    def service_line(self) -> str:
        t = self.service_totals()
        line = f" | env slots: {t['busy']} busy, {t['idle']} spare, {t['error']} failed"
        line += "".join(f", {t[key]} {key}" for key in ("joining", "draining") if t[key])
        if t["waiting_envs"]:
            line += f", {t['waiting_envs']} envs waiting (reduced capacity)"
        return line

    def busy_fractions(self) -> dict[str, float]:
        """Share of wall time each kind of component spent working since the last line; empty when no component
        reported in between (the final line, printed right after another)."""
        return self.console_busy.take(self.seconds, self._copies(), time.time())

    def _copies(self) -> dict[str, int]:
        samplers = max(1, self.cluster.live_samplers()) if self.cluster else 1  # --ray_address: workers × samplers
        return {"env_step": samplers, "inference": samplers, "learner": 1}

    def bottleneck_hint(self) -> str:
        busy = self.busy_fractions()
        if not busy:
            return "busy: no report since the last line"
        kind = max(busy, key=lambda k: busy[k])
        names = {"env_step": "env stepping", "inference": "inference", "learner": "learner"}
        shares = ", ".join(f"{names[k]} {v:.0%}" for k, v in busy.items())
        if busy[kind] < 0.5:
            return f"busy: {shares} (no component saturated: more envs per worker may help)"
        return f"busy: {shares} -> bottleneck: {names[kind]}"

    def console_line(self) -> str:
        lags = [p.learner["policy_lag_mean"] for p in self.policies if "policy_lag_mean" in p.learner]
        lag = float(np.mean(lags)) if lags else float("nan")
        ret = f"{self.mean_return():.1f}" if self.returns else "n/a"
        several = len(self.policies) > 1  # then each policy's version is in its own part, at the end
        version = f"policies' lag {lag:.1f}" if several else f"policy v{self.policy_version} lag {lag:.1f}"
        line = (f"[{self.elapsed():6.1f}s] frames {self.frames:,} | fps {self.fps():,.0f} | "
                f"return {ret} (last {len(self.returns)} of {self.num_episodes} episodes) | "
                f"{version} | trained {self.samples_trained:,}{self.metrics.console()} | "
                f"{self.bottleneck_hint()}" + (self.service_line() if self.service else "") + self.faults.console()
                + (self.cluster.line() if self.cluster else ""))
        if several:
            means = [p.mean_return() for p in self.policies]
            line += " | per policy: " + ", ".join(
                f"policy {k} return {'n/a' if m is None else f'{m:.1f}'} at v{p.version}"
                for k, (m, p) in enumerate(zip(means, self.policies)))
        return line

    def policy_report(self) -> list[str]:
        """The console's closing lines of a multi-policy run: each policy, and the win rates of a 2-player game."""
        if len(self.policies) == 1:
            return []
        lines = [f"policy {k}: mean return {p.mean_return() if p.returns else float('nan'):.2f} over "
                 f"{len(p.returns)} recent of {p.episodes} episodes, version {p.version}"
                 for k, p in enumerate(self.policies)]
        if self.win_rates is not None:
            lines += self.win_rates.console_lines()
        return lines
