"""The argparse parser of every entry point: it raises instead of exiting, takes a flag's dashed spelling as the
flag, and answers an unknown flag with the one it most likely means; and which flags a command line typed."""

from __future__ import annotations

import argparse
import difflib
import sys
from typing import Sequence

from sf_core.cli.their_names import their_name_hint
from sf_core.config import ConfigError

UNRECOGNIZED = "unrecognized arguments: "


class _Parser(argparse.ArgumentParser):
    """argparse for every entry point: raises instead of exiting, so `train.main(argv)` can return an exit code;
    takes a flag's dashed spelling (`--num-workers=4`, as CleanRL and RL-Zoo write flags) as the flag, while
    `--help` lists the underscored names only; answers an unknown flag with the one it most likely means."""

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None) -> tuple[argparse.Namespace, list[str]]:
        return super().parse_known_args(self.underscored(sys.argv[1:] if args is None else args), namespace)

    def underscored(self, args: Sequence[str]) -> list[str]:
        """`args` with each dashed spelling of a flag of this parser written as the flag (up to a bare `--`)."""
        out: list[str] = []
        for i, token in enumerate(args):
            if token == "--":
                return out + list(args[i:])
            option, eq, value = token.partition("=")
            if option.startswith("--") and option not in self._option_string_actions:
                flag = "--" + option[2:].replace("-", "_")
                token = flag + eq + value if flag in self._option_string_actions else token
            out.append(token)
        return out

    def error(self, message: str) -> None:  # type: ignore[override]
        if message.startswith(UNRECOGNIZED):
            hints = [hint for token in message[len(UNRECOGNIZED):].split() if (hint := self.suggest(token))]
            message += "".join(f"; {hint}" for hint in hints)
        raise ConfigError(message)

    def suggest(self, token: str) -> str | None:
        """What a mistyped or foreign flag most likely means here, or None."""
        option = token.split("=", 1)[0]
        hint = their_name_hint(option)
        if hint is not None or not option.startswith("--"):
            return hint
        known = [option for option in self._option_string_actions if option.startswith("--")]
        close = difflib.get_close_matches("--" + option[2:].replace("-", "_"), known, n=3, cutoff=0.75)
        return f"{option}: did you mean {' or '.join(close)}?" if close else None


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
