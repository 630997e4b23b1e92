"""Shard ingest: the driver's side of a cluster run (--ray_address). Takes shards from the samplers into the
learner's datasets, sends each new weights version to every sampler, and replaces samplers that are lost.

Signals in: batch_consumed, stop. Out: batch_ready, report (sf_core/signals.py).

Each sampler has at most --shards_in_flight shards asked for (`next_shard` calls under way) or taken and
waiting for a free dataset: the driver never holds more than that of any node, and the emitter on the node
stops sampling while its outbox is full (sf_core/cluster/shard_emitter.py). A tick of a short timer waits
in `ray.wait` for the first shard to answer, but only briefly, and not at all while a shard waits for a
free dataset: so a shard is taken as it arrives, and batch_consumed and stop are answered soon.

A sampler that raises, whose process or node dies, or whose shard's object is lost, is dropped with the
shards it had in flight (whole datasets: no trajectory mixes rows of two starts) and a new one is started
with the newest weights, up to --max_sampler_restarts. Training goes on with the others meanwhile. If no
shard arrives for --heartbeat_timeout seconds, or the cluster is gone, the run stops with that message
(the learner saves a checkpoint on the way down).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any

from sf_core.buffers import DatasetBuffers, SharedWeights
from sf_core.cluster import placement
from sf_core.cluster.sampler import SamplerSpec
from sf_core.cluster.shards import Shard, copy_into
from sf_core.component import Component, guarded
from sf_core.config import Config
from sf_core.control import ControlBlock
from sf_core.signals import BATCH_READY, REPORT, SamplerReport
from signal_slot.signal_slot import EventLoop, Timer

log = logging.getLogger("sf_core")

TICK_SEC = 0.02  # how often the loop turns to Ray
WAIT_SEC = 0.015  # how long a turn may wait for a shard (none waits then for a dataset): it is taken on arrival
NEXT_SHARD_TIMEOUT_SEC = 2.0  # how long one next_shard call waits on the node before answering None
STOP_TIMEOUT_SEC = 3.0


@dataclass(eq=False)  # one per sampler start: compared by identity
class SamplerState:
    index: int
    incarnation: int
    handle: Any  # the Ray actor handle (ray.actor.ActorHandle: typed by Ray at run time only)
    asked: list = field(default_factory=list)  # next_shard calls under way
    held: int = 0  # shards taken, waiting for a dataset
    node: str = "?"
    weights_call: Any = None  # the set_weights call under way, if any
    weights_sent: int = -1


class ShardIngest(Component):
    def __init__(self, loop: EventLoop, cfg: Config, datasets: DatasetBuffers, weights: SharedWeights,
                 spec: SamplerSpec, control: ControlBlock | None):
        super().__init__(loop, "shard_ingest", control)
        self.cfg, self.datasets, self.weights, self.spec = cfg, datasets, weights, spec
        self.samplers: list[SamplerState] = []
        self.waiting: deque[tuple[SamplerState, Shard]] = deque()  # taken, for the next free dataset
        self.free = deque(range(len(datasets)))
        self.group = None
        self.weights_ref, self.weights_version = None, -1
        self.restarts = 0
        self.last_shard_at = time.monotonic()
        self.stopped = False  # a tick queued behind stop must not touch Ray (a Ray call would start a new one)
        loop.start.connect(self.on_start)

    @guarded
    def on_start(self) -> None:
        self.beat("joining the Ray cluster")
        placement.connect(self.cfg)
        count = placement.sampler_count(self.cfg)
        self.group = placement.place(self.cfg, count)
        self._publish_weights()
        for index in range(count):
            self.samplers.append(self._start(index, 0, bundle=index))
        self.last_shard_at = time.monotonic()
        self.timer = Timer(self.event_loop, TICK_SEC, object_id="shard_ingest_tick")
        self.timer.timeout.connect(self.tick)

    def _start(self, index: int, incarnation: int, bundle: int = -1) -> SamplerState:
        spec = replace(self.spec, index=index, incarnation=incarnation,
                       seed=self.spec.seed + 7919 * index + 104729 * incarnation)  # no two starts share env seeds
        handle = placement.start_sampler(self.cfg, spec, self.weights_ref, self.weights_version,
                                         self.group if bundle >= 0 else None, bundle)
        state = SamplerState(index, incarnation, handle, weights_sent=self.weights_version)
        REPORT.emit(self, SamplerReport(index, incarnation, "", 0, "started", version=self.weights_version))
        return state

    # ---------------------------------------------------------------- the poll
    @guarded
    def tick(self) -> None:
        if self.stopped:
            return
        self.beat("taking shards")
        asked = {ref: s for s in self.samplers for ref in s.asked}
        for ref in self._answered(list(asked), wait=0.0 if self.waiting else WAIT_SEC):
            self._take(asked[ref], ref)
        self._fill_datasets()
        self._publish_weights()
        for s in list(self.samplers):
            try:
                self._send_weights(s)
                while len(s.asked) + s.held < self.cfg.shards_in_flight:
                    s.asked.append(s.handle.next_shard.remote(NEXT_SHARD_TIMEOUT_SEC))
            except Exception as exc:  # noqa: BLE001 - Ray refusing a call to it: the sampler is as good as lost
                self._replace(s, exc)
        silent = time.monotonic() - self.last_shard_at
        if silent > self.cfg.heartbeat_timeout:
            raise RuntimeError(f"no sampler delivered a shard for {silent:.0f}s (--heartbeat_timeout="
                               f"{self.cfg.heartbeat_timeout:g}); Ray nodes alive: {len(placement.alive_nodes())}")

    def _answered(self, refs: list, wait: float) -> list:
        """The calls that have answered. Ray (2.60) has been seen, once in a few runs of minutes, to disown a
        call's result it still owes ("owner is unknown"): such a call is given up, as a lost shard."""
        import ray

        if not refs:
            return []
        try:
            if wait > 0:
                ray.wait(refs, num_returns=1, timeout=wait)
            return ray.wait(refs, num_returns=len(refs), timeout=0)[0]
        except ValueError:
            done = []
            for ref in refs:
                try:
                    done += ray.wait([ref], timeout=0)[0]
                except ValueError as exc:
                    log.warning("a shard request was dropped: %s", str(exc).split(".")[0])
                    for s in self.samplers:
                        if ref in s.asked:
                            s.asked.remove(ref)
            return done

    def _take(self, s: SamplerState, ref) -> None:
        import ray

        s.asked.remove(ref)
        if s not in self.samplers:
            return  # a late answer of a sampler already replaced
        try:
            shard = ray.get(ref, timeout=NEXT_SHARD_TIMEOUT_SEC)
        except placement.lost_errors() as exc:
            self._replace(s, exc)
            return
        except (ValueError, ray.exceptions.GetTimeoutError) as exc:  # a result Ray disowned (see _answered)
            log.warning("a shard of sampler %d was dropped: %s", s.index, str(exc).split(".")[0])
            return
        if shard is None:
            return  # nothing was ready on the node within the call's timeout
        s.node, s.held = shard.meta.node, s.held + 1
        self.waiting.append((s, shard))
        self.last_shard_at = time.monotonic()

    def _fill_datasets(self) -> None:
        while self.waiting and self.free:
            s, shard = self.waiting.popleft()
            s.held -= 1
            index = self.free.popleft()
            copy_into(self.datasets[index], shard.arrays)
            for report in shard.meta.reports:
                REPORT.emit(self, report)
            meta = shard.meta
            REPORT.emit(self, SamplerReport(meta.sampler, meta.incarnation, meta.node, meta.frames(),
                                            version=shard.versions()[0]))
            BATCH_READY.emit(self, index)

    @guarded
    def batch_consumed(self, index: int) -> None:
        self.free.append(index)
        self._fill_datasets()

    # ---------------------------------------------------------------- weights
    def _publish_weights(self) -> None:
        version = self.weights.current_version()
        if version != self.weights_version:
            with self.weights.lock:
                self.weights_ref = placement.put_weights(self.weights.tensors)
            self.weights_version = version

    def _send_weights(self, s: SamplerState) -> None:
        """The newest version, unless this sampler has it or is still taking an older one."""
        import ray

        if s.weights_call is not None:
            done, _ = ray.wait([s.weights_call], timeout=0)
            if not done:
                return
            s.weights_call = None
        if s.weights_sent != self.weights_version:
            s.weights_call = s.handle.set_weights.remote(self.weights_ref, self.weights_version)
            s.weights_sent = self.weights_version

    # ---------------------------------------------------------------- faults
    def _replace(self, s: SamplerState, error: BaseException) -> None:
        detail = str(error).strip().splitlines()[-1] if str(error).strip() else type(error).__name__
        log.warning("sampler %d (start %d, node %s) lost: %s", s.index, s.incarnation, s.node[:8], detail)
        REPORT.emit(self, SamplerReport(s.index, s.incarnation, s.node, 0, "lost", detail))
        self.samplers.remove(s)
        self.waiting = deque((o, shard) for o, shard in self.waiting if o is not s)
        placement.stop_samplers([s.handle], timeout=0.0)
        if self.restarts >= self.cfg.max_sampler_restarts:
            if not self.samplers:
                raise RuntimeError(f"every sampler is lost and --max_sampler_restarts={self.cfg.max_sampler_restarts} "
                                   f"were used; the last one: {detail}")
            log.warning("--max_sampler_restarts=%d reached: going on with %d samplers",
                        self.cfg.max_sampler_restarts, len(self.samplers))
            return
        self.restarts += 1
        self.samplers.append(self._start(s.index, s.incarnation + 1))

    @guarded
    def stop(self) -> None:
        import ray

        self.beat("stopping the samplers")
        self.stopped = True
        if self.samplers:
            placement.stop_samplers([s.handle for s in self.samplers], STOP_TIMEOUT_SEC)
        if ray.is_initialized():
            ray.shutdown()
        self.stop_loop()
