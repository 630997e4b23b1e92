"""The driver's learner group on a cluster (--num_learners with --ray_address): ranks 1..N-1 as Ray actors on
the cluster's nodes, rank 0 the driver's learner.

The ranks are placed together, one placement group of N-1 bundles packed on as few nodes as fit: a CPU
bundle of --learner_cpus, one GPU each under --device=cuda (Ray then hands each actor its own GPU, which it
sees as cuda:0), and any --learner_resources (custom resources, to pin them to nodes started with
`ray start --resources=...`). A rank never reads the driver's memory or files: rank 0 sends it its start
(weights, optimizer state) and its share of every dataset (sf_core/learning/group/).

A rank is not restarted: the group's collectives cannot go on without it, so a lost rank stops the run
(rank 0's next collective fails, and the ingest names the rank Ray lost), and the run resumes from its
last checkpoint (--restart_behavior=resume), as after any failure. Every Ray call here is bounded in time.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch

from sf_core.cluster import placement
from sf_core.cluster.flags import parse_resources
from sf_core.cluster.sampler import take_niceness
from sf_core.common.logs import setup_logging
from sf_core.config import Config
from sf_core.learning.group.followers import rank_name, train_as_follower
from sf_core.learning.group.link import GroupError, GroupSpec
from sf_core.learning.learner import Trainer

STOP_WAIT_SEC = 3.0  # for the ranks to leave the group on rank 0's stop, before their actors are ended


class LearnerRank:
    """Rank `rank` ≥ 1 of the driver's learner group, as a Ray actor. `run` trains until rank 0 says stop."""

    def __init__(self, rank: int, spec: GroupSpec, trainer: Trainer, niceness: int, torch_threads: int):
        import ray

        setup_logging()
        take_niceness(niceness)  # Ray's nice 15 would lose every contest for a core to a sampler beside it
        torch.set_num_threads(torch_threads)
        self.rank, self.spec, self.trainer = rank, spec, trainer
        self.node = ray.get_runtime_context().get_node_id()

    def node_id(self) -> str:
        return self.node

    def run(self) -> None:
        train_as_follower(self.rank, self.spec, self.trainer)


@dataclass
class RemoteRanks:
    """The driver's handle on ranks 1..N-1: started by the ingest (the run's Ray driver) once it joined the
    cluster; what Ray tells of them is queued by Ray's threads and taken on the ingest's loop."""

    cfg: Config
    spec: GroupSpec
    trainer: Trainer  # rank 0's, not built: each rank builds one like it on its own device
    niceness: int
    handles: list = field(default_factory=list)
    runs: list = field(default_factory=list)  # each rank's run() call
    placed_on: deque = field(default_factory=deque)  # (rank, node), once Ray says where
    failed: deque = field(default_factory=deque)  # (rank, what Ray said)

    def start(self) -> None:
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        bundle = self.bundle()
        count = self.spec.size - 1
        group = placement.place_bundles([bundle] * count, "PACK", f"{count} learner rank(s) of {bundle}")
        for rank in range(1, self.spec.size):
            strategy = PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=rank - 1)
            options = dict(num_cpus=bundle["CPU"], num_gpus=bundle.get("GPU", 0),
                           resources={k: v for k, v in bundle.items() if k not in ("CPU", "GPU")},
                           max_restarts=0, max_task_retries=0, scheduling_strategy=strategy)
            trainer = self.trainer.on_device(self.spec.devices[rank])
            handle = ray.remote(LearnerRank).options(**options).remote(rank, self.spec, trainer, self.niceness,
                                                                       self.cfg.learner_threads())
            handle.node_id.remote().future().add_done_callback(lambda node, r=rank: self._placed(r, node))
            run = handle.run.remote()
            run.future().add_done_callback(lambda done, r=rank: self._ended(r, done))
            self.handles.append(handle)
            self.runs.append(run)

    def bundle(self) -> dict[str, float]:
        """What each rank reserves on its node."""
        bundle = {"CPU": self.cfg.learner_cpus, **parse_resources(self.cfg.learner_resources)}
        if self.spec.devices[-1].startswith("cuda"):
            bundle["GPU"] = 1
        return bundle

    def _placed(self, rank: int, node: Any) -> None:
        """On a thread of Ray's."""
        if node.exception() is None:
            self.placed_on.append((rank, node.result()))

    def _ended(self, rank: int, done: Any) -> None:
        """On a thread of Ray's: a rank's run() returned (rank 0 said stop), raised, or its actor (or node) died.
        A rank whose collective failed only echoes the loss of another (rank 0's is named by the runner)."""
        import ray

        error = done.exception()
        if error is None or (isinstance(error, ray.exceptions.RayTaskError) and GroupError.MARK in str(error)):
            return
        lines = str(error).strip().splitlines() or [type(error).__name__]
        if isinstance(error, ray.exceptions.RayActorError):  # Ray's account runs on: its first sentence
            self.failed.append((rank, f"its actor is gone: {lines[-1].split('. ')[0]}"))
        else:
            self.failed.append((rank, lines[-1]))

    def stop(self) -> None:
        """Give the ranks a moment to leave the group on rank 0's stop, then end their actors. Never raises."""
        placement.end_actors(self.handles, self.runs, STOP_WAIT_SEC)


def failure_message(rank: int, node: str, detail: str) -> tuple[str, str]:
    """The component name and the details the runner stops with when rank `rank` failed."""
    return rank_name(rank), f"learner rank {rank} (a Ray actor on node {node[:8] or '?'}): {detail}"
