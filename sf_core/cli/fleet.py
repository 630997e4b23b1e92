"""`python -m sf_core.fleet up|down|status FLEET.yaml`: start, stop and inspect the env servers a fleet file
describes (the file: sf_core/service/fleet_file.py; the processes: sf_core/service/launcher.py), and print how
their slots are divided among the rollout workers (sf_core/service/capacity.py, the trainer's arithmetic).
`add FLEET.yaml SERVICE` and `drain FLEET.yaml SERVICE|HOST:PORT[#I]` grow and shrink it while runs use it
(sf_core/service/fleet_control.py)."""

from __future__ import annotations

import argparse
import signal
import sys
from typing import Sequence

from sf_core.cli.arguments import _Parser
from sf_core.service import launcher
from sf_core.service.addresses import ServiceConfigError
from sf_core.service.capacity import CapacityPlan, describe, plan_capacity
from sf_core.service.elastic import Member
from sf_core.service.fleet_control import FleetControl
from sf_core.service.fleet_file import Fleet, FleetError, Service, fleet_run_dir, load_fleet

EXIT_OK, EXIT_UNHEALTHY, EXIT_USAGE = 0, 1, 2
COMMANDS = ("up", "down", "status", "add", "drain")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m sf_core.fleet", allow_abbrev=False,
                description="Start (up), stop (down), inspect (status), grow (add) or shrink (drain) the env servers "
                            "of a fleet file.",
                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("command", choices=COMMANDS,
                   help="up: start the local servers, wait until each answers, print the capacity; down: stop "
                        "them; status: every server's and slot's state, and the capacity; add: more servers of a "
                        "service, joining the pools of the runs on the fleet; drain: slots leave those pools once "
                        "the rollout or task on them ends, and are closed.")
    p.add_argument("fleet", help="The fleet file (YAML with services:).")
    p.add_argument("target", nargs="?", default=None,
                   help="add: the service. drain: a service (its last --replicas servers), a server (HOST:PORT) "
                        "or a slot (HOST:PORT#INDEX).")
    p.add_argument("--replicas", type=int, default=0,
                   help="add: servers of the service to start, on the ports after its last (default 1 without "
                        "--endpoint); drain: servers of the service to drain, the last ones first (default 1).")
    p.add_argument("--endpoint", action="append", default=[],
                   help="add: HOST:PORT*N, a server started elsewhere (repeat for several).")
    p.add_argument("--wait", type=float, default=0.0,
                   help="drain: seconds to wait until the runs have closed every slot drained; then the servers "
                        "drained whole that the fleet started are stopped. 0: return at once.")
    p.add_argument("--num_workers", type=int, default=0,
                   help="Rollout workers the capacity arithmetic is printed for; 0: the file's workers (else 1).")
    p.add_argument("--timeout", type=float, default=60.0,
                   help="up, add: seconds every server has to answer after it starts (building its envs included).")
    p.add_argument("--grace_period", type=float, default=10.0,
                   help="down: seconds a server has to exit after SIGTERM before it is killed.")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    except SystemExit as exc:  # --help, or a usage error argparse has printed
        return int(exc.code or 0)
    try:
        if (args.target is None) != (args.command in ("up", "down", "status")):
            raise ServiceConfigError(f"{args.command} takes {'no target' if args.target else 'a target'}: "
                                     f"python -m sf_core.fleet {args.command} FLEET.yaml"
                                     + (" SERVICE" if args.command == "add" else " SERVICE|HOST:PORT[#INDEX]"
                                        if args.command == "drain" else ""))
        if args.replicas < 0 or args.wait < 0:
            raise ServiceConfigError("--replicas and --wait must be at least 0")
        if args.command in ("add", "drain"):
            return _add(args) if args.command == "add" else _drain(args)
        if args.command == "down":
            stopped = launcher.down(fleet_run_dir(args.fleet), args.grace_period)
            print(f"fleet: stopped {len(stopped)} server{'s' if len(stopped) != 1 else ''}"
                  + (f" ({', '.join(stopped)})" if stopped else ""))
            return EXIT_OK
        fleet = load_fleet(args.fleet)
        if args.num_workers < 0:
            raise ServiceConfigError(f"--num_workers must be at least 0, got {args.num_workers}")
        plan = _capacity(fleet, args.num_workers or fleet.workers or 1)
        if args.command == "up":
            return _up(fleet, plan, args.timeout)
        return _status(fleet, plan)
    except ServiceConfigError as exc:  # FleetError included
        print(f"sf_core.fleet: error: {exc}", file=sys.stderr)
        return EXIT_USAGE


def _capacity(fleet: Fleet, workers: int) -> CapacityPlan | None:
    """The trainer's division of the fleet's slots among `workers`; FleetError when a service is too small."""
    for name, endpoints in fleet.pools().items():
        slots = sum(e.capacity for e in endpoints)
        if slots < workers:
            raise FleetError(f"service {name} has {describe(endpoints)} = {slots} slot{'s' if slots != 1 else ''} "
                             f"for {workers} rollout workers: each worker needs a slot of every service; add "
                             f"capacity, or size the fleet for fewer workers (workers: in the file, or --num_workers)")
    return plan_capacity(fleet.pools(), workers) if fleet.pools() else None


def _up(fleet: Fleet, plan: CapacityPlan | None, timeout: float) -> int:
    previous = signal.signal(signal.SIGTERM, _interrupt)  # stopped while starting: stop what was started
    try:
        launcher.up(fleet, timeout)
    except KeyboardInterrupt:
        print("sf_core.fleet: interrupted; every server it started is stopped", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    servers = fleet.servers()
    print(f"fleet: {len(servers)} server{'s' if len(servers) != 1 else ''} up, each answering "
          f"(state and logs in {fleet.run_dir})")
    _print_capacity(fleet, plan)
    return EXIT_OK


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def _status(fleet: Fleet, plan: CapacityPlan | None) -> int:
    """Every server of every service, added ones included, with its process and its slots as the server says
    (ok, broken, closed; drained ones marked); exit code 1 if a slot in service is not ok."""
    control = FleetControl(fleet.path)
    records = {r["address"]: r for r in launcher.read_state(launcher.state_path(fleet))}
    healthy = True
    for name, service in fleet.services.items():
        if service.skip:
            print(f"{name}: skipped (served in-process by the run)")
            continue
        by_address: dict[str, list[Member]] = {}
        for m in control.members(name):
            by_address.setdefault(m.address, []).append(m)
        for address, mine in by_address.items():
            process = _where(service, mine, records.get(address))
            slots = launcher.slot_states(address, timeout=1.0)
            drained = {m.slot.index for m in mine if m.drained}
            if len(drained) < len(mine):  # a server drained whole may be gone
                healthy &= slots is not None and all(s == "ok" for i, s in enumerate(slots) if i not in drained)
            described = ", ".join(f"#{i} {state}" + (" (drained)" if i in drained else "")
                                  for i, state in enumerate(slots)) if slots else "not answering"
            print(f"{name} {address}: {process}; slots: {described}")
    _print_capacity(fleet, plan)
    return EXIT_OK if healthy else EXIT_UNHEALTHY


def _add(args: argparse.Namespace) -> int:
    replicas = args.replicas or (0 if args.endpoint else 1)
    added = FleetControl(args.fleet).add(args.target, replicas, args.endpoint, args.timeout)
    slots = sum(e.capacity for e in added)
    print(f"fleet: added {', '.join(str(e) for e in added)} to service {args.target} ({slots} slots); the pools of "
          f"the runs on {args.fleet} take them in at their next recheck")
    return EXIT_OK


def _drain(args: argparse.Namespace) -> int:
    control = FleetControl(args.fleet)
    service, targets = control.drain(args.target, args.replicas or 1)
    print(f"fleet: draining {', '.join(targets)} of service {service}: each slot leaves its pool when the rollout "
          f"or task on it ends, and is closed; {control.slots_left(service)} slots of {service} left in service")
    if args.wait <= 0:
        return EXIT_OK
    still = control.wait_closed(targets, args.wait)
    if still:
        print(f"sf_core.fleet: still open after {args.wait:g}s: {', '.join(still)} (a run holds them, or no run "
              f"uses the fleet to close them)", file=sys.stderr)
        return EXIT_UNHEALTHY
    stopped = control.stop_servers([t for t in targets if "#" not in t], args.grace_period)
    print(f"fleet: every slot drained is closed" + (f"; stopped {', '.join(stopped)}" if stopped else ""))
    return EXIT_OK


def _where(service: Service, mine: list[Member], record: dict | None) -> str:
    """What runs a server: a process the fleet started (and its state), or something else."""
    if record is not None:
        return _process_state(record)
    if all(m.drained for m in mine):
        return "drained"
    if any(m.added is None for m in mine):
        return "remote" if service.remote else "not started by fleet up"
    return "added, started elsewhere"


def _process_state(record: dict | None) -> str:
    if record is None:
        return "not started by fleet up"
    return f"pid {record['pid']} running" if launcher.running(record) else f"pid {record['pid']} gone"


def _print_capacity(fleet: Fleet, plan: CapacityPlan | None) -> None:
    if plan is not None:
        print("\n".join(plan.table({n: s.deployment() for n, s in fleet.services.items()})))
    skipped = [n for n, s in fleet.services.items() if s.skip]
    if skipped:
        print(f"skipped: {', '.join(skipped)} (not started; served in-process by the run)")
