"""Shared-memory tensors, allocated once by the runner before any process starts.

Trajectory buffers hold every field of the sample schema (sf_core/contracts/sample.py) as
`[num_slots, rollout + 1, rows_per_split, ...]`, one row per agent of each env of the split
(`envs_per_split × agents_per_env`; single-agent envs: one row per env). A slot belongs to one split of
one rollout worker; each split owns `sets_per_split` slots and cycles through them; which policies' batchers
hold a slot is in `SlotHolds` (sf_core/contracts/slot_holds.py). Signals between components carry only slot and
row indices.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from sf_core.config import Config
from sf_core.contracts.sample import FIELD, FIELDS, SampleSpaces, batch_tensors
from sf_core.contracts.slot_holds import SlotHolds


SERVER_SHIFT = 32  # a ticket's low bits name the split and its worker's incarnation; the high ones, the server's
WORKER_BITS = (1 << SERVER_SHIFT) - 1


@dataclass(frozen=True)
class BufferLayout:
    num_workers: int
    num_splits: int  # per worker
    envs_per_split: int
    rollout: int
    sets_per_split: int
    agents_per_env: int = 1  # multi-agent envs: each agent is a trajectory row of its own
    num_policies: int = 1

    @classmethod
    def from_config(cls, cfg: Config, agents_per_env: int = 1) -> "BufferLayout":
        splits_total = cfg.num_workers * cfg.worker_num_splits
        rows = cfg.envs_per_split() * agents_per_env
        trajectories_per_round = splits_total * rows
        dataset_trajectories = cfg.dataset_size() // cfg.rollout
        # Async: room for one whole dataset plus one more round, so sampling goes on while the learner
        # trains. Sync: just enough for one dataset, so workers wait for the new weights (policy lag 0
        # when the dataset is a whole number of rounds; otherwise bounded by the sets per split); with
        # --num_batches_to_accumulate=N, enough for N more, collected while the learner trains (lag ≤ N).
        ahead = cfg.datasets_ahead()
        if ahead is None:
            # With --env_service, splits without slots (down, drained, or not added yet: more envs than
            # slots) produce nothing for a while: room for one live split to fill a dataset alone, or the
            # learner would wait for trajectories that the live splits have no slot to write. With
            # --env_fault_policy=restart, a worker being replaced does (sf_core/run/worker_replacement.py):
            # room for the others to fill one without it
            producers = trajectories_per_round
            if cfg.env_service:
                producers = rows
            elif cfg.env_fault_policy == "restart" and cfg.num_workers > 1:
                producers -= cfg.worker_num_splits * rows
            sets = math.ceil(dataset_trajectories / producers) + 1
        else:
            # a slot is freed only once all its trajectories are copied, so a dataset that splits a
            # slot leaves up to rows - 1 of them waiting: room for those too, or it deadlocks. Each slot
            # is held until its dataset is trained on: room for the datasets collected ahead as well
            partial = rows - 1 if dataset_trajectories % rows else 0
            sets = math.ceil((1 + ahead) * (dataset_trajectories + partial) / trajectories_per_round)
        return cls(cfg.num_workers, cfg.worker_num_splits, cfg.envs_per_split(), cfg.rollout, sets, agents_per_env,
                   cfg.num_policies)

    @property
    def rows_per_split(self) -> int:
        """Trajectories one slot holds: one per agent of each env of the split."""
        return self.envs_per_split * self.agents_per_env

    @property
    def num_splits_total(self) -> int:
        return self.num_workers * self.num_splits

    @property
    def num_slots(self) -> int:
        return self.num_splits_total * self.sets_per_split

    def split_index(self, worker: int, split: int) -> int:
        return worker * self.num_splits + split

    def slot_index(self, worker: int, split: int, k: int) -> int:
        return self.split_index(worker, split) * self.sets_per_split + k

    def worker_of_slot(self, slot: int) -> int:
        return slot // (self.sets_per_split * self.num_splits)

    def ticket(self, split: int, incarnation: int, server: int = 0) -> int:
        """What a policy request names a split by: the split, which process of its worker asked, and which process
        of the inference worker it asked (sf_core/contracts/control.py, incarnations), so an answer meant for a dead
        process, or given by one, is told apart."""
        return split + self.num_splits * incarnation + (server << SERVER_SHIFT)

    def split_of(self, ticket: int) -> int:
        return (ticket & WORKER_BITS) % self.num_splits

    def incarnation_of(self, ticket: int) -> int:
        return (ticket & WORKER_BITS) // self.num_splits

    @staticmethod
    def server_of(ticket: int) -> int:
        """The incarnation of the inference worker the request was sent to."""
        return ticket >> SERVER_SHIFT


def _shared(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Zeros in shared memory, made there: a new shared segment reads as zeros until written, so its pages are
    touched by the processes that write them, in parallel. `torch.zeros(...).share_memory_()` zeroed private
    memory and copied it over: 1.5 s for Pong's 0.9 GB of trajectory buffers here, against 0.2 s."""
    numel = math.prod(shape)
    storage = torch.UntypedStorage._new_shared(numel * dtype.itemsize)  # what torch.multiprocessing allocates with
    return torch.empty(0, dtype=dtype).set_(storage, 0, shape)


class TrajectoryBuffers:
    """Every sample field per slot, plus two per-split tensors that are no samples."""

    def __init__(self, layout: BufferLayout, spaces: SampleSpaces):
        self.layout, self.spaces = layout, spaces
        lead = (layout.num_slots, layout.rollout + 1, layout.rows_per_split)
        self.fields: dict[str, torch.Tensor] = {}
        for f in FIELDS:
            shape, dtype = spaces.storage(f)
            self.fields[f.name] = _shared(lead + shape, dtype)
        splits, rows = layout.num_splits_total, layout.rows_per_split
        # each row's latest recurrent state, after its previous observation
        self.rnn_latest = _shared((splits, rows, spaces.rnn_state_size), torch.float32)
        # the final observation of an env truncated at the last step (its value bootstraps the cut episode)
        obs_shape, obs_dtype = spaces.storage(FIELD["obs"])
        self.final_obs = _shared((splits, rows) + obs_shape, obs_dtype)
        self.holds = SlotHolds(layout.num_policies, layout.num_slots)

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.fields[name]


class SharedWeights:
    """The learner's latest state_dict in shared memory plus a version counter.

    Readers copy under the lock only when the version moved, so a torn half-written state is never
    loaded and inference never waits for more than a memcpy.
    """

    def __init__(self, model: nn.Module, lock):
        self.tensors = {name: t.detach().clone().share_memory_() for name, t in model.state_dict().items()}
        self.version = _shared((1,), torch.int64)
        self.lock = lock

    def publish(self, model: nn.Module, version: int, held: dict[str, torch.Tensor] | None = None) -> None:
        """`held`: entries to publish in place of the model's own, by name (a part of it still training: its state
        from before, algo/executor.py's `Held`)."""
        held = held or {}
        with self.lock:
            for name, tensor in model.state_dict().items():
                self.tensors[name].copy_(held.get(name, tensor).detach(), non_blocking=False)
            self.version[0] = version

    def current_version(self) -> int:
        return int(self.version.numpy()[0])

    def load_into(self, model: nn.Module) -> int:
        with self.lock:
            model.load_state_dict(self.tensors, strict=True)
            return int(self.version[0])


class NoLock:
    """Serial mode: one thread, nothing to exclude."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def make_lock(serial: bool, mp_context):
    return NoLock() if serial else mp_context.Lock()



class DatasetBuffers:
    """`count` learner datasets, each a dict of time-major tensors `[rows, trajectories, ...]` holding only
    the rows the learner trains on (`SampleField.rows`). The batcher fills one while the learner trains on
    another."""

    def __init__(self, spaces: SampleSpaces, rollout: int, num_trajectories: int, count: int = 2):
        self.datasets = []
        for _ in range(count):
            batch = batch_tensors(spaces, rollout, num_trajectories)
            self.datasets.append({key: t.share_memory_() for key, t in batch.items()})

    def __len__(self) -> int:
        return len(self.datasets)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return self.datasets[index]
