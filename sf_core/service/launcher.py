"""Starting and stopping a fleet's local servers (`python -m sf_core.fleet up|down|status`).

Each server is a plain child process in a session (and process group) of its own, with its output in a log
file under the fleet's run folder: it outlives the `up` that started it, a Ctrl-C in that terminal does not
reach it, and `down` stops it with everything it started by signalling its group. The state file
(`<run folder>/state.json`: pid, start time, address, log of every server) is written as each server
starts, so `down` works from a fresh shell, and after an `up` that failed half-way. A pid is trusted only
together with the start time psutil reports for it, so a pid reused by another program is never signalled.

Nothing here restarts a server that dies: the pools' health checks (sf_core/service/env_pool.py) already
take its slots out of service and re-admit them when it answers again.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import subprocess
import time
from typing import Any

from sf_core.service.elastic import ChangesFile
from sf_core.service.fleet_file import Fleet, FleetError, Server
from sf_core.service.protocol import ServiceError
from sf_core.service.remote_env import EnvClient, close_context, hello

PING_TIMEOUT = 0.3  # per try while waiting for a server to answer
STATE_FILE = "state.json"


def _psutil():
    try:
        import psutil
    except ImportError:
        raise FleetError("python -m sf_core.fleet needs psutil: pip install psutil (or the fleet extra: "
                         "pip install -e .[fleet])") from None
    return psutil


def state_path(fleet: Fleet) -> str:
    return os.path.join(fleet.run_dir, STATE_FILE)


def read_state(path: str) -> list[dict]:
    """The servers an `up` started (empty when there is no state file)."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)["servers"]
    except FileNotFoundError:
        return []
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise FleetError(f"{path}: unreadable state file ({exc}); stop its servers by hand, then delete it") from None


def _write_state(path: str, records: list[dict]) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"servers": records}, f, indent=1)
    os.replace(tmp, path)  # whole or not at all: a killed `up` leaves a readable file


def running(record: dict):
    """The psutil process of a recorded server while it runs (the same process: pid and start time), else None."""
    psutil = _psutil()
    try:
        proc = psutil.Process(record["pid"])
        if abs(proc.create_time() - record["started"]) > 0.01 or proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return proc
    except psutil.Error:
        return None


def up(fleet: Fleet, timeout: float) -> None:
    """Start every local server and wait until each answers its health check and serves what the file says;
    check that every remote server answers. FleetError (with everything started stopped again) otherwise.
    A fleet starts as its file says: the changes of an earlier run of it (sf_core/service/elastic.py) are
    forgotten."""
    path = state_path(fleet)
    alive = [r for r in read_state(path) if running(r)]
    if alive:
        raise FleetError(f"{fleet.path} is already up ({len(alive)} servers, state in {path}): "
                         f"run python -m sf_core.fleet down {fleet.path} first")
    _remove(path)  # servers of an earlier `up` that are gone
    ChangesFile(fleet.run_dir).remove()
    try:
        start_servers(fleet, fleet.servers(), timeout)
        for name, service in fleet.services.items():
            for e in service.remote:
                check_answers(fleet, name, e.address, e.capacity, time.monotonic() + timeout, None)
    except BaseException:  # nothing is left running, and no state file
        stop(read_state(path))
        _remove(path)
        raise
    finally:
        close_context()


def start_servers(fleet: Fleet, servers: list[Server], timeout: float) -> None:
    """Start `servers` (the file's, or replicas added to a running fleet), adding each to the state file as it
    starts, and wait until each answers and serves what its service says. FleetError otherwise, with the
    servers it started stopped again and taken out of the state file."""
    path = state_path(fleet)
    for server in servers:
        _check_port_free(server)
    os.makedirs(os.path.join(fleet.run_dir, "logs"), exist_ok=True)
    before = read_state(path)
    records: list[dict] = []
    children: dict[int, subprocess.Popen] = {}  # by pid: how this process learns an exit code, and reaps
    try:
        for server in servers:
            child = _start(fleet, server, records)
            children[child.pid] = child
            _write_state(path, before + records)
        _wait_healthy(fleet, records, children, time.monotonic() + timeout, timeout)
    except BaseException:  # a failure, Ctrl-C or SIGTERM: nothing is left running
        stop(records)
        for child in children.values():
            child.wait()  # reaped: no zombie outlives this process's wait for the others
        _write_state(path, before)
        raise
    finally:
        close_context()


def _check_port_free(server: Server) -> None:
    """Refuse a port something already listens on, before anything starts (bound the way ZeroMQ binds)."""
    family = socket.AF_INET6 if ":" in server.host else socket.AF_INET
    host = "" if server.host in ("*", "0.0.0.0", "::") else server.host
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, server.port))
        except OSError as exc:
            why = "is in use" if exc.errno == errno.EADDRINUSE else f"cannot be bound ({exc.strerror})"
            raise FleetError(f"service {server.service}: port {server.port} on {server.host} {why}; "
                             f"change the service's port (or stop what listens there)") from None


def _start(fleet: Fleet, server: Server, records: list[dict]) -> subprocess.Popen:
    """Start `server`, adding its record to `records`."""
    argv = fleet.services[server.service].argv(server)
    log = os.path.join(fleet.run_dir, "logs", f"{server.service}-{server.container}-{server.replica}.log")
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if server.gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = server.gpu  # the container's GPU, and only it
    with open(log, "ab") as out:
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True)  # its own group: `down` signals the whole of it
        except OSError as exc:
            raise FleetError(f"service {server.service}: cannot run {argv[0]!r} ({exc.strerror})") from None
    records.append({"service": server.service, "server": server.name, "pid": proc.pid,
                    "started": _psutil().Process(proc.pid).create_time(), "address": server.address,
                    "capacity": server.capacity, "log": log, "argv": argv})
    return proc


def _wait_healthy(fleet: Fleet, records: list[dict], children: dict[int, subprocess.Popen], deadline: float,
                  timeout: float) -> None:
    """Until every started server answers a ping, then its hello: a server that exits meanwhile, or is
    still silent at the deadline, fails the whole `up`."""
    pending = list(records)
    while pending:
        for record in list(pending):
            code = children[record["pid"]].poll()
            if code is not None:
                raise FleetError(f"service {record['service']}: {record['server']} on {record['address']} exited at "
                                 f"start (exit code {code}): {_last_line(record['log'])} (log: {record['log']})")
            client = EnvClient(record["address"], PING_TIMEOUT)
            try:
                client.request({"cmd": "ping"})
            except ServiceError:
                continue
            finally:
                client.close()
            check_answers(fleet, record["service"], record["address"], record["capacity"], deadline, record["log"])
            pending.remove(record)
        if pending and time.monotonic() > deadline:
            names = ", ".join(f"{r['server']} ({r['log']})" for r in pending)
            raise FleetError(f"not answering {timeout:g}s after start: {names}")


def check_answers(fleet: Fleet, name: str, address: str, capacity: int, deadline: float, log: str | None) -> None:
    """The server at `address` answers hello, serves the service's env (when the file names it) and has at
    least the capacity its service gives it."""
    client = EnvClient(address, max(0.5, deadline - time.monotonic()))
    try:
        answer = hello(client)
    except ServiceError as exc:
        raise FleetError(f"service {name}: {address} does not answer ({exc})") from None
    finally:
        client.close()
    env = fleet.services[name].env
    where = f" (log: {log})" if log else ""
    if env is not None and answer["env"] != env:
        raise FleetError(f"service {name}: {address} serves {answer['env']!r}, not env {env!r}{where}")
    if answer["capacity"] < capacity:
        raise FleetError(f"service {name}: {address} has {answer['capacity']} slots, not {capacity}{where}")


def _last_line(log: str) -> str:
    try:
        with open(log, encoding="utf-8", errors="replace") as f:
            lines = [line.strip() for line in f if line.strip()]
    except OSError:
        return "no log"
    return lines[-1] if lines else "it printed nothing"


def stop(records: list[dict], grace: float = 10.0) -> list[str]:
    """SIGTERM to every running server's process group, SIGKILL to what is left after `grace` seconds;
    the names of the servers that were running."""
    psutil = _psutil()
    procs = {}
    for record in records:
        proc = running(record)
        if proc is not None:
            procs[proc] = record["server"]
            _signal_group(record["pid"], signal.SIGTERM)
    _, alive = psutil.wait_procs(list(procs), timeout=grace)
    for proc in alive:
        _signal_group(proc.pid, signal.SIGKILL)
    psutil.wait_procs(alive, timeout=5.0)
    return list(procs.values())


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)  # started with start_new_session: its group id is its pid
    except ProcessLookupError:
        pass


def down(fleet_run_dir: str, grace: float) -> list[str]:
    """Stop every server of the state file in `fleet_run_dir` (those `add` started too) and remove the file,
    and the fleet's changes; the servers stopped."""
    path = os.path.join(fleet_run_dir, STATE_FILE)
    stopped = stop(read_state(path), grace)
    _remove(path)
    ChangesFile(fleet_run_dir).remove()
    return stopped


def stop_drained(fleet: Fleet, addresses: set[str], grace: float) -> list[str]:
    """Stop the servers at `addresses` that this fleet started (drained: every slot closed) and take them out of
    the state file; the servers stopped."""
    path = state_path(fleet)
    records = read_state(path)
    stopped = stop([r for r in records if r["address"] in addresses], grace)
    _write_state(path, [r for r in records if r["address"] not in addresses])
    return stopped


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def slot_states(address: str, timeout: float) -> list[str] | None:
    """Every slot's health as its server reports it (`ok`, `broken`), or None when it does not answer."""
    client = EnvClient(address, timeout)
    try:
        reply: dict[str, Any] = client.request({"cmd": "ping"})[0]
        return list(reply["slots"])
    except ServiceError:
        return None
    finally:
        client.close()
