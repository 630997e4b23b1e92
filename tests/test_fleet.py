"""A fleet of env services described once: the fleet file, `python -m sf_core.fleet up|down|status`, the
capacity arithmetic it prints (the trainer's), clear errors that leave nothing running, and training on it."""

from __future__ import annotations

import re
import socket
import sys

import psutil
import pytest

from sf_core.cli.arguments import parse_args
from sf_core.config import ConfigError
from sf_core.cli.fleet import main as fleet_main
from sf_core.service.capacity import plan_capacity
from sf_core.service.endpoints import parse_pools, parse_service, service_capacity, worker_slice
from sf_core.service.fleet_file import FleetError, load_fleet
from tests import launch
from tests.helpers import bindable, free_ports, read_summary


def fleet(*args: str, timeout: float = 90):
    return launch.run(list(args), timeout, module="sf_core.fleet")


def servers_on(ports: list[int]) -> list[psutil.Process]:
    """Running processes whose command line names one of these ports (what a fleet left behind)."""
    marks = {f"--port={p}" for p in ports} | {str(p) for p in ports}
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        cmdline = proc.info["cmdline"] or []
        if proc.info["status"] != psutil.STATUS_ZOMBIE and "sf_core.fleet" not in cmdline and marks & set(cmdline):
            found.append(proc)
    return found


def expand(text: str) -> list[str]:
    """The slot names of the printout's `host:port#first-last` runs."""
    names = []
    for run in text.split():
        address, _, indices = run.rpartition("#")
        first, _, last = indices.partition("-")
        names += [f"{address}#{i}" for i in range(int(first), int(last or first) + 1)]
    return names


def printed_slices(stdout: str, service: str) -> dict[int, list[str]]:
    """worker -> its slots of `service`, as `fleet up` printed them."""
    slices = {}
    for m in re.finditer(r"^  worker (\d+): (.*)$", stdout, re.M):
        part = next(p for p in m.group(2).split("; ") if p.startswith(service + " "))
        slices[int(m.group(1))] = expand(part[len(service) + 1:])
    return slices


THREE = """workers: 2
services:
  sim:
    env: CartPole-v1
    containers: 2
    concurrency: 2
    replicas: 1
    port: {p0}
  reward:
    env: ObsReward-v0
    env_module: tests.service_envs
    replicas: 2
    concurrency: 2
    port: {p1}
  physics:
    command: {python} -m sf_core.env_server --env=CartPole-v1 --port={{port}} --capacity={{concurrency}} --seed={{seed}}
    env: CartPole-v1
    replicas: 2
    concurrency: 2
    port: {p2}
"""


# ------------------------------------------------------------------ the file and its arithmetic (fast)


def test_a_fleet_file_gives_servers_addresses_pools_and_the_trainers_arithmetic(tmp_path):
    path = tmp_path / "fleet.yaml"
    path.write_text(THREE.format(p0=6000, p1=6100, p2=6200, python=sys.executable)
                    + "  far:\n    endpoints: [10.0.0.7:5555*3, {host: 10.0.0.8, port: 5555, capacity: 4}]\n")
    f = load_fleet(str(path))
    sim = f.services["sim"]
    assert [(s.container, s.replica, s.port, s.capacity, s.seed) for s in sim.servers()] == [
        (0, 0, 6000, 2, 0), (1, 0, 6001, 2, 2)]  # seeds follow on: every instance its own
    assert f.services["physics"].argv(f.services["physics"].servers()[1])[-3:] == [
        "--port=6201", "--capacity=2", "--seed=2"]
    assert f.services["far"].servers() == [] and f.run_dir == str(tmp_path / "fleet.run")
    pools = parse_pools(str(path))  # several services: named pools
    assert list(pools) == ["sim", "reward", "physics", "far"]
    assert [str(e) for e in pools["reward"]] == ["127.0.0.1:6100*2", "127.0.0.1:6101*2"]
    cfg, _ = parse_args(["--env=SimWithReward-v0", f"--env_service={path}"])
    assert cfg.num_workers == 2 and cfg.num_envs_per_worker == 2  # the file's workers; 4 slots // 2
    plan = service_capacity(str(path), 2)
    assert plan.bottleneck == "sim" and plan.envs_per_worker == 2
    assert plan.pools["far"].worker_slots(1) == worker_slice(pools["far"], 2, 1)
    text = "\n".join(plan.table())
    assert "  worker 0: sim 127.0.0.1:6000#0-1; reward 127.0.0.1:6100#0-1; physics 127.0.0.1:6200#0-1; " \
           "far 10.0.0.7:5555#0-2 10.0.0.8:5555#0" in text
    assert "far      10.0.0.7:5555*3 + 10.0.0.8:5555*4  7      7 // 2 = 3 (+1 spare: first 1)" in text
    assert ("smallest pool: sim, 4 slots = 2 per worker, so 2 envs per worker, 4 in all; bottleneck: sim "
            "(slots per worker left idle by it: far 1)") in text


def test_a_fleet_of_one_service_is_its_endpoints_with_spare_slots(tmp_path):
    path = tmp_path / "one.yaml"
    path.write_text("services:\n  cartpole:\n    env: CartPole-v1\n    gpus: [0, 1, 2]\n    concurrency: 3\n"
                    "    port: 7000\n")
    f = load_fleet(str(path))
    assert [s.gpu for s in f.servers()] == ["0", "1", "2"] and f.workers is None
    assert parse_pools(str(path)) is None  # one service: plain endpoints, --env is the served env
    assert [str(e) for e in parse_service(str(path))] == ["127.0.0.1:7000*3", "127.0.0.1:7001*3", "127.0.0.1:7002*3"]
    plan = plan_capacity(f.pools(), 2)
    assert plan.envs_per_worker == 4 and "9 // 2 = 4 (+1 spare: first 1)" in "\n".join(plan.table())
    cfg, _ = parse_args(["--env=CartPole-v1", f"--env_service={path}", "--num_workers=2"])
    assert cfg.num_envs_per_worker == 4 and cfg.num_workers == 2


@pytest.mark.parametrize("service, message", [
    ("env: CartPole-v1\n    port: 7000\n    replica: 2", "service s: unknown key 'replica'; did you mean 'replicas'?"),
    ("env: CartPole-v1\n    port: 7000\n    concurrency: 0",
     "service s: concurrency must be an integer of at least 1, got 0"),
    ("env: CartPole-v1\n    port: 7000\n    replicas: 0", "service s: replicas must be an integer of at least 1"),
    ("env: CartPole-v1\n    port: 7000\n    gpus: [0, 1]\n    containers: 3", "containers: 3 but 2 gpus"),
    ("env: CartPole-v1\n    port: 65535\n    replicas: 2", "2 servers from port 65535: port 65536 is not in 1..65535"),
    ("env: CartPole-v1\n    replicas: 2", "service s: port is missing"),
    ("replicas: 2\n    port: 7000", "give the env it serves (env: NAME) or the command"),
    ("command: serve --port={port} --gpu={device}\n    port: 7000", "command uses {device}; it may use {port}"),
    ("command: serve {port}\n    port: 7000\n    args: [-v]", "args and parallel are sf_core.env_server flags"),
    ("endpoints: [10.0.0.7:5555*0]", "capacity of 10.0.0.7:5555 must be at least 1, got 0"),
    ("endpoints: [10.0.0.7:5555*2]\n    port: 7000", "a remote service (endpoints) is started elsewhere; port"),
    ("command: serve {port}\n    skip: true\n    port: 7000", "a skipped service is built in-process from its env"),
])
def test_bad_fleet_files_are_explained(tmp_path, service, message):
    path = tmp_path / "fleet.yaml"
    path.write_text(f"services:\n  s:\n    {service}\n")
    with pytest.raises(FleetError, match=re.escape(message)):
        load_fleet(str(path))


def test_two_services_on_one_port_and_unknown_top_level_keys_are_refused(tmp_path):
    path = tmp_path / "fleet.yaml"
    path.write_text("services:\n  a: {env: CartPole-v1, port: 7000, replicas: 2}\n"
                    "  b: {endpoints: ['127.0.0.1:7001*2']}\n")
    with pytest.raises(FleetError, match="127.0.0.1:7001 belongs to service a and to service b"):
        load_fleet(str(path))
    path.write_text("worker: 2\nservices:\n  a: {env: CartPole-v1, port: 7000}\n")
    with pytest.raises(FleetError, match="unknown key 'worker'; did you mean 'workers'"):
        load_fleet(str(path))


@pytest.mark.parametrize("fleet_text, message", [
    ("services:\n  sim:\n    env: CartPole-v1\n    port: {p}\n    replicas: 2\n    replica: 2\n",
     "service sim: unknown key 'replica'; did you mean 'replicas'?"),
    ("services:\n  sim:\n    env: CartPole-v1\n    port: {p}\n    concurrency: 0\n",
     "service sim: concurrency must be an integer of at least 1, got 0"),
    ("workers: 4\nservices:\n  sim:\n    env: CartPole-v1\n    port: {p}\n    concurrency: 3\n",
     "service sim has 127.0.0.1:{p}*3 = 3 slots for 4 rollout workers"),
])
def test_fleet_up_refuses_a_bad_file_in_one_line_before_starting_anything(tmp_path, capsys, fleet_text, message):
    port = free_ports(2)
    path = tmp_path / "fleet.yaml"
    path.write_text(fleet_text.format(p=port))
    assert fleet_main(["up", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("sf_core.fleet: error: ") and message.format(p=port) in err
    assert not (tmp_path / "fleet.run").exists()  # nothing started, nothing written


def test_skipped_services_are_evaluated_in_process_and_refused_by_training(tmp_path, capsys):
    """A fleet whose every service has skip: true evaluates on in-process envs (nothing is contacted);
    training on a fleet of one skipped service is skip mode, and says so; a fleet of several serves its
    skipped services in-process, as --env_service_skip does."""
    import sf_core.evaluate

    path = tmp_path / "fleet.yaml"
    path.write_text("services:\n  cartpole: {env: CartPole-v1, port: 7000, concurrency: 2, skip: true}\n")
    (tmp_path / "tasks.jsonl").write_text('{"id": "a", "env": "CartPole-v1", "seed": 1}\n')
    assert sf_core.evaluate.main([f"--tasks={tmp_path / 'tasks.jsonl'}", f"--env_service={path}", "--num_workers=0",
                                  f"--output={tmp_path / 'out.jsonl'}"]) == 0
    assert (tmp_path / "out" / "a" / "result.json").exists()
    assert "local:CartPole-v1" in (tmp_path / "out.jsonl").read_text()
    with pytest.raises(ConfigError, match="its one service has skip: true, which is skip mode: train with "
                                          "--env_service=skip:CartPole-v1"):
        parse_args(["--env=CartPole-v1", f"--env_service={path}", "--num_workers=2"])
    from sf_core.service.endpoints import pools_served_in_process

    path.write_text("services:\n  sim: {env: CartPole-v1, port: 7000, concurrency: 2}\n"
                    "  reward: {env: CartPole-v1, port: 7100, concurrency: 2, skip: true}\n")
    assert pools_served_in_process(str(path), "") == {"reward": "CartPole-v1"}


# ------------------------------------------------------------------ processes (slow)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_fleet_up_status_down_leaves_no_process_and_no_port(tmp_path):
    """Three services, two of them 2 replicas × 2 concurrency: up waits until all 7 servers answer and prints
    the arithmetic; status shows every slot; down, from another process, stops them all and frees every port."""
    base = free_ports(30)
    path = tmp_path / "fleet.yaml"
    path.write_text(THREE.format(p0=base, p1=base + 10, p2=base + 20, python=sys.executable)
                    + f"  mock:\n    env: CartPole-v1\n    concurrency: 4\n    port: {base + 29}\n    skip: true\n")
    ports = [base, base + 1, base + 10, base + 11, base + 20, base + 21]
    try:
        up = fleet("up", str(path))
        assert up.returncode == 0, up.stdout + up.stderr
        assert "fleet: 6 servers up" in up.stdout
        assert re.search(r"reward +2 × 2 +4 +4 // 2 = 2 +1 container × 2 replicas × 2 concurrency", up.stdout)
        assert ("smallest pool: sim, 4 slots = 2 per worker, so 2 envs per worker, 4 in all; bottleneck: sim"
                in up.stdout)
        assert printed_slices(up.stdout, "physics") == {
            0: [f"127.0.0.1:{base + 20}#0", f"127.0.0.1:{base + 20}#1"],
            1: [f"127.0.0.1:{base + 21}#0", f"127.0.0.1:{base + 21}#1"]}
        assert len(servers_on(ports)) >= 6 and not any(bindable(p) for p in ports)
        assert "skipped: mock (not started" in up.stdout and bindable(base + 29)  # skip: true is not started
        status = fleet("status", str(path))
        assert status.returncode == 0, status.stdout + status.stderr
        assert f"physics 127.0.0.1:{base + 21}: pid" in status.stdout and "slots: #0 ok, #1 ok" in status.stdout
        again = fleet("up", str(path))  # already up: refused, and the running fleet is untouched
        assert again.returncode == 2 and "is already up" in again.stderr and len(servers_on(ports)) >= 6
    finally:
        down = fleet("down", str(path))
    assert down.returncode == 0 and "fleet: stopped 6 servers" in down.stdout, down.stdout + down.stderr
    assert servers_on(ports) == []
    assert all(bindable(p) for p in ports)
    assert not (tmp_path / "fleet.run" / "state.json").exists()
    assert fleet("down", str(path)).stdout.startswith("fleet: stopped 0 servers")


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_port_in_use_or_a_server_that_exits_at_start_fails_up_and_stops_the_rest(tmp_path):
    base = free_ports(20)
    path = tmp_path / "fleet.yaml"
    good = f"  good:\n    env: CartPole-v1\n    replicas: 2\n    port: {base}\n"
    path.write_text(f"services:\n{good}  taken:\n    env: CartPole-v1\n    port: {base + 10}\n")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", base + 10))
        busy.listen()
        result = fleet("up", str(path))
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert f"sf_core.fleet: error: service taken: port {base + 10} on 127.0.0.1 is in use" in result.stderr
    assert servers_on([base, base + 1]) == []  # refused before anything started
    # a command that exits at once: the servers already started are stopped again
    path.write_text(f"services:\n{good}  broken:\n    command: {sys.executable} -c \"import sys; "
                    f"print('cannot open the simulator'); sys.exit(3)\" {{port}}\n    port: {base + 10}\n")
    result = fleet("up", str(path))
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert (f"service broken: broken[0.0] on 127.0.0.1:{base + 10} exited at start (exit code 3): cannot open the "
            f"simulator") in result.stderr
    assert (tmp_path / "fleet.run" / "logs" / "good-0-1.log").exists()  # it had started the good servers
    assert servers_on([base, base + 1, base + 10]) == [] and bindable(base) and bindable(base + 1)
    assert not (tmp_path / "fleet.run" / "state.json").exists()


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_training_on_a_fleet_file_divides_the_slots_as_printed_and_reaches_its_target(tmp_path):
    """CartPole on 3 servers × 3 slots for the file's 2 workers: the trainer's slices are the printout's
    (4 envs each, worker 0 with a spare slot), and the run reaches its target."""
    base = free_ports(3)
    path = tmp_path / "fleet.yaml"
    path.write_text(f"workers: 2\nservices:\n  cartpole:\n    env: CartPole-v1\n    replicas: 3\n"
                    f"    concurrency: 3\n    port: {base}\n")
    log_path = tmp_path / "train.log"
    try:
        up = fleet("up", str(path))
        assert up.returncode == 0, up.stdout + up.stderr
        assert "9 // 2 = 4 (+1 spare: first 1)" in up.stdout
        printed = printed_slices(up.stdout, "cartpole")
        with open(log_path, "w") as log:
            trainer = launch.start(["--env=CartPole-v1", f"--env_service={path}", f"--train_dir={tmp_path}",
                                    "--experiment=fleet", "--target_mean_return=200", "--train_for_seconds=150",
                                    "--learning_rate=0.001", "--batch_size=128", "--seed=3"], output=log)
            try:
                assert trainer.wait(timeout=200) == 0, log_path.read_text()[-3000:]
            finally:
                if trainer.poll() is None:
                    trainer.kill()
                    trainer.wait(timeout=10)
    finally:
        down = fleet("down", str(path))
    assert down.returncode == 0 and servers_on([base, base + 1, base + 2]) == []
    text = log_path.read_text()
    used = {int(m.group(1)): m.group(2).split(", ")
            for m in re.finditer(r"rollout_worker_(\d+): \d+ env slots \((.*)\)", text)}
    slot = "127.0.0.1:{}#{}".format
    assert used == printed == {0: [slot(base, 0), slot(base, 1), slot(base, 2), slot(base + 1, 0), slot(base + 1, 1)],
                               1: [slot(base + 1, 2), slot(base + 2, 0), slot(base + 2, 1), slot(base + 2, 2)]}
    summary = read_summary(tmp_path, "fleet")
    assert summary["time_to_target"] is not None and summary["mean_return_at_target"] >= 200, summary
