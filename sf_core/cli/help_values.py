"""`--help` that shows the values a command line gets: with `--env=X` (and any other flags, in any order),
each flag whose value is not Sample Factory's default shows the value the run would use and where it comes
from (the env's preset, defaults fitted to its spaces, this machine, or the command line), and a line at the
top and at the bottom names the preset applied, or says that none applies."""

from __future__ import annotations

import argparse
from typing import Any, NoReturn, Sequence

from sf_core.cli.value_sources import Layered, layered_values
from sf_core.config import ConfigError

SHOWN = "each flag's help shows the value a run of this command line gets and where it comes from"
WITHOUT_ENV = ("Per-env presets (sf_core/run/presets.py, listed in docs/flags.md) and, for an env without one, "
               "defaults fitted to its spaces replace some of these defaults, under the flags you type: add "
               "--env=ENV to see the values a run of ENV gets (python -m sf_core.train --env=HalfCheetah-v5 "
               "--help).")


def print_help(parser: argparse.ArgumentParser, argv: Sequence[str]) -> NoReturn:
    """Print `parser`'s help with the values `argv` (less -h/--help) gives, then SystemExit(0)."""
    rest = [arg for arg in argv if arg not in ("-h", "--help")]
    try:
        layered = layered_values(parser, rest)
        summary = summarize(layered)
    except ConfigError as exc:  # a bad value: the help was asked for all the same
        layered, summary = None, f"(The values of this command line could not be read: {exc}.)"
    if layered is not None:
        show_values(parser, layered, machine_fitted(layered))
    parser.description = f"{parser.description or ''}\n\n{summary}".strip()
    parser.epilog = f"{parser.epilog or ''}\n\n{summary}".strip()
    parser.print_help()
    raise SystemExit(0)


def summarize(layered: Layered) -> str:
    """The line naming the preset applied to --env, or the defaults fitted to its spaces, or that none applies."""
    env, match = layered.values["env"], layered.preset
    if not env:
        return WITHOUT_ENV
    if match.values:
        made_for = f" (made for {match.key}: {env} has the same spaces)" if match.how == "version" else ""
        return f"--env={env}: the {match.key} preset applies{made_for}; {SHOWN}."
    if layered.fitted():
        return f"--env={env} has no preset; defaults fitted to its spaces ({layered.fit.spaces}) apply; {SHOWN}."
    near = f" ({match.describe(env)})" if match.how == "elsewhere" else ""
    return (f"--env={env}: no preset applies{near}, and no defaults are fitted to its spaces "
            f"(sf_core/run/env_fit.py says which are); the defaults here are Sample Factory's.")


def machine_fitted(layered: Layered) -> dict[str, Any]:
    """The flags the run would fit to this machine (sf_core/machine/fit.py), as parse_args does: name -> value."""
    from sf_core.machine.fit import check_device, fit, this_machine

    values = dict(layered.values)
    try:
        check_device(values["device"])
    except ConfigError:
        return {}
    names = fit(values, layered.typed | set(layered.under), this_machine(values["device"]))
    return {name: values[name] for name in names}


def show_values(parser: argparse.ArgumentParser, layered: Layered, machine: dict[str, Any]) -> None:
    """Each flag not at Sample Factory's default gets the value this command line gives it, and its source;
    a typed one shows the default it replaced too."""
    for action in parser._actions:
        name = action.dest
        if name not in layered.values or action.help is None:
            continue
        underneath = layered.underneath(name)
        if underneath is not None:
            action.default = layered.under[name]
        elif name in machine:
            underneath, action.default = "fitted to this machine", machine[name]
        if name in layered.typed:
            where = f", {underneath}" if underneath else ""
            action.help += f" (typed: {_escaped(layered.values[name])}; default: %(default)s{where})"
        elif underneath is not None:
            action.help += f" (default: %(default)s, {underneath})"


def _escaped(value: Any) -> str:
    """A value inside a help string, which argparse formats with %."""
    return str(value).replace("%", "%%")
