"""Elastic pools: slots added to and drained from a running fleet. The server closes one slot; a pool takes
slots in and lets them go (a busy one when its holder gives it back); every pool takes its share of the
fleet's changes file; `python -m sf_core.fleet add|drain` while a run trains (frames/s follows the capacity,
nothing in flight is lost) and while the evaluator runs (every task has its result)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from sf_core.cli.fleet import main as fleet_main
from sf_core.service.addresses import Endpoint
from sf_core.service.elastic import ChangesFile, PoolSource, members, worker_members
from sf_core.service.env_pool import EnvPool
from sf_core.service.fleet_control import FleetControl
from sf_core.service.fleet_file import FleetError
from sf_core.service.pooled_env import PooledEnv
from sf_core.service.skip import serve_in_process, stop_in_process
from tests import launch
from tests.helpers import bindable, free_ports, wait_for
from tests.test_fleet import servers_on

SCRIPTS = os.path.join(launch.REPO, "scripts")  # benchlib.slow_env: CartPole whose step sleeps 20 ms


# ------------------------------------------------------------------ server, pool, changes file (fast)


def test_a_server_closes_one_slot_until_it_is_restored():
    from sf_core.envs.registry import registry_snapshot
    from sf_core.service.env_server import EnvServer
    from sf_core.service.protocol import pack

    server = EnvServer("CartPole-v1", 2, host=None, registry=registry_snapshot())

    def call(header, arrays=()):
        return json.loads(server.handle(pack(header, list(arrays)))[0])

    try:
        assert call({"cmd": "reset", "slot": 0})["ok"] and call({"cmd": "close", "slot": 0})["ok"]
        assert server.instances[0] is None  # what the instance held is freed
        assert call({"cmd": "ping"})["slots"] == ["closed", "ok"]
        refused = call({"cmd": "step", "slot": 0}, [np.array(1, np.int64)])
        assert not refused["ok"] and "slot 0 is closed (drained); restore it to open it again" in refused["error"]
        assert call({"cmd": "reset", "slot": 1})["ok"]  # the other slot serves on
        assert call({"cmd": "restore", "slot": 0})["ok"] and call({"cmd": "ping"})["slots"] == ["ok", "ok"]
        assert call({"cmd": "reset", "slot": 0})["ok"]
    finally:
        server.close()


def test_a_pool_takes_slots_in_and_drains_a_busy_one_only_when_given_back():
    address = serve_in_process("CartPole-v1", 4, owner="test_elastic")
    pool = EnvPool([(address, i) for i in range(2)], "CartPole-v1", timeout=1.0, recheck_interval=0.05)
    a, b = PooledEnv(pool, acquire_timeout=0.0), PooledEnv(pool, acquire_timeout=0.0)
    try:
        a.reset(seed=1)
        assert pool.drain([a.slot.name, f"{address}#1"]) == 2  # a's busy slot, and the idle one
        assert a.draining and pool.counts()["draining"] == 1 and len(pool.slots) == 1
        with pytest.raises(Exception, match="no healthy env slot"):
            b.reset()  # a draining slot is never handed out
        a.step(0)  # its holder's work goes on
        a.let_go()
        assert pool.slots == [] and pool.drained_total == 2
        wait_for(lambda: _ping(address) == ["closed", "closed", "ok", "ok"], 5,
                 "both slots closed on the server")
        assert pool.add_slots([(address, 0), (address, 2)]) == 2 and pool.counts()["joining"] == 2
        wait_for(lambda: pool.counts()["idle"] == 2, 5, "the added slots to join")
        assert pool.joined_total == 2 and _ping(address) == ["ok", "closed", "ok", "ok"]  # restored: open again
        b.reset(seed=2)
        assert b.slot.name in (f"{address}#0", f"{address}#2")
        pool.drain([b.slot.name])
        assert pool.add_slots([(b.slot.address, b.slot.index)]) == 0 and not b.draining  # the drain called off
    finally:
        for env in (a, b):
            env.close()
        pool.close()
        stop_in_process(address)


def _ping(address: str) -> list[str]:
    from sf_core.service.skip import in_process_server
    from sf_core.service.protocol import pack

    return json.loads(in_process_server(address).handle(pack({"cmd": "ping"}))[0])["slots"]


def test_each_worker_takes_its_share_of_the_changes_and_no_slot_moves():
    base = [Endpoint("10.0.0.1", 5000, 2), Endpoint("10.0.0.2", 5000, 2)]
    changes = [{"op": "add", "service": "sim", "endpoints": ["10.0.0.3:5000*3"]},
               {"op": "add", "service": "other", "endpoints": ["10.0.0.9:5000*2"]},
               {"op": "drain", "service": "sim", "targets": ["10.0.0.1:5000", "10.0.0.3:5000#1"]}]
    w0 = worker_members(base, changes, "sim", 2, 0)
    w1 = worker_members(base, changes, "sim", 2, 1)
    # the file's slots in contiguous slices (worker 0 had 10.0.0.1, drained), the added ones dealt in turn
    assert w0 == [("10.0.0.3:5000", 0), ("10.0.0.3:5000", 2)]
    assert w1 == [("10.0.0.2:5000", 0), ("10.0.0.2:5000", 1)]
    changes.append({"op": "add", "service": "sim", "endpoints": ["10.0.0.1:5000*2", "10.0.0.4:5000*1"]})
    assert worker_members(base, changes, "sim", 2, 0) == [("10.0.0.1:5000", 0), ("10.0.0.1:5000", 1)] + w0
    assert worker_members(base, changes, "sim", 2, 1) == w1 + [("10.0.0.4:5000", 0)]  # the 4th added slot
    assert sum(m.drained for m in members(base, changes, "sim")) == 1


def test_a_pool_source_reads_the_changes_file_only_when_it_changed(tmp_path):
    changes = ChangesFile(str(tmp_path / "fleet.run"))
    source = PoolSource(changes, "sim", [Endpoint("127.0.0.1", 5000, 2)])
    assert source.poll() is None and changes.read() == []  # no file: the file's slots, nothing to change
    changes.append({"op": "drain", "service": "sim", "targets": ["127.0.0.1:5000#0"]})
    assert source.poll() == [("127.0.0.1:5000", 1)] and source.poll() is None
    changes.append({"op": "add", "service": "sim", "endpoints": ["127.0.0.1:5001*1"]})
    assert source.poll() == [("127.0.0.1:5000", 1), ("127.0.0.1:5001", 0)]
    (tmp_path / "fleet.run" / "changes.json").write_text("{not json")
    assert source.poll() is None  # unreadable: logged, the pool keeps its slots
    changes.remove()
    assert source.poll() == [("127.0.0.1:5000", 0), ("127.0.0.1:5000", 1)]  # the fleet is its file's again


def test_fleet_drain_and_add_name_what_they_change_and_refuse_what_cannot_be(tmp_path, capsys):
    path = tmp_path / "fleet.yaml"
    path.write_text("services:\n  sim:\n    endpoints: [10.0.0.1:5000*2, 10.0.0.2:5000*2]\n"
                    "  reward:\n    endpoints: [10.0.0.5:6000*1]\n")
    control = FleetControl(str(path))
    assert control.drain("sim") == ("sim", ["10.0.0.2:5000"])  # its last server
    assert control.drain("10.0.0.1:5000#1") == ("sim", ["10.0.0.1:5000#1"]) and control.slots_left("sim") == 1
    with pytest.raises(FleetError, match="10.0.0.2:5000 is drained already"):
        control.drain("10.0.0.2:5000")
    with pytest.raises(FleetError, match="no service of .* has 10.0.0.7:5000"):
        control.drain("10.0.0.7:5000")
    with pytest.raises(FleetError, match="10.0.0.5:6000 belongs to service reward already; an address belongs"):
        control.add("sim", endpoints=["10.0.0.5:6000*1"])
    with pytest.raises(FleetError, match="service sim is remote: nothing of it is started here"):
        control.add("sim", replicas=1)
    assert fleet_main(["drain", str(path)]) == 2 and fleet_main(["up", str(path), "sim"]) == 2
    assert fleet_main(["drain", str(path), "sim", "--replicas=2"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == ["sf_core.fleet: error: drain takes a target: python -m sf_core.fleet drain FLEET.yaml "
                   "SERVICE|HOST:PORT[#INDEX]",
                   "sf_core.fleet: error: up takes no target: python -m sf_core.fleet up FLEET.yaml",
                   "sf_core.fleet: error: service sim has 1 server(s) with slots not drained; cannot drain 2"]
    assert [c["op"] for c in ChangesFile(str(tmp_path / "fleet.run")).read()] == ["drain", "drain"]
