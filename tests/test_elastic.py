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


# ------------------------------------------------------------------ while a run trains or evaluates (slow)


def fleet_cli(*args: str, timeout: float = 90) -> subprocess.CompletedProcess:
    """`python -m sf_core.fleet`, with scripts/ on the servers' path (benchlib.slow_env)."""
    env = launch.environment()
    env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], SCRIPTS])
    return subprocess.run(launch.command(list(args), module="sf_core.fleet"), capture_output=True, text=True,
                          timeout=timeout, cwd=launch.REPO, env=env)


def summary_point(train_dir) -> tuple[float, int]:
    """(the trainer's seconds, its frames) in its live training_summary.json."""
    path = os.path.join(train_dir, "elastic", "training_summary.json")
    while True:
        try:
            with open(path) as f:
                summary = json.load(f)
            return summary["seconds"], summary["frames"]
        except (OSError, ValueError, KeyError):
            time.sleep(0.1)


def frames_per_second(train_dir, seconds: float) -> float:
    """Frames/s over the next `seconds`, from the trainer's own clock and frame count."""
    t0, f0 = summary_point(train_dir)
    time.sleep(seconds)
    t1, f1 = summary_point(train_dir)
    return (f1 - f0) / (t1 - t0)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_training_grows_with_slots_added_and_shrinks_with_slots_drained_losing_nothing(tmp_path):
    """One rollout worker planned for 8 envs of a 20 ms env on a fleet of 4 slots: one split trains, the other
    waits. `fleet add` starts a server of 4 more slots: within seconds frames/s rises to about twice, with no
    restart. `fleet drain` of the first server: its slots are given back at the end of their rollout (no slot
    fault, no episode cut but the 4 the drain ends), closed, the server stopped, and frames/s falls to about
    half. `fleet down` leaves no process and no port."""
    base = free_ports(4)
    path = tmp_path / "fleet.yaml"
    path.write_text(f"services:\n  sim:\n    env: SleepyCartPole-v1\n    env_module: benchlib.slow_env\n"
                    f"    concurrency: 4\n    parallel: true\n    port: {base}\n")
    log_path = tmp_path / "train.log"
    trainer = None
    try:
        up = fleet_cli("up", str(path))
        assert up.returncode == 0, up.stdout + up.stderr
        with open(log_path, "w") as log:
            trainer = launch.start(["--env=SleepyCartPole-v1", f"--env_service={path}", "--num_workers=1",
                                    "--num_envs_per_worker=8", f"--train_dir={tmp_path}", "--experiment=elastic",
                                    "--experiment_summaries_interval=0.5", "--env_service_recheck_interval=0.5",
                                    "--train_for_seconds=240", "--seed=1"], output=log)
        wait_for(lambda: summary_point(tmp_path)[1] > 2000, 90, "the run to train on 4 slots")
        four = frames_per_second(tmp_path, 4)
        adding = time.monotonic()
        added = fleet_cli("add", str(path), "sim")
        adding = time.monotonic() - adding
        assert added.returncode == 0, added.stdout + added.stderr
        assert f"added 127.0.0.1:{base + 1}*4 to service sim (4 slots)" in added.stdout
        time.sleep(2)
        eight = frames_per_second(tmp_path, 4)  # the 4 s that end 6 s after the new server answered
        assert eight >= 1.4 * four, (four, eight)
        drained = fleet_cli("drain", str(path), f"127.0.0.1:{base}", "--wait=30")
        assert drained.returncode == 0, drained.stdout + drained.stderr
        assert "every slot drained is closed; stopped sim[0.0]" in drained.stdout
        assert servers_on([base]) == [] and bindable(base)  # drained whole: its process is gone
        time.sleep(1)  # the drain returned once its slots were closed
        half = frames_per_second(tmp_path, 4)
        assert 0.3 * eight <= half <= 0.75 * eight, (four, eight, half)
        status = fleet_cli("status", str(path))
        assert status.returncode == 0, status.stdout + status.stderr
        assert f"sim 127.0.0.1:{base}: drained; slots: not answering" in status.stdout
        assert re.search(f"sim 127.0.0.1:{base + 1}: pid \\d+ running; slots: #0 ok, #1 ok, #2 ok, #3 ok",
                         status.stdout)
        trainer.send_signal(signal.SIGINT)
        assert trainer.wait(timeout=60) in (0, 130), log_path.read_text()[-3000:]
    finally:
        if trainer is not None and trainer.poll() is None:
            trainer.kill()
            trainer.wait(timeout=10)
        down = fleet_cli("down", str(path))
    assert down.returncode == 0 and servers_on([base, base + 1]) == [] and bindable(base + 1)
    summary = json.loads((tmp_path / "elastic" / "training_summary.json").read_text())
    assert summary["worker_restarts"] == 0 and summary["slot_faults"] == 0 and summary["interrupted_episodes"] == 0
    assert (summary["slots_joined"], summary["slots_drained"], summary["drain_cut_episodes"]) == (4, 4, 4), summary
    text = log_path.read_text()
    assert "split 1 waits for a free env slot: this worker has fewer slots than envs" in text
    assert re.search(r"split 0 gave back a drained env slot after its rollout", text)
    print(f"fleet add took {adding:.1f}s; frames/s: 4 slots {four:.1f}, 8 slots {eight:.1f} ({eight / four:.2f}x), "
          f"4 drained {half:.1f} ({half / eight:.2f}x)")


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_draining_a_server_during_an_evaluation_loses_no_task(tmp_path):
    """16 tasks on 2 servers × 2 slots (2 workers × 2 task runners). A few tasks in, one server is drained from
    Python: the tasks on it finish there, no task fails or is retried, every later task runs on the other
    server, and the drained slots are closed."""
    base = free_ports(2)
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(f"services:\n  slow:\n    env: SlowCartPole-v1\n    env_module: tests.service_envs\n"
                     f"    replicas: 2\n    concurrency: 2\n    parallel: true\n    port: {base}\n")
    with open(tmp_path / "tasks.jsonl", "w") as f:
        for i in range(16):
            f.write(json.dumps({"id": f"t{i}", "env": "SlowCartPole-v1", "seed": i, "episodes": 2}) + "\n")
    out = tmp_path / "results.jsonl"
    proc = None
    try:
        up = launch.run(["up", str(fleet)], 90, module="sf_core.fleet")
        assert up.returncode == 0, up.stdout + up.stderr
        proc = launch.start([f"--tasks={tmp_path / 'tasks.jsonl'}", f"--env_service={fleet}", "--num_workers=2",
                             "--concurrency=2", "--max_task_retries=0", "--env_service_recheck_interval=0.3",
                             f"--output={out}"], module="sf_core.evaluate", output=subprocess.DEVNULL)
        wait_for(lambda: out.exists() and len(out.read_text().splitlines()) >= 3, 90, "3 results")
        control = FleetControl(str(fleet))
        assert control.drain(f"127.0.0.1:{base + 1}") == ("slow", [f"127.0.0.1:{base + 1}"])
        drained_at = time.time()
        assert proc.wait(timeout=120) == 0
        assert control.wait_closed([f"127.0.0.1:{base + 1}"], timeout=10) == []  # each closed when its task ended
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        down = launch.run(["down", str(fleet)], 60, module="sf_core.fleet")
    assert down.returncode == 0 and servers_on([base, base + 1]) == []
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r["id"] for r in lines) == sorted(f"t{i}" for i in range(16))
    assert all(r["status"] == "ok" and r["failures"] == 0 and len(r["returns"]) == 2 for r in lines)
    on_drained = [r for r in lines if r["slot"].startswith(f"127.0.0.1:{base + 1}#")]
    later = [r for r in lines if r["attempts"][0]["started"] > drained_at + 1.0]  # the pool has followed by then
    assert later and all(r["slot"].startswith(f"127.0.0.1:{base}#") for r in later), later
    held = [r for r in on_drained if r["attempts"][0]["started"] < drained_at < r["attempts"][0]["ended"]]
    assert held, "no task was on the server drained when it was drained"  # those finished there, ok
