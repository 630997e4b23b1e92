"""Elastic pools: slots added to a running fleet and drained from it, recorded in one file that every pool
of every run on the fleet follows.

`python -m sf_core.fleet add|drain` (sf_core/service/fleet_control.py) append a change to
`<run folder>/changes.json`:

    {"changes": [{"op": "add", "service": "sim", "endpoints": ["127.0.0.1:6002*4"], "started": true},
                 {"op": "drain", "service": "sim", "targets": ["127.0.0.1:6000", "127.0.0.1:6001#3"]}]}

A pool (a rollout worker's, the evaluator's) looks at the file every recheck interval, and when it changed,
reads it and takes the slots that are its share (`PoolSource`): new ones join, the ones no longer listed
drain (sf_core/service/env_pool.py). No message reaches a running trainer: its rollout workers are processes
that share only signals and memory, and a file every pool re-reads is what each of them can see, on any
machine that sees the fleet's folder, whatever started the run. A pool reads at most every recheck interval,
so a change takes effect within about one.

Which pool gets which slot: the fleet file's own slots stay where the trainer put them (contiguous slices,
sf_core/service/capacity.py); added slots are dealt to the workers in turn, in the order they were added, so
no slot ever moves from one worker to another while a run goes on. A slot drained and added again returns to
the worker it had. A slot is drained by its `host:port#index`, a whole server by its `host:port`.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
from dataclasses import dataclass

from sf_core.service.addresses import Endpoint, ServiceConfigError, SlotAddress, parse_item
from sf_core.service.capacity import all_slots, worker_slice

log = logging.getLogger("sf_core")

CHANGES_FILE = "changes.json"


@dataclass
class Member:
    """One slot of a service: the fleet file's own (`added` None), or the how-manyth slot added."""

    slot: SlotAddress
    added: int | None
    drained: bool = False

    @property
    def address(self) -> str:
        return f"{self.slot.host}:{self.slot.port}"

    @property
    def name(self) -> str:
        return str(self.slot)


def members(base: list[Endpoint], changes: list[dict], service: str) -> list[Member]:
    """Every slot `service` has had: its own (`base`, from the fleet file), then those added, in order; each
    drained or not after replaying `changes`."""
    found = {str(s): Member(s, None) for s in all_slots(base)}
    added = 0
    for change in changes:
        if change.get("service") != service:
            continue
        if change["op"] == "add":
            for slot in all_slots([parse_item(e, "changes.json") for e in change["endpoints"]]):
                if str(slot) in found:
                    found[str(slot)].drained = False  # back, to the worker it had
                else:
                    found[str(slot)] = Member(slot, added)
                    added += 1
        elif change["op"] == "drain":
            targets = set(change["targets"])
            for m in found.values():
                m.drained |= m.name in targets or m.address in targets
    return list(found.values())


def worker_members(base: list[Endpoint], changes: list[dict], service: str, workers: int,
                   worker: int) -> list[tuple[str, int]]:
    """The slots (address, index) the pool of rollout worker `worker` of `workers` holds now: its slice of the
    fleet file's slots and every `workers`-th added one, less those drained."""
    mine = {str(s) for s in worker_slice(base, workers, worker)}
    return [(m.address, m.slot.index) for m in members(base, changes, service)
            if not m.drained and (m.name in mine if m.added is None else m.added % workers == worker)]


class ChangesFile:
    """`<run folder>/changes.json`: appended by the fleet's command line, read by the pools."""

    def __init__(self, run_dir: str):
        self.path = os.path.join(run_dir, CHANGES_FILE)

    def read(self) -> list[dict]:
        """The changes so far (none when there is no file); ServiceConfigError if it cannot be read."""
        try:
            with open(self.path, encoding="utf-8") as f:
                changes = json.load(f)["changes"]
        except FileNotFoundError:
            return []
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ServiceConfigError(f"{self.path}: unreadable ({exc})") from None
        if not isinstance(changes, list) or not all(isinstance(c, dict) and c.get("op") in ("add", "drain")
                                                     for c in changes):
            raise ServiceConfigError(f"{self.path}: 'changes' must be a list of add and drain changes")
        return changes

    def append(self, change: dict) -> None:
        """One more change, written whole (a reader never sees half a file), one writer at a time."""
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        with open(self.path + ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            changes = self.read() + [change]
            tmp = self.path + ".tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump({"changes": changes}, f, indent=1)
            os.replace(tmp, self.path)

    def remove(self) -> None:
        for path in (self.path, self.path + ".lock"):
            try:
                os.remove(path)
            except FileNotFoundError:
                pass

    def signature(self) -> tuple[int, int, int] | None:
        """What changes when the file does (a new inode at every write); None without a file."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return st.st_ino, st.st_mtime_ns, st.st_size


class PoolSource:
    """What one pool follows: its share of one service of a fleet, base slots and changes."""

    def __init__(self, changes: ChangesFile, service: str, base: list[Endpoint], workers: int = 1, worker: int = 0):
        self.changes, self.service, self.base = changes, service, list(base)
        self.workers, self.worker = workers, worker
        self.seen: tuple[int, int, int] | None = None  # the file as last read (None: no file, no changes)

    def poll(self) -> list[tuple[str, int]] | None:
        """The pool's slots when the file changed since the last call, else None. A file that cannot be read
        is logged and skipped: the pool keeps the slots it has until the next good one."""
        signature = self.changes.signature()
        if signature == self.seen:
            return None
        self.seen = signature
        try:
            return worker_members(self.base, self.changes.read(), self.service, self.workers, self.worker)
        except ServiceConfigError as exc:
            log.warning("elastic pool of %s: %s; keeping its slots as they are", self.service, exc)
            return None


def fleet_source(value: str, pool: str | None, base: list[Endpoint], workers: int = 1,
                 worker: int = 0) -> PoolSource | None:
    """What a pool of --env_service=value follows: None unless the value is a fleet file. `pool`: the named
    pool (a fleet of several services has one per service), or None for a fleet of one service."""
    from sf_core.service.fleet_file import is_fleet_file, load_fleet

    if not value or not is_fleet_file(value):
        return None
    fleet = load_fleet(value.strip())
    service = pool if pool in fleet.services else next(iter(fleet.services))
    return PoolSource(ChangesFile(fleet.run_dir), service, base, workers, worker)
