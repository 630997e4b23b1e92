"""`python -m sf_core.env_server --env=NAME --port=P --capacity=C`: serve C instances of a registered env
(the server itself: sf_core/service/env_server.py)."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import time
from typing import Sequence

import gymnasium as gym
import zmq

from sf_core.cli import exit_process, import_user_modules
from sf_core.cli.arguments import BOOL_EPILOG, _Parser, add_bool_argument
from sf_core.config import ConfigError
from sf_core.service.env_server import EnvServer
from sf_core.service.protocol import ProtocolError

log = logging.getLogger("sf_core.env_server")


# -------------------------------------------------------------------- command line


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m sf_core.env_server", description="Serve a registered env over ZeroMQ.",
                epilog=BOOL_EPILOG, formatter_class=argparse.ArgumentDefaultsHelpFormatter, allow_abbrev=False)
    p.add_argument("--env", required=True, help="Env to serve: a registered name or any gymnasium id.")
    p.add_argument("--port", type=int, default=5555, help="TCP port; 0 picks a free one (printed at startup).")
    p.add_argument("--capacity", type=int, default=1, help="Concurrent env instances (slots) served.")
    p.add_argument("--host", default="127.0.0.1", help="Interface to bind; 0.0.0.0 exposes the server to the network.")
    p.add_argument("--env_module", default="", help="Comma-separated modules to import first (they call register_env).")
    p.add_argument("--seed", type=int, default=0, help="Instance i is built with seed + i.")
    p.add_argument("--max_message_bytes", type=int, default=0, help="Largest request answered; 0 sizes it from the spaces.")
    add_bool_argument(p, "parallel", False,
                      "One thread per instance, so instances step at once (for envs that release the GIL: "
                      "C++/GPU simulators, subprocesses, VMs). False: one request at a time, least overhead.")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s env_server %(levelname)s %(message)s")
    try:
        args = build_parser().parse_args(argv)
        import_user_modules(args.env_module)
        server = EnvServer(args.env, args.capacity, args.host, args.port, args.seed,
                           max_bytes=args.max_message_bytes or None, parallel=args.parallel)
    except (ValueError, gym.error.Error, zmq.ZMQError, ProtocolError, ConfigError) as exc:
        print(f"sf_core.env_server: error: {exc}", file=sys.stderr)
        return 2
    except SystemExit as exc:  # --help
        return int(exc.code or 0)
    signal.signal(signal.SIGTERM, lambda *_: server.stop())
    signal.signal(signal.SIGINT, lambda *_: server.stop())
    # one line a supervisor (or a test) can wait for: the port is final now
    print(f"env_server: serving {args.env} on tcp://{server.host}:{server.port} with {args.capacity} slots",
          flush=True)
    started = time.time()
    try:
        server.serve()
    finally:
        server.close()
    log.info("stopped after %.0fs and %d requests", time.time() - started, server.requests)
    return 0


if __name__ == "__main__":
    exit_process(main())
