"""Every signal between components: its name, who emits it, who receives it, and its payload.

Read top to bottom, this module is the data flow of a training run. Components never call each other:
they emit these signals, and `sf_core/machine/wiring.py` connects them to slots (methods of the same name on
the receiver). Payloads are small (indices, versions, reports); the data they point at lives in shared
memory: trajectories in `sf_core/contracts/buffers.py` (fields in `sf_core/contracts/sample.py`), weights in
`SharedWeights` (a version counter, read by inference workers without any signal), the stop flag and
heartbeats in `sf_core/contracts/control.py`.

Each payload is declared once, as the signature of a stub function. `Signal[P]` takes its parameters
from that stub, so a type checker matches every `emit` and every connected slot against it, and
`docs/architecture.md`'s signal table is generated from here (`scripts/gen_docs.py`).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Generic, ParamSpec

from sf_core.contracts.names import per_policy
from sf_core.contracts.timing import TimingReport

P = ParamSpec("P")


class Signal(Generic[P]):
    def __init__(self, name: str, payload: Callable[P, None], sender: str, receiver: str):
        self.name, self.payload, self.sender, self.receiver = name, payload, sender, receiver
        self.meaning = inspect.getdoc(payload) or ""

    def emit(self, sender: Any, *args: P.args, **kwargs: P.kwargs) -> None:
        if kwargs:  # the type checker accepts payload names; signal-slot-mp would drop them silently
            raise TypeError(f"signal {self.name!r}: pass the payload positionally, not {sorted(kwargs)}")
        sender.emit(self.name, *args)

    def emit_routed(self, sender: Any, route: int | None, *args: P.args, **kwargs: P.kwargs) -> None:
        """`emit`; a RoutedSignal given a `route` is emitted to that index (for a caller that sends either)."""
        self.emit(sender, *args, **kwargs)

    def connect(self, sender: Any, slot: Callable[P, None]) -> None:
        self.check_slot(slot)
        sender.connect(self.name, slot)

    def parameters(self) -> list[str]:
        return list(inspect.signature(self.payload).parameters)

    def check_slot(self, slot: Callable) -> None:
        """A slot takes the payload's parameters, by name, in order (checked once, when wiring)."""
        params = list(inspect.signature(slot).parameters)
        if params != self.parameters():
            raise TypeError(f"slot {getattr(slot, '__qualname__', slot)}({', '.join(params)}) cannot receive "
                            f"signal {self.name!r}, whose payload is ({', '.join(self.parameters())})")


class RoutedSignal(Signal[P]):
    """A signal with one name per receiver index (a rollout worker's, or a policy's): a signal reaches every
    connected slot, and only rollout worker w, or the components of policy p, may act on what is meant for it."""

    def __init__(self, name: str, payload: Callable[P, None], sender: str, receiver: str, index: str = "w"):
        super().__init__(name, payload, sender, receiver)
        self.index = index  # what the route's number counts: "w" a rollout worker, "p" a policy

    def route(self, index: int) -> str:
        return f"{self.name}_{index}"

    def emit_to(self, sender: Any, index: int, *args: P.args, **kwargs: P.kwargs) -> None:
        if kwargs:
            raise TypeError(f"signal {self.name!r}: pass the payload positionally, not {sorted(kwargs)}")
        sender.emit(self.route(index), *args)

    def emit_routed(self, sender: Any, route: int | None, *args: P.args, **kwargs: P.kwargs) -> None:
        if route is None:
            self.emit(sender, *args, **kwargs)
        else:
            self.emit_to(sender, route, *args, **kwargs)

    def connect_to(self, sender: Any, index: int, slot: Callable[P, None]) -> None:
        self.check_slot(slot)
        sender.connect(self.route(index), slot)


# ------------------------------------------------------------------------------- payload types

Episode = tuple[float, int, int, int]  # (return, length, agent index within its env, policy that played it)
# a multi-agent env's episode, once every agent finished it: each agent's policy and return (win rates)
Match = tuple[tuple[int, ...], tuple[float, ...]]
# (policy, key, value): a scalar the env reported at an episode's end (sf_core/sampling/episode_metrics.py)
Metric = tuple[int, str, float]


@dataclass
class ServiceReport:
    """--env_service: a rollout worker's slots right now, and its slot events since its last report."""

    slot_counts: dict[str, int]  # slots by state: idle (spare), busy, error, stopped, joining, draining
    slot_faults: int
    interrupted_episodes: int
    readmitted: int
    waiting_envs: int
    joined: int = 0  # slots added that joined the pool (elastic pools)
    drained: int = 0  # slots that left it, drained
    drain_cut_episodes: int = 0  # episodes ended early where a drained slot was given back after a rollout


@dataclass
class RolloutReport:
    worker: int
    frames: int  # env frames since the last report (agent steps × frameskip)
    episodes: list[Episode]
    env_seconds: float
    env_faults: int
    service: ServiceReport | None = None
    matches: list[Match] = field(default_factory=list)
    # (policy, value) of --pbt_target_objective where the env reports it in an episode's last info
    objectives: list[tuple[int, float]] = field(default_factory=list)
    sampler: int = 0  # --ray_address: the sampler the worker runs in (every node has a worker 0)
    # one entry per value: the runner keeps a window of the last --stats_window episodes per key, which sums
    # per report could not give; only episode ends add any, so the list stays as short as `episodes`
    metrics: list[Metric] = field(default_factory=list)
    skipped_metrics: dict[str, str] = field(default_factory=dict)  # key -> why a value was skipped (once per key)
    incarnation: int = 0  # of the worker's process: 1 and up for a replacement (sf_core/run/worker_replacement.py)
    act_seconds: float = 0.0  # spent on the policy's forward passes (--inference_in_rollout_workers)


def inference_worker_name(policy: int, index: int, num_policies: int) -> str:
    """An inference worker's component name (the address rollout workers' requests go to)."""
    return f"{per_policy('inference_worker', policy, num_policies)}_{index}"


@dataclass
class EvalReport:
    """A deterministic evaluation (--eval_every_env_steps) of `path`, a checkpoint of `policy`: its episodes' returns
    and lengths, and the means of the episode metrics the env reported."""

    policy: int
    path: str
    version: int
    frames: int  # env frames the run had trained on when the checkpoint was saved
    returns: list[float]
    lengths: list[int]
    metrics: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0


@dataclass
class InferenceReport:
    index: int
    policy: int
    requests: int
    batches: int
    seconds: float
    version: int = -1  # of the weights its latest forward pass acted with: shows each worker takes new ones
    incarnation: int = 0  # of the worker's process: 1 and up for a replacement (sf_core/run/worker_replacement.py)


@dataclass
class LearnerReport:
    policy: int
    version: int
    samples: int
    train_seconds: float
    stats: dict[str, float] = field(default_factory=dict)  # the graph's *_stats outputs, and the learning rate


@dataclass
class SamplerReport:
    """--ray_address: a shard of sampler `sampler` (its `incarnation`-th start) reached the learner, or the
    sampler started (answered), was lost, or its replacement waits for a node with room (`event`), on Ray
    node `node`."""

    sampler: int
    incarnation: int
    node: str
    frames: int  # env frames its workers reported with this shard
    event: str = "shard"  # shard, started, lost, waiting
    detail: str = ""  # why it was lost
    version: int = 0  # shard: the oldest version of its policy that acted in it
    policy: int = 0  # shard: whose it is
    versions: tuple[int, ...] = ()  # started: each policy's weights version it starts from


@dataclass
class LearnerRankReport:
    """--ray_address with --num_learners > 1: learner rank `rank` (≥ 1) runs as a Ray actor on node `node`."""

    rank: int
    node: str


Report = (RolloutReport | InferenceReport | LearnerReport | SamplerReport | LearnerRankReport | TimingReport
          | EvalReport)


# ------------------------------------------------------------------------------- the data flow, in order
# (hot-path payloads are plain ints and lists: an enum member or a dataclass costs microseconds more to
# pickle per message, and the policy request is sent once per split step)

def _policy_request(worker: int, split: int, slot: int, row: int, origin: int, has_truncation: bool) -> None:
    """A split's observations are in `row` of `slot`: act on them. `origin` is why, a `RowOrigin` (the
    row-0 rule, sf_core/contracts/sample.py); `has_truncation`: an env of the split was cut by a time limit on the
    previous row. `split` is the split's ticket (`BufferLayout.ticket`: the split, and the incarnations of the
    worker's process that asked and of the inference worker's it asked); a request of an incarnation that is no
    longer current is dropped."""


POLICY_REQUEST = RoutedSignal("policy_request", _policy_request, "rollout worker",
                              "an inference worker of policy p (each policy acting on the row, or valuing a cut "
                              "episode)", "p")


def _flush_requests() -> None:
    """Emitted by an inference worker to itself: it queues behind every request already sent, so one
    forward pass serves all of them (batching without polling)."""


FLUSH_REQUESTS = Signal("flush_requests", _flush_requests, "inference worker", "the same inference worker")


def _advance(policy: int, splits: list[int]) -> None:
    """Actions, log-probs, values and the policy version are in the buffers for these splits' rows, from an
    inference worker of `policy`: step them (`splits`: the requests' tickets, as they were sent)."""


ADVANCE = RoutedSignal("advance", _advance, "inference worker", "rollout worker w (once per policy asked)")


def _resend_requests(policy: int) -> None:
    """A new process serves for an inference worker of `policy` whose process died, with the current weights:
    send it again each request sent to the dead one and not answered (sf_core/run/worker_replacement.py)."""


RESEND_REQUESTS = RoutedSignal("resend_requests", _resend_requests, "a replacement inference worker",
                               "each rollout worker w it serves")


def _envs_stepped(split: int) -> None:
    """--env_service: the split's stepper thread finished stepping it (the outcome waits in
    `SplitSteppers`, sf_core/sampling/split_stepper.py): carry on as after a step on the event loop."""


ENVS_STEPPED = Signal("envs_stepped", _envs_stepped, "a rollout worker's split stepper thread",
                      "the same rollout worker")


def _act_locally() -> None:
    """--inference_in_rollout_workers: the worker's splits that asked for actions since the last one; the worker
    acts for all of them in one forward pass (as an inference worker's flush_requests does), then steps them."""


ACT_LOCALLY = Signal("act_locally", _act_locally, "a rollout worker, at its first request since it last acted",
                     "the same rollout worker")


def _new_trajectories(slot: int) -> None:
    """Every row of `slot` holds a finished trajectory (policy p's batcher copies the rows p acted on)."""


NEW_TRAJECTORIES = RoutedSignal("new_trajectories", _new_trajectories, "rollout worker",
                                "the batcher of each policy with samples in the slot", "p")


def _batch_ready(index: int) -> None:
    """Dataset buffer `index` holds a full dataset."""


BATCH_READY = Signal("batch_ready", _batch_ready, "batcher (--ray_address: the shard ingest's port of the policy)",
                     "the learner of the same policy (a sampler's: its shard emitter)")


def _batch_consumed(index: int) -> None:
    """The learner trained on dataset `index` and published the new weights: the buffer is free. (Trained: as far
    as the weights inference acts with go; a graph's later nodes may train on copies: Algorithm.release_after.)"""


BATCH_CONSUMED = Signal("batch_consumed", _batch_consumed, "learner (a sampler's: its shard emitter)",
                        "the batcher of the same policy (--ray_address: the shard ingest's port of the policy)")


def _slots_freed(slots: list[int]) -> None:
    """Every trajectory of these slots was copied into a dataset (and, without --async_rl, trained on):
    the rollout worker may fill them again once every policy's batcher that got a slot freed it."""


SLOTS_FREED = RoutedSignal("slots_freed", _slots_freed, "batcher", "rollout worker w")


def _shard_taken() -> None:
    """--ray_address: the driver took a shard from this sampler's outbox: there is room for the next."""


SHARD_TAKEN = Signal("shard_taken", _shard_taken, "a sampler's Ray call thread", "the sampler's shard emitter")


def _shards_arrived() -> None:
    """--ray_address: a sampler answered a shard call (the answers wait in the ingest, queued by the Ray
    thread that ran the call's completion callback)."""


SHARDS_ARRIVED = Signal("shards_arrived", _shards_arrived, "a Ray callback thread of the shard ingest",
                        "the shard ingest")


def _save_checkpoint(runner_state: dict, is_best: bool) -> None:
    """Save a checkpoint now, with the runner's counters and this policy's statistics in it (periodically
    and at every stop)."""


SAVE_CHECKPOINT = RoutedSignal("save_checkpoint", _save_checkpoint, "runner", "the learner of policy p", "p")


def _pbt_replace(source: int, hyperparams: dict) -> None:
    """Population-based training: take policy `source`'s weights (from its shared weights) and these
    hyperparameters, and publish them as the next version (sf_core/run/pbt.py decides)."""


PBT_REPLACE = RoutedSignal("pbt_replace", _pbt_replace, "runner", "the learner of policy p", "p")


def _checkpoint_saved(path: str) -> None:
    """A checkpoint was written (atomically) to `path`."""


CHECKPOINT_SAVED = Signal("checkpoint_saved", _checkpoint_saved, "learner", "runner")


def _evaluate(policy: int, path: str) -> None:
    """--eval_every_env_steps: play deterministic episodes with checkpoint `path` of policy `policy`, on an env of
    the evaluator's own, and report how it did (an `EvalReport`)."""


EVALUATE = Signal("evaluate", _evaluate, "runner", "the evaluator")


def _report(report: Report) -> None:
    """Frames, episodes, timings and losses since the component's previous report."""


REPORT = Signal("report", _report, "every component", "runner")


def _component_error(component: str, details: str) -> None:
    """`component` failed with this traceback: the runner stops training with it."""


COMPONENT_ERROR = Signal("component_error", _component_error, "every component", "runner")


def _stop() -> None:
    """Stop: close envs, end the event loop (the learner saves first: save_checkpoint is queued before)."""


STOP = Signal("stop", _stop, "runner", "every component")


ALL: tuple[Signal, ...] = (POLICY_REQUEST, FLUSH_REQUESTS, ADVANCE, RESEND_REQUESTS, ENVS_STEPPED, ACT_LOCALLY,
                           NEW_TRAJECTORIES, BATCH_READY, BATCH_CONSUMED, SLOTS_FREED, SHARD_TAKEN, SHARDS_ARRIVED,
                           SAVE_CHECKPOINT, PBT_REPLACE, CHECKPOINT_SAVED, EVALUATE, REPORT, COMPONENT_ERROR, STOP)
