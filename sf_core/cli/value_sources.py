"""Where each flag's value comes from: Config's default (Sample Factory's); under the flags typed, the env's
preset (sf_core/run/presets.py) or, for an env without one, defaults fitted to its spaces (sf_core/run/env_fit.py);
the flags typed. `parse_args` fits the machine's flags after these; `--help` shows them all."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from typing import Any, Sequence

from sf_core.cli import import_user_modules
from sf_core.cli.parser import explicit_flags
from sf_core.config import Config
from sf_core.envs.vector_backends import planned_backend
from sf_core.run.env_fit import EnvFit, fit_to_spaces, probe_spaces
from sf_core.run.presets import VECTOR_PRESETS, PresetMatch, preset_for
from sf_core.service.endpoints import envs_served


def as_typed(name: str, value: Any) -> str:
    """A flag and its value as they are typed: `--learning_rate=0.001`, `--encoder_mlp_layers 64 64`."""
    if isinstance(value, (list, tuple)):
        return " ".join([f"--{name}", *map(str, value)])
    return f"--{name}={value}"


@dataclass
class Layered:
    """A command line's flag values before the machine fit, and where each came from: Config's default; under
    the flags typed, the env's preset or else defaults fitted to its spaces; the flags typed."""

    values: dict[str, Any]
    typed: set[str]
    preset: PresetMatch
    fit: EnvFit | None

    @property
    def under(self) -> dict[str, Any]:
        """The values applied under the typed flags (those typed too included)."""
        return self.preset.values or (self.fit.values if self.fit else {})

    def underneath(self, name: str) -> str | None:
        """Where flag `name`'s value under the typed flags comes from (the preset, or the fit to the env's
        spaces); None for Config's default."""
        if name in self.preset.values:
            vector = " for vector envs" if name in VECTOR_PRESETS.get(self.preset.key or "", {}) and \
                self.preset.vectorized else ""
            return f"from the {self.preset.key} preset{vector}"
        return "fitted to the env's spaces" if name in self.under else None

    def fitted(self) -> list[str]:
        """The flags set to values fitted to the env's spaces."""
        return [name for name in self.fit.values if name not in self.typed] if self.fit else []

    def apply(self) -> None:
        """Set the values applied under the typed flags."""
        for key, value in self.under.items():
            if key not in self.typed:
                self.values[key] = value

    def lines(self) -> list[str]:
        """The console's lines about the values applied under the user's flags."""
        lines = [line] if (line := self.preset.describe(self.values["env"])) else []
        if self.fitted():
            flags = " ".join(as_typed(name, self.values[name]) for name in self.fitted())
            lines.append(f"applied defaults fitted to the env's spaces ({self.fit.spaces}): {flags} (flags you "
                         f"pass override them; --fit_defaults_to_env=False keeps Sample Factory's defaults)")
        return lines


def layered_values(parser: argparse.ArgumentParser, argv: Sequence[str]) -> Layered:
    """The flags' values of `argv` with the env's preset, or defaults fitted to its spaces, under those typed."""
    args = parser.parse_args(list(argv))
    import_user_modules(args.env_module)  # before anything looks the env up
    typed = explicit_flags(parser, argv)
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(Config) if f.metadata.get("cli", True)}
    match = preset_for(values["env"], values["algo"])
    fit = None
    # an env a preset points to is left to it; served envs live elsewhere (sf_core/run/env_fit.py)
    if match.how == "none" and values["fit_defaults_to_env"] and values["env"] and not envs_served(values):
        spaces = probe_spaces(values)
        fit = fit_to_spaces(*spaces) if spaces else None
    layered = Layered(values, typed, match, fit)
    layered.apply()
    if match.values and planned_backend(values) is not None:  # the preset's values for vector envs, over it
        layered.preset = preset_for(values["env"], values["algo"], vectorized=True)
        layered.apply()
    return layered
