"""What the driver knows of the cluster: frames per node and per sampler, every sampler lost, waiting for room
or started, how many are live, and where the learner ranks run. Shown in the console line, TensorBoard
(cluster/...) and training_summary.json's "cluster" section."""

from __future__ import annotations

from sf_core.contracts.signals import LearnerRankReport, SamplerReport


class ClusterStats:
    def __init__(self) -> None:
        self.node_frames: dict[str, int] = {}
        self.sampler_frames: dict[tuple[int, int], int] = {}  # (sampler, incarnation) -> frames
        self.sampler_nodes: dict[tuple[int, int], str] = {}
        self.started_with: dict[tuple[int, int], tuple[int, ...]] = {}  # each policy's version a start began from
        self.oldest: dict[tuple[int, int], dict[int, int]] = {}  # per policy: the oldest version in its shards
        self.restarts = 0
        self.events: list[dict] = []  # every start after the first and every loss, in order
        self.shards = 0
        self.live: set[tuple[int, int]] = set()  # (sampler, incarnation) started (answering) and not lost
        self.wanted: set[int] = set()  # every sampler index started once: the run's full count
        self.fewest: int | None = None  # the fewest live at once after a loss
        self.learner_ranks: dict[int, str] = {}  # --num_learners: rank (≥ 1) -> its node

    def add(self, report: SamplerReport | LearnerRankReport) -> None:
        if isinstance(report, LearnerRankReport):
            self.learner_ranks[report.rank] = report.node
            return
        key = (report.sampler, report.incarnation)
        if report.event == "shard":
            self.shards += 1
            self.node_frames[report.node] = self.node_frames.get(report.node, 0) + report.frames
            self.sampler_frames[key] = self.sampler_frames.get(key, 0) + report.frames
            self.sampler_nodes[key] = report.node
            oldest = self.oldest.setdefault(key, {})
            oldest[report.policy] = min(oldest.get(report.policy, report.version), report.version)
            return
        if report.event == "started":
            self.live.add(key)
            self.wanted.add(report.sampler)
            self.started_with[key] = report.versions
            self.restarts += report.incarnation > 0
        elif report.event == "lost":
            self.live.discard(key)
            self.fewest = min(len(self.live), self.fewest if self.fewest is not None else len(self.live))
        if report.event != "started" or report.incarnation > 0:
            self.events.append({"event": report.event, "sampler": report.sampler, "incarnation": report.incarnation,
                                "node": report.node, "detail": report.detail})

    def live_samplers(self) -> int:
        return len(self.live)

    def summary(self) -> dict:
        return {
            "node_frames": dict(self.node_frames),
            "samplers": [{"sampler": s, "incarnation": i, "node": self.sampler_nodes.get((s, i), ""), "frames": f,
                          "started_with_versions": list(self.started_with.get((s, i), ())),
                          "oldest_versions": [self.oldest.get((s, i), {}).get(p)
                                              for p in range(len(self.started_with.get((s, i), ())))]}
                         for (s, i), f in sorted(self.sampler_frames.items())],
            "sampler_restarts": self.restarts, "events": list(self.events), "shards": self.shards,
            "live_samplers": len(self.live), "fewest_live_samplers": self.fewest_live(),
            "learner_ranks": {str(rank): node for rank, node in sorted(self.learner_ranks.items())},
        }

    def fewest_live(self) -> int:
        return self.fewest if self.fewest is not None else len(self.live)

    def line(self) -> str:
        return (f" | nodes {len(self.node_frames)}, samplers {len(self.live)}/{len(self.wanted)} live, "
                f"sampler restarts {self.restarts}")

    def write(self, writer, step: int) -> None:
        for node, frames in self.node_frames.items():
            writer.add_scalar(f"cluster/frames_node_{node[:8]}", frames, step)
        writer.add_scalar("cluster/sampler_restarts", self.restarts, step)
        writer.add_scalar("cluster/live_samplers", len(self.live), step)
