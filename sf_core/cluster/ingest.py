"""Shard ingest: the driver's side of a cluster run (--ray_address), and the run's Ray driver. Takes shards from
the samplers into the learner's datasets, sends each new weights version to every sampler, and replaces
samplers that are lost. With --num_learners > 1 it also starts the learner group's other ranks on the
cluster (sf_core/cluster/learner_ranks.py) and names one Ray loses.

Signals in: batch_consumed, shards_arrived, stop. Out: batch_ready, report (sf_core/contracts/signals.py).

With --num_policies, each policy has its learner, its datasets and its weights; a shard names its policy,
and `PolicyPort` p stands where policy p's batcher stands on one machine: the sender of its learner's
batch_ready and the receiver of its batch_consumed.

Each sampler has at most --shards_in_flight shards (per policy) asked for (`next_shard` calls under way) or taken and
waiting for a free dataset: the driver never holds more than that of any node, and the emitter on the node
stops sampling while its outbox is full (sf_core/cluster/shard_emitter.py). Nothing polls Ray: each call's
completion callback (on one of Ray's threads) queues the answer and wakes the loop with shards_arrived, and
each batch_consumed (the learner has just published new weights) sends the weights on. A slow timer only
keeps the heartbeat, gives up calls Ray never answers, and notices silence. Polling, at 50 Hz, took a
tenth of a core and woke Ray's daemons hundreds of times a second (docs/distributed.md, "Measured").

A sampler that raises, whose process or node dies, whose shard's object is lost, or that answers no call for
--heartbeat_timeout seconds (a hung process, or a node cut off), is dropped with the shards it had in flight
(whole datasets: no trajectory mixes rows of two starts) and a new one is started with the newest weights,
up to --max_sampler_restarts, as soon as some node has room for it (it waits for one otherwise:
sf_core/cluster/sampler_starts.py). A sampler is asked for shards once it has answered. Training goes on
with the others meanwhile. If no shard arrives for --heartbeat_timeout seconds, or the cluster is gone, the
run stops with that message (the learner saves a checkpoint on the way down).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any

from sf_core.cluster import placement
from sf_core.cluster.learner_ranks import RemoteRanks, failure_message
from sf_core.cluster.sampler import STOP_GRACE_SEC, SamplerSpec
from sf_core.cluster.sampler_starts import START_TIMEOUT_SEC, WAIT_REPORT_SEC, SamplerStarts, Start
from sf_core.cluster.shards import Shard, copy_into
from sf_core.config import Config
from sf_core.contracts.buffers import DatasetBuffers, SharedWeights
from sf_core.contracts.component import Component, guarded
from sf_core.contracts.control import ControlBlock
from sf_core.contracts.signals import (BATCH_READY, COMPONENT_ERROR, REPORT, SHARDS_ARRIVED, LearnerRankReport,
                                       RolloutReport, SamplerReport)
from sf_core.service.training import share_among_samplers
from signal_slot.signal_slot import EventLoop, EventLoopObject, Timer

log = logging.getLogger("sf_core")

TICK_SEC = 0.25  # the housekeeping timer: heartbeat, calls given up, silence
NEXT_SHARD_TIMEOUT_SEC = 2.0  # how long one next_shard call waits on the node before answering None
# A call unanswered this long after its own timeout is given up, as a lost shard: Ray (2.60) has been seen,
# once in a few runs of minutes, to disown a result it still owed ("owner is unknown")
UNANSWERED_SEC = NEXT_SHARD_TIMEOUT_SEC + 10.0
STOP_TIMEOUT_SEC = 2 * STOP_GRACE_SEC + 2.0  # Sampler.stop's own bounds, and a little


@dataclass(eq=False)  # one per sampler start: compared by identity
class SamplerState:
    index: int
    incarnation: int
    handle: Any  # the Ray actor handle (ray.actor.ActorHandle: typed by Ray at run time only)
    asked: dict = field(default_factory=dict)  # next_shard calls under way: ObjectRef -> when asked
    held: int = 0  # shards taken, waiting for a dataset or in one the learner has not yet trained on
    node: str = "?"
    weights_calls: dict[int, Future] = field(default_factory=dict)  # per policy: the set_weights call under way
    weights_sent: list[int] = field(default_factory=list)  # per policy: the newest version sent
    answered_at: float = field(default_factory=time.monotonic)  # its last answer (or the last tick with no call)


class PolicyPort(EventLoopObject):
    """Policy p's end of the ingest, on the ingest's loop: its learner's datasets come from here."""

    def __init__(self, loop: EventLoop, ingest: "ShardIngest", policy: int):
        super().__init__(loop, f"shard_ingest_port_{policy}")  # every policy has one, even alone
        self.ingest, self.policy = ingest, policy

    def batch_consumed(self, index: int) -> None:
        self.ingest.batch_consumed(self.policy, index)


class ShardIngest(Component):
    def __init__(self, loop: EventLoop, cfg: Config, datasets: list[DatasetBuffers], weights: list[SharedWeights],
                 spec: SamplerSpec, control: ControlBlock | None, ranks: RemoteRanks | None = None):
        super().__init__(loop, "shard_ingest", control)
        self.cfg, self.datasets, self.weights, self.spec = cfg, datasets, weights, spec
        self.ranks = ranks  # the learner group's ranks on the cluster
        self.rank_nodes: dict[int, str] = {}
        self.ports = [PolicyPort(loop, self, p) for p in range(len(datasets))]
        self.samplers: list[SamplerState] = []
        self.arrived: deque[tuple[SamplerState, Any, Future]] = deque()  # answers queued by Ray's threads
        self.waiting: deque[tuple[SamplerState, Shard]] = deque()  # taken, for the next free dataset of its policy
        self.free = [deque(range(len(d))) for d in datasets]
        self.filled_by: list[dict[int, SamplerState]] = [{} for _ in datasets]  # per policy: dataset -> whose shard
        self.group = None
        self.weights_refs: list[Any] = [None] * len(weights)
        self.weights_versions = [-1] * len(weights)
        self.restarts = 0
        self.count = 0  # samplers the run has when every one is live
        self.starts = SamplerStarts(self._launch, lambda bundles: placement.room(self.cfg, self.group, bundles),
                                    self._wake)
        self.last_shard_at = time.monotonic()
        self.stopped = False  # a slot queued behind stop must not touch Ray (a Ray call would start a new one)
        loop.start.connect(self.on_start)

    @guarded
    def on_start(self) -> None:
        self.beat("joining the Ray cluster")
        placement.connect(self.cfg)
        if self.ranks is not None:  # first: rank 0 (the learner) waits for them to join
            self.ranks.start()
        self.count = count = placement.sampler_count(self.cfg)
        self._share_services(count)
        self.group = placement.place(self.cfg, count)
        self._publish_weights()
        for index in range(count):
            self.starts.begin(Start(index, 0), placement.in_bundle(self.group, index))
        self.last_shard_at = time.monotonic()
        self.timer = Timer(self.event_loop, TICK_SEC, object_id="shard_ingest_tick")
        self.timer.timeout.connect(self.tick)
        self._ask_all()

    def _share_services(self, count: int) -> None:
        """--env_service slots go to every sampler's workers: refuse, before any starts, slots too few for them."""
        share_among_samplers(self.cfg, count)
        self.spec = replace(self.spec, count=count)

    def _launch(self, start: Start, strategy: Any) -> None:
        """Create `start`'s actor, placed by `strategy`, with each policy's newest weights."""
        spec = replace(self.spec, index=start.index, incarnation=start.incarnation,  # no two starts share env seeds
                       seed=self.spec.seed + 7919 * start.index + 104729 * start.incarnation)
        start.versions = list(self.weights_versions)
        start.handle = placement.start_sampler(self.cfg, spec, self.weights_refs, self.weights_versions, strategy)

    def _wake(self) -> None:
        if not self.stopped:
            SHARDS_ARRIVED.emit(self)

    def _started(self, start: Start, answer: Future) -> None:
        """A start's first answer: the sampler is live (asked for shards from now on), or it failed to start."""
        try:
            node = answer.result(timeout=0)
        except Exception as exc:  # noqa: BLE001 - its constructor raised, or its node died under it
            self._lose(start.index, start.incarnation, "?", start.handle, exc)
            return
        self.samplers.append(SamplerState(start.index, start.incarnation, start.handle, node=node,
                                          weights_sent=list(start.versions)))
        REPORT.emit(self, SamplerReport(start.index, start.incarnation, node, 0, "started",
                                        versions=tuple(start.versions)))
        if start.incarnation > 0:
            log.info("sampler %d (start %d) runs on node %s, %.0fs after its loss: %d of %d samplers live",
                     start.index, start.incarnation, node[:8], time.monotonic() - start.wanted_at,
                     len(self.samplers), self.count)

    def _place_starts(self) -> None:
        """Start the replacements that have room now; say which found none (they wait)."""
        begun, waiting = self.starts.place(time.monotonic())
        for start, strategy in begun:
            log.info("sampler %d (start %d) starting %s%s", start.index, start.incarnation,
                     "on a node with room" if strategy == "SPREAD" else "in its placement bundle",
                     f", after {time.monotonic() - start.wanted_at:.0f}s waiting for room" if start.reported else "")
        for start in waiting:
            log.warning("sampler %d's replacement waits for a Ray node with room for it (--sampler_cpus=%g): "
                        "none has had any for %.0fs; training goes on with %d of %d samplers", start.index,
                        self.cfg.sampler_cpus, WAIT_REPORT_SEC, len(self.samplers), self.count)
            REPORT.emit(self, SamplerReport(start.index, start.incarnation, "", 0, "waiting", "no node has room"))

    # ---------------------------------------------------------------- asking and taking
    def _ask_all(self) -> None:
        """Shard calls up to the bound, and the newest weights to every sampler that can take them: inside a
        shard call going out now, or else in a call of their own."""
        for s in list(self.samplers):
            try:
                while len(s.asked) + s.held < self.shard_bound():
                    self._ask(s)
                self._send_weights(s)
            except Exception as exc:  # noqa: BLE001 - Ray refusing a call to it: the sampler is as good as lost
                self._replace(s, exc)

    def shard_bound(self) -> int:
        """Shards a sampler may have asked for or held: --shards_in_flight per policy, and the one its learner is
        training on. A shard counts until trained on, so the call that replaces it goes out when the learner
        is done with it, with the weights it just made."""
        return (self.cfg.shards_in_flight + 1) * len(self.datasets)

    def _ask(self, s: SamplerState) -> None:
        """A next_shard call, carrying a policy's newest weights if the sampler lacks them: a Ray call costs the
        node and the driver over a millisecond of CPU each (docs/distributed.md), whatever it carries."""
        due = [p for p, version in enumerate(self.weights_versions) if s.weights_sent[p] != version]
        if due:
            p = due[0]
            ref = s.handle.next_shard.remote(NEXT_SHARD_TIMEOUT_SEC, self.weights_refs[p], self.weights_versions[p], p)
            s.weights_sent[p] = self.weights_versions[p]
        else:
            ref = s.handle.next_shard.remote(NEXT_SHARD_TIMEOUT_SEC)
        s.asked[ref] = time.monotonic()
        ref.future().add_done_callback(lambda answer: self._on_answer(s, ref, answer))

    def _on_answer(self, s: SamplerState, ref: Any, answer: Future) -> None:
        """On a thread of Ray's: queue the answer and wake the loop (deque.append is atomic)."""
        if not self.stopped:
            self.arrived.append((s, ref, answer))
            SHARDS_ARRIVED.emit(self)

    @guarded
    def shards_arrived(self) -> None:
        if self.stopped:
            return
        for start, answer in self.starts.take_answers():
            self._started(start, answer)
        while self.arrived:
            self._take(*self.arrived.popleft())
        self._fill_datasets()
        self._ask_all()

    def _take(self, s: SamplerState, ref: Any, answer: Future) -> None:
        if s.asked.pop(ref, None) is None or s not in self.samplers:
            return  # given up already, or a late answer of a sampler already replaced
        s.answered_at = time.monotonic()
        try:
            shard = answer.result(timeout=0)
        except placement.lost_errors() as exc:
            self._replace(s, exc)
            return
        except Exception as exc:  # noqa: BLE001 - a result Ray disowned (see UNANSWERED_SEC)
            log.warning("a shard of sampler %d was dropped: %s", s.index, str(exc).split(".")[0])
            return
        if shard is None:
            return  # nothing was ready on the node within the call's timeout
        s.node, s.held = shard.meta.node, s.held + 1
        self.waiting.append((s, shard))
        self.last_shard_at = time.monotonic()

    def _fill_datasets(self) -> None:
        """Each waiting shard, oldest first, into a free dataset of its policy (one policy's learner being
        busy does not hold back another's shards)."""
        kept: deque[tuple[SamplerState, Shard]] = deque()
        while self.waiting:
            s, shard = self.waiting.popleft()
            meta = shard.meta
            if not self.free[meta.policy]:
                kept.append((s, shard))
                continue
            index = self.free[meta.policy].popleft()
            self.filled_by[meta.policy][index] = s
            copy_into(self.datasets[meta.policy][index], shard.arrays)
            for report in meta.reports:
                tagged = replace(report, sampler=meta.sampler) if isinstance(report, RolloutReport) else report
                REPORT.emit(self, tagged)
            REPORT.emit(self, SamplerReport(meta.sampler, meta.incarnation, meta.node, meta.frames(),
                                            version=shard.versions()[0], policy=meta.policy))
            BATCH_READY.emit(self.ports[meta.policy], index)
        self.waiting = kept

    @guarded
    def batch_consumed(self, policy: int, index: int) -> None:
        """Policy `policy`'s learner trained on its dataset `index` and published the weights it made (called
        by that policy's port)."""
        self.free[policy].append(index)
        s = self.filled_by[policy].pop(index, None)
        if s is not None:
            s.held -= 1
        if self.stopped:
            return
        self._publish_weights()
        self._fill_datasets()
        self._ask_all()

    @guarded
    def tick(self) -> None:
        if self.stopped:
            return
        self.beat("taking shards")
        now = time.monotonic()
        for s in list(self.samplers):
            if not s.asked:
                s.answered_at = now  # nothing asked of it: its silence says nothing
            elif now - s.answered_at > self.cfg.heartbeat_timeout:  # each call answers within seconds
                self._replace(s, TimeoutError(f"it answered no call for {now - s.answered_at:.0f}s "
                                              f"(--heartbeat_timeout): hung, or its node cut off"))
                continue
            for ref, asked_at in list(s.asked.items()):
                if now - asked_at > UNANSWERED_SEC:
                    log.warning("a shard request to sampler %d was dropped: no answer in %.0fs", s.index,
                                now - asked_at)
                    del s.asked[ref]
        self._publish_weights()
        self._ask_all()
        self._watch_starts(now)
        if self.ranks is not None:
            self._watch_ranks()
        silent = now - self.last_shard_at
        if silent > self.cfg.heartbeat_timeout:
            waiting = f", {len(self.starts.waiting)} samplers waiting for room" if self.starts.waiting else ""
            raise RuntimeError(f"no sampler delivered a shard for {silent:.0f}s (--heartbeat_timeout="
                               f"{self.cfg.heartbeat_timeout:g}); Ray nodes alive: {len(placement.alive_nodes())}"
                               f"{waiting}")

    # ---------------------------------------------------------------- weights
    def _publish_weights(self) -> None:
        for p, weights in enumerate(self.weights):
            version = weights.current_version()
            if version != self.weights_versions[p]:
                # copied under the lock, put outside it: a put that blocks (a cluster going away) or a process
                # Ray ends inside it must not leave the lock held, and the learner waiting on it for ever
                with weights.lock:
                    arrays = {name: tensor.numpy().copy() for name, tensor in weights.tensors.items()}
                self.weights_refs[p] = placement.put_weights(arrays)
                self.weights_versions[p] = version

    def _send_weights(self, s: SamplerState) -> None:
        """Each policy's newest version, unless this sampler has it or is still taking an older one."""
        for p, version in enumerate(self.weights_versions):
            call = s.weights_calls.get(p)
            if (call is None or call.done()) and s.weights_sent[p] != version:
                s.weights_calls[p] = s.handle.set_weights.remote(self.weights_refs[p], version, p).future()
                s.weights_sent[p] = version

    # ---------------------------------------------------------------- faults
    def _watch_starts(self, now: float) -> None:
        """Replacements waiting for room start once there is some; a start that never answers is lost."""
        self._place_starts()
        for start in self.starts.still_waiting(now):
            log.warning("sampler %d's replacement still waits for room (%.0fs): %d of %d samplers live",
                        start.index, now - start.wanted_at, len(self.samplers), self.count)
        for start in self.starts.overdue(now):
            self._lose(start.index, start.incarnation, "?", start.handle,
                       TimeoutError(f"its actor did not answer within {START_TIMEOUT_SEC:.0f}s of its creation"))

    def _watch_ranks(self) -> None:
        """Where each learner rank runs, once Ray says; a rank Ray lost stops the run, named (rank 0's next
        collective fails too, with less to say)."""
        assert self.ranks is not None
        while self.ranks.placed_on:
            rank, node = self.ranks.placed_on.popleft()
            self.rank_nodes[rank] = node
            log.info("learner rank %d runs on node %s", rank, node[:8])
            REPORT.emit(self, LearnerRankReport(rank, node))
        while self.ranks.failed:
            rank, detail = self.ranks.failed.popleft()
            name, details = failure_message(rank, self.rank_nodes.get(rank, ""), detail)
            log.error("%s: %s", name, details)
            COMPONENT_ERROR.emit(self, name, details)

    def _replace(self, s: SamplerState, error: BaseException) -> None:
        self.samplers.remove(s)
        s.asked.clear()
        self.waiting = deque((o, shard) for o, shard in self.waiting if o is not s)
        self._lose(s.index, s.incarnation, s.node, s.handle, error)

    def _lose(self, index: int, incarnation: int, node: str, handle: Any, error: BaseException) -> None:
        """Sampler `index`'s start `incarnation` is lost (live or starting): end its actor, and want a
        replacement, which starts when some node has room."""
        detail = str(error).strip().splitlines()[-1] if str(error).strip() else type(error).__name__
        log.warning("sampler %d (start %d, node %s) lost: %s", index, incarnation, node[:8], detail)
        REPORT.emit(self, SamplerReport(index, incarnation, node, 0, "lost", detail))
        placement.stop_samplers([handle], timeout=0.0)
        if self.restarts >= self.cfg.max_sampler_restarts:
            if not self.samplers and not self.starts:
                raise RuntimeError(f"every sampler is lost and --max_sampler_restarts={self.cfg.max_sampler_restarts} "
                                   f"were used; the last one: {detail}")
            log.warning("--max_sampler_restarts=%d reached: going on with %d samplers",
                        self.cfg.max_sampler_restarts, len(self.samplers) + len(self.starts))
            return
        self.restarts += 1
        self.starts.want(Start(index, incarnation + 1))
        self._place_starts()

    @guarded
    def stop(self) -> None:
        import ray

        self.beat("stopping the samplers")
        self.stopped = True
        if self.ranks is not None:
            self.ranks.stop()
        # a start under way too: its stop call runs once its constructor is done, and unlinks its weights
        # lock's name (sampler._unlink), which a kill mid-start would leave in /dev/shm
        handles = [s.handle for s in self.samplers] + self.starts.handles()
        if handles:
            placement.stop_samplers(handles, STOP_TIMEOUT_SEC)
        if ray.is_initialized():
            ray.shutdown()
        self.stop_loop()
