"""The command-line tools: `python -m sf_core.train|enjoy|evaluate|export|env_server|plot` and
`python -m sf_core.huggingface.push_to_hub|load_from_hub`. Those entry modules are a few lines each and call a
`main` here; nothing below this layer imports it (.importlinter)."""

from __future__ import annotations

import argparse
import gc
import importlib
import sys
from typing import NoReturn

from sf_core.config import ConfigError
from sf_core.records.experiment import load_config

ENV_MODULE_HELP = ("Comma-separated modules to import first, whose register_env (and other register_*) calls make "
                   "a custom env known here (default: the modules the experiment trained with, from config.json).")


def add_env_module_argument(parser: argparse.ArgumentParser, help: str = ENV_MODULE_HELP) -> None:
    """--env_module, as every tool takes it: None when not given, so a tool can fall back to the experiment's."""
    parser.add_argument("--env_module", default=None, help=help)


def import_user_modules(value: str | None) -> None:
    """Import each module of a comma-separated --env_module value (a `python -m` run finds the current folder's):
    one ConfigError naming the module that cannot be imported."""
    for module in filter(None, (m.strip() for m in (value or "").split(","))):
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise ConfigError(f"--env_module={module}: {exc} (a module importable from here: in the current "
                              f"folder or on PYTHONPATH)") from None


def import_experiment_modules(value: str | None, experiment_path: str) -> str:
    """--env_module if given, else the modules the experiment at `experiment_path` trained with (config.json);
    returns what it imported ("" for none)."""
    if value is None:
        try:
            value = load_config(experiment_path).env_module
        except ConfigError:  # no experiment there: the tool says so in its own words
            return ""
    import_user_modules(value)
    return value or ""


def unregistered_env_hint(env_module: str, replaying: bool = True) -> str:
    """What to do about an env nobody registered, given the --env_module modules imported. `replaying`: a tool
    that loads an experiment (enjoy, export), whose env a training script may have registered in its own
    process only."""
    where = ("the training script registered it in its own process, probably" if replaying else
             "if it is your own env")
    module = "a module that calls register_env when it is imported" if not env_module else \
        f"the module that calls register_env when it is imported (--env_module={env_module} did not register it)"
    return (f"; {where}: pass --env_module=MODULE, {module}, at its top level, not under "
            f"`if __name__ == \"__main__\":` (for my_script.py in this folder, --env_module=my_script)")


def exit_process(code: int) -> NoReturn:
    """End a command-line process with `code`. The heap is frozen first: the interpreter's last garbage
    collections then skip the objects torch's import made, which otherwise take most of the time a run
    spends exiting (docs/performance.md, "Exiting and starting processes"). For a process that ends here
    only: frozen objects are never collected. atexit handlers still run and files still close."""
    gc.freeze()
    sys.exit(code)
