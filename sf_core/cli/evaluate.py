"""`python -m sf_core.evaluate --tasks=tasks.jsonl [--env_service=...] [--num_workers=N]`: run evaluation tasks
on pooled env slots (or in-process envs) and write one result line per task (the coordinator:
sf_core/evaluation/evaluator.py; the plan: sf_core/evaluation/plan.py)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Sequence

from sf_core.cli import exit_process, import_user_modules
from sf_core.cli.arguments import BOOL_EPILOG, _Parser, add_bool_argument
from sf_core.common.logs import setup_logging
from sf_core.config import ConfigError
from sf_core.evaluation import task_folders
from sf_core.evaluation.evaluator import EXIT_OK, EXIT_USAGE, Coordinator, EvalError, load_tasks
from sf_core.evaluation.plan import make_plan

log = logging.getLogger("sf_core")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m sf_core.evaluate", allow_abbrev=False,
                description="Run evaluation tasks on env services, one result line per task.", epilog=BOOL_EPILOG,
                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--tasks", required=True, help="JSONL file: one task per line (see the module doc).")
    p.add_argument("--env_service", default="",
                   help="host:port*capacity,... or a YAML file (`endpoints:` as for training, or named `pools:`); "
                        "empty: envs are built in this machine's processes from the env registry.")
    p.add_argument("--local_pools", default="",
                   help="Without --env_service: pool=env,... (e.g. sim=CartPole-v1) builds each pool a task needs "
                        "from that registered env; a pool not listed is built from the env of its own name.")
    p.add_argument("--env_module", default="",
                   help="Comma-separated modules to import first, here and in every worker (they call "
                        "register_env and register_task_runner).")
    p.add_argument("--output", default="", help="Result JSONL file (default: TASKS with .results.jsonl).")
    p.add_argument("--output_dir", default="",
                   help="Folder of the task folders, OUTPUT_DIR/<task id>/ (the task's result.json and whatever its "
                        "runner writes there; default: --output without its extension).")
    p.add_argument("--num_workers", type=int, default=2,
                   help="Worker processes; 0: the task runners are threads of the coordinator (for debugging).")
    p.add_argument("--concurrency", type=int, default=0,
                   help="Task runners per worker (threads); 0: enough for every slot to be busy, "
                        "ceil(slots / workers), or 1 without --env_service.")
    p.add_argument("--max_task_retries", type=int, default=2, help="Retries of a task whose slot or service failed.")
    p.add_argument("--env", default="", help="Env of tasks that name none.")
    p.add_argument("--env_service_timeout", type=float, default=5.0, help="Seconds a server may take per request.")
    p.add_argument("--env_service_recheck_interval", type=float, default=1.0,
                   help="Seconds between health checks of a failed slot.")
    p.add_argument("--acquire_timeout", type=float, default=30.0,
                   help="Seconds a task may wait while a pool it needs has no healthy slot at all, before the "
                        "attempt counts as failed (waiting for a busy slot is waiting in line, not limited).")
    p.add_argument("--grace_period", type=float, default=10.0,
                   help="On Ctrl-C/SIGTERM: seconds workers get to finish the tasks in hand before being killed.")
    add_bool_argument(p, "resume", False, "Skip the tasks that finished: their folder has result.json (or they have "
                      "a line in --output).")
    p.add_argument("--train_dir", default="", help="With --experiment: act with that trained policy (else random).")
    p.add_argument("--experiment", default="", help="Experiment whose checkpoint acts.")
    p.add_argument("--checkpoint", default="latest", help="latest, best or a path.")
    p.add_argument("--policy_index", type=int, default=None,
                   help="Which policy of a run with --num_policies > 1 acts (default: the best one).")
    add_bool_argument(p, "eval_deterministic", False, "Trained policy: most likely action.")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    setup_logging()
    try:
        args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    except SystemExit as exc:  # --help
        return int(exc.code or 0)
    except ConfigError as exc:
        print(f"sf_core.evaluate: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        if args.num_workers < 0 or args.max_task_retries < 0 or args.concurrency < 0:
            raise EvalError("--num_workers, --concurrency and --max_task_retries must be at least 0")
        try:
            import_user_modules(args.env_module)  # its register_env and register_task_runner calls
        except ConfigError as exc:
            raise EvalError(str(exc)) from None
        tasks = load_tasks(args.tasks, args.env)
        output = args.output or os.path.splitext(args.tasks)[0] + ".results.jsonl"
        args.output_dir = args.output_dir or os.path.splitext(output)[0]
        ids = [t["id"] for t in tasks]
        if args.resume:
            done = task_folders.resume(output, args.output_dir, ids)
            tasks = [t for t in tasks if t["id"] not in done]
            log.info("--resume: %d tasks already finished, %d to run", len(ids) - len(tasks), len(tasks))
        else:
            if os.path.exists(output):
                os.remove(output)
            task_folders.clear(args.output_dir, ids)
        if not tasks:
            return EXIT_OK
        plan = make_plan(args, tasks)
    except EvalError as exc:
        print(f"sf_core.evaluate: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    log.info("%s; results to %s, task folders in %s", plan.describe(len(tasks)), output, args.output_dir)
    return Coordinator(args, tasks, plan, output).run()


if __name__ == "__main__":
    exit_process(main())
