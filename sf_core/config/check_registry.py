"""The flag checks `Config.validate` runs. A feature checks its own flags: its module registers the check when
imported, so the schema imports no feature. sf_core.cli.arguments.parse_args imports every such module before it
validates."""

from __future__ import annotations

from typing import Any, Callable

_CHECKS: list[Callable[[Any], None]] = []


def register_check(check: Callable[[Any], None]) -> Callable[[Any], None]:
    """Add `check` (it takes the Config and raises ConfigError) to what `Config.validate` runs, after the checks
    registered before it (sf_core/config/checks.py's first). Usable as a decorator. A check registered twice runs
    once."""
    if check not in _CHECKS:
        _CHECKS.append(check)
    return check


def registered_checks() -> list[Callable[[Any], None]]:
    return list(_CHECKS)
