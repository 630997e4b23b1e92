"""The command line: every flag of `Config` as an argparse option, presets applied underneath, validated.

`parse_args` builds the parser from the `Config` dataclass (sf_core/config.py), applies the env preset
underneath whatever the user typed, and validates the result. Every entry point and script takes its
booleans through `add_bool_argument`, so `--flag`, `--flag=False` and `--flag False` all work.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import importlib
from typing import Any, Callable, Sequence

from sf_core.cli import import_user_modules
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


# Other trainers' names for flags users bring (Stable-Baselines3, CleanRL): what to write here instead
THEIR_NAMES = {
    "n_envs": "--num_workers and --num_envs_per_worker (envs = workers × envs per worker)",
    "num_envs": "--num_workers and --num_envs_per_worker (envs = workers × envs per worker)",
    "n_steps": "--rollout", "num_steps": "--rollout",
    "total_timesteps": "--train_for_env_steps",
    "n_epochs": "--num_epochs", "update_epochs": "--num_epochs",
    "num_minibatches": "--num_batches_per_epoch",
    "ent_coef": "--exploration_loss_coeff", "vf_coef": "--value_loss_coeff",
    "clip_range": "--ppo_clip_ratio", "clip_coef": "--ppo_clip_ratio",
    "env_id": "--env", "cuda": "--device",
}
UNRECOGNIZED = "unrecognized arguments: "


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of exiting, so `train.main(argv)` can return an exit code."""

    def error(self, message: str) -> None:  # type: ignore[override]
        if message.startswith(UNRECOGNIZED):
            hints = [hint for token in message[len(UNRECOGNIZED):].split() if (hint := self.suggest(token))]
            message += "".join(f"; {hint}" for hint in hints)
        raise ConfigError(message)

    def suggest(self, token: str) -> str | None:
        """What a mistyped or foreign flag most likely means here, or None."""
        if not token.startswith("--"):
            return None
        name = token[2:].split("=", 1)[0]
        if name in THEIR_NAMES:
            return f"--{name} is another trainer's flag: here it is {THEIR_NAMES[name]}"
        known = [option for option in self._option_string_actions if option.startswith("--")]
        close = difflib.get_close_matches(f"--{name}", known, n=3, cutoff=0.75)
        return f"--{name}: did you mean {' or '.join(close)}?" if close else None


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


def explicit_flags(parser: argparse.ArgumentParser, argv: Sequence[str]) -> set[str]:
    """Names of the flags the user actually typed (presets must not override them)."""
    shadow = argparse.Namespace()
    probe = _Parser(add_help=False, allow_abbrev=False)
    for action in parser._actions:
        if action.dest != "help":
            # a bare boolean flag (`--save_video`) stores its const: it was typed all the same
            const = {"const": action.const} if action.const is not None else {}
            probe.add_argument(*action.option_strings, dest=action.dest, nargs=action.nargs,
                               default=argparse.SUPPRESS, type=action.type, choices=action.choices, **const)
    probe.parse_args(list(argv), namespace=shadow)
    return set(vars(shadow))


def parse_args(argv: Sequence[str], parser: argparse.ArgumentParser | None = None,
               parsed: Callable[[dict[str, Any]], None] | None = None) -> tuple[Config, str | None]:
    """Parse and validate; returns the config and the name of the preset applied (if any). `parsed` sees the
    flags' values (presets applied) before the checks, which import torch (seconds) to validate them."""
    from sf_core.machine.fit import check_device, fit, this_machine
    from sf_core.run.presets import preset_for
    from sf_core.service.endpoints import ServiceConfigError, apply_to_training, set_by_services

    parser = parser or build_parser()
    args = parser.parse_args(list(argv))
    import_user_modules(args.env_module)  # before anything looks the env up
    typed = explicit_flags(parser, argv)
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(Config) if f.metadata.get("cli", True)}
    preset_name, preset = preset_for(values["env"], values["algo"])
    for key, value in preset.items():
        if key not in typed:
            values[key] = value
    chosen = typed | set(preset) | set_by_services(values)
    if parsed is not None:
        parsed(values)
    check_device(values["device"])
    values["machine_fit"] = fit(values, chosen, this_machine(values["device"]))
    try:
        apply_to_training(values, typed)
    except ServiceConfigError as exc:
        raise ConfigError(str(exc)) from None
    cfg = Config(**values)
    import_flag_checks()
    cfg.validate()
    return cfg, preset_name


# The modules whose flag checks Config.validate runs: each registers its own (sf_core.config.register_check)
FLAG_CHECKS = ("sf_core.algo.registry", "sf_core.algo.rnd", "sf_core.algo.teacher", "sf_core.cluster.flags",
               "sf_core.learning.group.flags", "sf_core.run.pbt",
               "sf_core.service.endpoints")


def import_flag_checks() -> None:
    for module in FLAG_CHECKS:
        importlib.import_module(module)
