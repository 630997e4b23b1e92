"""--policy_hyperparams: per-policy values of the numeric learning flags, as `K:name=value[,name=value...]`."""

from __future__ import annotations

from typing import Sequence

from sf_core.config.errors import ConfigError


def parse_policy_hyperparams(entries: Sequence[str], num_policies: int,
                             numeric: Sequence[str]) -> dict[int, dict[str, float]]:
    """policy -> {flag: value}; a ConfigError names the entry that cannot work."""
    found: dict[int, dict[str, float]] = {}
    for entry in entries:
        policy, _, assignments = entry.partition(":")
        try:
            k = int(policy)
            pairs = [a.split("=", 1) for a in assignments.split(",")]
            values = {name.strip(): float(value) for name, value in pairs}
        except ValueError:
            raise ConfigError(f"--policy_hyperparams: {entry!r} is not K:name=value[,name=value...]") from None
        if not 0 <= k < num_policies:
            raise ConfigError(f"--policy_hyperparams: policy {k} does not exist (--num_policies={num_policies})")
        unknown = sorted(set(values) - set(numeric))
        if unknown:
            raise ConfigError(f"--policy_hyperparams: {', '.join(unknown)} is not a numeric learning flag; "
                              f"choose among {', '.join(sorted(numeric))}")
        found.setdefault(k, {}).update(values)
    return found
