"""Growing and shrinking a fleet while runs train or evaluate on it: `python -m sf_core.fleet add|drain`, and
the same from Python:

    from sf_core.service.fleet_control import FleetControl

    fleet = FleetControl("fleet.yaml")
    fleet.add("sim", replicas=1)                       # one more server of a local service, started and checked
    fleet.add("physics", endpoints=["10.0.0.9:5555*4"])  # a server started elsewhere, checked
    fleet.drain("127.0.0.1:6001")                      # a whole server ("host:port#i": one slot)
    fleet.drain("sim", replicas=1)                     # the service's last server
    fleet.wait_closed(["127.0.0.1:6001"], timeout=60)  # until the runs closed every slot drained there

Each change is appended to the fleet's changes file, which every pool of every run on the fleet follows
(sf_core/service/elastic.py): slots added join the pools, drained ones leave them once the rollout or the task
on them ends, and are closed on their servers.
"""

from __future__ import annotations

import time
from typing import Sequence

from sf_core.service import launcher
from sf_core.service.addresses import Endpoint, ServiceConfigError, parse_item
from sf_core.service.elastic import ChangesFile, Member, members
from sf_core.service.fleet_file import FleetError, Server, Service, load_fleet

POLL_SEC = 0.2  # between two looks at the drained slots' servers


class FleetControl:
    def __init__(self, path: str):
        self.fleet = load_fleet(path)
        self.changes = ChangesFile(self.fleet.run_dir)

    def members(self, service: str) -> list[Member]:
        """Every slot the service has had (the file's, then those added), drained or not."""
        return members(self.fleet.services[service].endpoints(), self.changes.read(), service)

    def add(self, service: str, replicas: int = 0, endpoints: Sequence[str] = (), timeout: float = 60.0
            ) -> list[Endpoint]:
        """`replicas` more servers of a local service, started here (as `up` starts them, on the ports after the
        service's last) and checked; or `endpoints` (`host:port*N`) started elsewhere, checked. They join the
        pools of the runs on the fleet. Returns the endpoints added; FleetError, with nothing started or
        recorded, if that cannot be done."""
        s = self._service(service)
        if (replicas > 0) == bool(endpoints) or replicas < 0:
            raise FleetError("add takes --replicas N (servers of the service started here) or --endpoint "
                             "HOST:PORT*N (servers started elsewhere), one of them")
        if replicas:
            if s.remote or s.skip:
                raise FleetError(f"service {service} is {'remote' if s.remote else 'skipped'}: nothing of it is "
                                 f"started here; add servers started elsewhere with --endpoint HOST:PORT*N")
            servers = self._next_servers(s, replicas)
            launcher.start_servers(self.fleet, servers, timeout)
            added = [Endpoint(x.address.rsplit(":", 1)[0], x.port, x.capacity) for x in servers]
        else:
            try:
                added = [parse_item(e, "--endpoint") for e in endpoints]
            except ServiceConfigError as exc:
                raise FleetError(str(exc)) from None
            for e in added:
                self._check_free(e.address, service)
                launcher.check_answers(self.fleet, service, e.address, e.capacity, time.monotonic() + timeout, None)
        self.changes.append({"op": "add", "service": service, "endpoints": [str(e) for e in added],
                             "started": bool(replicas)})
        return added

    def drain(self, target: str, replicas: int = 1) -> tuple[str, list[str]]:
        """Drain a slot (`host:port#i`), a server (`host:port`) or a service's last `replicas` servers (its
        name). Returns the service and the targets drained; FleetError if there is nothing to drain there."""
        if target in self.fleet.services:
            service = target
            live = [m.address for m in reversed(self.members(service)) if not m.drained]
            targets = list(dict.fromkeys(live))[:replicas]
            if len(targets) < replicas:
                raise FleetError(f"service {service} has {len(targets)} server(s) with slots not drained; "
                                 f"cannot drain {replicas}")
        else:
            service = self._owner(target)
            if all(m.drained for m in self.members(service) if target in (m.name, m.address)):
                raise FleetError(f"{target} is drained already")
            targets = [target]
        self.changes.append({"op": "drain", "service": service, "targets": targets})
        return service, targets

    def slots_left(self, service: str) -> int:
        return sum(not m.drained for m in self.members(service))

    def wait_closed(self, targets: Sequence[str], timeout: float) -> list[str]:
        """Wait until every slot of `targets` (drained) is closed on its server, at most `timeout` seconds; the
        slots still open then (none: every one was given back by the runs and closed)."""
        wanted = [m for service in self.fleet.services for m in self.members(service)
                  if m.drained and any(t in (m.name, m.address) for t in targets)]
        deadline = time.monotonic() + timeout
        while True:
            states = {a: launcher.slot_states(a, timeout=1.0) for a in {m.address for m in wanted}}
            still = [m.name for m in wanted if (states[m.address] or [])[m.slot.index:m.slot.index + 1] != ["closed"]]
            if not still or time.monotonic() >= deadline:
                return still
            time.sleep(POLL_SEC)

    def stop_servers(self, addresses: Sequence[str], grace: float = 10.0) -> list[str]:
        """Stop the servers at `addresses` that the fleet started (`up` or `add`); the servers stopped."""
        return launcher.stop_drained(self.fleet, set(addresses), grace)

    # ---------------------------------------------------------------- helpers
    def _service(self, name: str) -> Service:
        if name not in self.fleet.services:
            raise FleetError(f"{self.fleet.path} has no service {name!r} (its services: "
                             f"{', '.join(self.fleet.services)})")
        return self.fleet.services[name]

    def _owner(self, target: str) -> str:
        """The service a slot or a server belongs to; FleetError if none."""
        for service in self.fleet.services:
            if any(target in (m.name, m.address) for m in self.members(service)):
                return service
        raise FleetError(f"no service of {self.fleet.path} has {target}; give a service, a server (host:port) or a "
                         f"slot (host:port#index) of it")

    def _check_free(self, address: str, service: str) -> None:
        """An address belongs to one service; it is added again only where all of its slots were drained."""
        for other in self.fleet.services:
            here = [m for m in self.members(other) if m.address == address]
            if here and (other != service or not all(m.drained for m in here)):
                raise FleetError(f"{address} belongs to service {other} already"
                                 + (" (not drained)" if other == service else "; an address belongs to one service"))

    def _next_servers(self, s: Service, replicas: int) -> list[Server]:
        """The service's next servers: numbered on from its last (the file's, then those added here), each on
        port + its number, with seeds that follow on, spread over the containers (GPUs) in turn."""
        started = sum(len(c["endpoints"]) for c in self.changes.read()
                      if c["op"] == "add" and c.get("service") == s.name and c.get("started"))
        first = len(s.servers()) + started
        servers = []
        for k in range(first, first + replicas):
            container = (k - len(s.servers())) % len(s.gpus)
            replica = s.replicas + (k - len(s.servers())) // len(s.gpus)
            server = Server(s.name, container, replica, s.gpus[container], s.host, s.port + k, s.concurrency,
                            s.seed + k * s.concurrency)
            self._check_free(server.address, s.name)
            servers.append(server)
        if servers[-1].port > 65535:
            raise FleetError(f"service {s.name}: its next server would listen on port {servers[-1].port}")
        return servers
