"""The command line: every flag of `Config` as an argparse option, presets applied underneath, validated.

`parse_args` builds the parser from the `Config` dataclass (sf_core/config.py), applies the env preset (or,
for an env without one, defaults fitted to its spaces) underneath whatever the user typed
(sf_core/cli/value_sources.py), fits the machine's flags, and validates the result. Every entry point and script takes its
booleans through `add_bool_argument`, so `--flag`, `--flag=False` and `--flag False` all work.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
from typing import Any, Callable, Sequence

from sf_core.cli.parser import _Parser, explicit_flags  # noqa: F401  (every entry point's parser)
from sf_core.config import GROUPS, Config, ConfigError



def str2bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "y", "on"):
        return True
    if lowered in ("0", "false", "no", "n", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected a boolean (True/False), got {text!r}")


BOOL_EPILOG = ("Boolean flags ([BOOL]) take True/False, yes/no or 1/0, as --flag=False or --flag False; "
               "--flag alone means True.")


def add_bool_argument(parser: argparse.ArgumentParser | argparse._ArgumentGroup, name: str, default: bool | None,
                      help: str) -> None:
    """A boolean flag as Sample Factory users type it: `--name` alone means True; `--name=False` and
    `--name False` (any str2bool spelling) set it either way. Every entry point and script uses this.
    A default of None lets the caller tell "not given" apart (e.g. enjoy's --with_wandb: the run's own)."""
    parser.add_argument(f"--{name}", type=str2bool, nargs="?", const=True, default=default, metavar="BOOL",
                        help=help)


def _arg_type(f: dataclasses.Field) -> dict[str, Any]:
    kind = f.type  # a string: this module uses `from __future__ import annotations`
    if kind in ("int", int):
        return {"type": int}
    if kind in ("float", float):
        return {"type": float}
    if kind in ("list[int]",):
        return {"type": int, "nargs": "*"}
    if kind in ("list[str]",):
        return {"type": str, "nargs": "*"}
    return {"type": str}


def build_parser(prog: str = "python -m sf_core.train", description: str = "") -> argparse.ArgumentParser:
    parser = _Parser(prog=prog, description=description, epilog=BOOL_EPILOG, allow_abbrev=False,
                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    groups = {name: parser.add_argument_group(name) for name in GROUPS}
    for f in dataclasses.fields(Config):
        meta = f.metadata
        if not meta.get("cli", True):
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        if f.type in ("bool", bool):
            add_bool_argument(groups[meta["group"]], f.name, default, meta["help"])
            continue
        groups[meta["group"]].add_argument(
            f"--{f.name}", default=default, help=meta["help"], choices=meta["choices"], **_arg_type(f)
        )
    return parser


def asks_for_help(argv: Sequence[str]) -> bool:
    """Whether -h or --help is among the options of `argv` (before a bare `--`)."""
    options = list(argv)[:list(argv).index("--")] if "--" in argv else argv
    return "-h" in options or "--help" in options


def parse_args(argv: Sequence[str], parser: argparse.ArgumentParser | None = None,
               parsed: Callable[[dict[str, Any]], None] | None = None,
               announce: Callable[[str], None] | None = None) -> tuple[Config, str | None]:
    """Parse and validate; returns the config and the name of the preset applied (if any). `parsed` sees the
    flags' values (presets applied) before the checks, which import torch (seconds) to validate them;
    `announce` gets the lines that say what was applied under the user's flags, once they are valid. With
    -h/--help: the help, showing the values this command line gets, and SystemExit."""
    from sf_core.cli.value_sources import layered_values
    from sf_core.machine.fit import check_device, fit, this_machine
    from sf_core.service.endpoints import ServiceConfigError, apply_to_training, set_by_services

    parser = parser or build_parser()
    if asks_for_help(argv):
        from sf_core.cli.help_values import print_help

        print_help(parser, argv)
    layered = layered_values(parser, argv)
    values = layered.values
    values["preset"] = layered.preset.key if layered.preset.values else ""
    values["env_fit"] = layered.fitted()
    chosen = layered.typed | set(layered.under) | set_by_services(values)
    if parsed is not None:
        parsed(values)
    check_device(values["device"])
    values["machine_fit"] = fit(values, chosen, this_machine(values["device"]))
    try:
        apply_to_training(values, layered.typed)
    except ServiceConfigError as exc:
        raise ConfigError(str(exc)) from None
    cfg = Config(**values)
    import_flag_checks()
    cfg.validate()
    for line in layered.lines() if announce is not None else ():
        announce(line)
    return cfg, cfg.preset or None


# The modules whose flag checks Config.validate runs: each registers its own (sf_core.config.register_check)
FLAG_CHECKS = ("sf_core.algo.graphed_sgd", "sf_core.algo.meshes", "sf_core.algo.registry", "sf_core.algo.rnd",
               "sf_core.algo.split_actor_critic", "sf_core.algo.teacher",
               "sf_core.cluster.flags", "sf_core.envs.vector_backends",
               "sf_core.learning.group.flags", "sf_core.run.pbt",
               "sf_core.service.endpoints")


def import_flag_checks() -> None:
    for module in FLAG_CHECKS:
        importlib.import_module(module)
