"""Population-based training: the decisions, not the plumbing (the runner forwards them to the learners).

Each policy decides at every multiple of --pbt_period_env_steps of its own env frames. It is replaced when it
has at least --pbt_start_mutation frames, ranks among the worst --pbt_replace_fraction of the population (at
least one policy), every policy's objective is known, and the best objective beats its own by more than
--pbt_replace_reward_gap * (|best| + 1e-6). It then takes the weights and hyperparameters of a policy drawn
from the best fraction; each hyperparameter is mutated with probability --pbt_mutation_rate: multiplied or
divided by a factor in [--pbt_perturb_min, --pbt_perturb_max] (discount-like values bounded by 1 mutate as
1 - x, so they stay in (0, 1)). A policy just replaced skips its next decision, so that it is judged on a window
of episodes played with the weights it took. Every replacement is logged and appended to pbt.jsonl.
"""

from __future__ import annotations

import json
import logging
import math
import random
import time
from dataclasses import dataclass
from typing import Any, Sequence

from sf_core.config import NUMERIC_LEARNING_FLAGS, Config, ConfigError, register_check

log = logging.getLogger("sf_core")

# Hyperparameters in [0, 1] whose effect scales with 1 - x (an horizon): 0.99 -> 0.995 doubles it, whereas
# multiplying x itself would step past 1 within a mutation or two.
BOUNDED_BY_ONE = frozenset({"gamma", "gae_lambda", "adam_beta1", "adam_beta2"})
BOUND_MARGIN = 1e-6  # how close to 0 or 1 a mutated bounded value may get
GAP_EPS = 1e-6  # keeps the relative gap meaningful when the best objective is 0
STATE_VERSION = 1


@register_check
def check_pbt_flags(cfg: Config) -> None:
    """--with_pbt: the population and the mutation flags can work."""
    if not cfg.with_pbt:
        return
    if cfg.num_policies < 2:
        raise ConfigError(f"--with_pbt needs a population: --num_policies must be at least 2, got {cfg.num_policies}")
    if not 0.0 < cfg.pbt_replace_fraction <= 0.5:
        raise ConfigError(f"--pbt_replace_fraction must be in (0, 0.5], got {cfg.pbt_replace_fraction}")
    if not 0.0 <= cfg.pbt_mutation_rate <= 1.0:
        raise ConfigError(f"--pbt_mutation_rate must be in [0, 1], got {cfg.pbt_mutation_rate}")
    if not 1.0 <= cfg.pbt_perturb_min <= cfg.pbt_perturb_max:
        raise ConfigError(f"--pbt_perturb_min/max must satisfy 1 <= min <= max, got "
                          f"{cfg.pbt_perturb_min}, {cfg.pbt_perturb_max}")
    if cfg.pbt_period_env_steps < 1:
        raise ConfigError(f"--pbt_period_env_steps must be at least 1, got {cfg.pbt_period_env_steps}")
    numeric = NUMERIC_LEARNING_FLAGS
    unknown = [name for name in cfg.pbt_hyperparams if name not in numeric]
    if unknown:
        raise ConfigError(f"--pbt_hyperparams: {', '.join(unknown)} cannot be mutated; choose among the numeric "
                          f"learning flags: {', '.join(sorted(numeric))}")


@dataclass(frozen=True)
class Replacement:
    policy: int  # the policy replaced
    source: int  # the policy whose weights (and hyperparameters) it takes
    hyperparams: dict[str, float]  # policy's new values (the source's, mutated)


def replace_count(num_policies: int, fraction: float) -> int:
    """How many policies count as worst (and as best): the fraction rounded up, at least one, and at most half
    so that the two groups never share a policy (a source is always a different, better policy)."""
    rounded_up = math.ceil(fraction * num_policies - 1e-9)  # 0.3 * 10 is 3.0000000000000004, not 4
    return max(1, min(rounded_up, num_policies // 2))


def _known(objective: float | None) -> bool:
    return objective is not None and math.isfinite(objective)


class PopulationBasedTraining:
    """Owned by the runner: `update` it often with each policy's frames and objective, forward the
    `Replacement`s it returns, and checkpoint `state_dict()`."""

    def __init__(self, cfg: Config, seed: int, log_path: str | None, state: dict | None = None) -> None:
        self.cfg = cfg
        self.names: list[str] = list(cfg.pbt_hyperparams)
        self.log_path = log_path
        self.rng = random.Random(seed)
        n = cfg.num_policies
        self.hyperparams: list[dict[str, float]] = [self._start_values(k) for k in range(n)]
        # the first multiple of the period each policy has not decided at yet
        self.next_update: list[int] = [cfg.pbt_period_env_steps] * n
        self.replaced: list[int] = [0] * n  # per policy, for TensorBoard
        self.events = 0
        if state is not None:
            self._load(state)

    def _start_values(self, policy: int) -> dict[str, float]:
        start = self.cfg.policy_config(policy)  # the flags with --policy_hyperparams applied
        return {name: float(getattr(start, name)) for name in self.names}

    # ------------------------------------------------------------------------------------------------
    def update(self, frames: Sequence[int], objectives: Sequence[float | None]) -> list[Replacement]:
        """Decide for every policy whose frames reached its next update point; the replacements made.
        frames[k]: env frames of policy k so far; objectives[k]: its objective, higher is better (None or NaN:
        not known yet)."""
        n = self.cfg.num_policies
        if len(frames) != n or len(objectives) != n:
            raise ValueError(f"PBT needs one frame count and one objective per policy ({n}), got "
                             f"{len(frames)} and {len(objectives)}")
        period = self.cfg.pbt_period_env_steps
        made = []
        for k in range(n):
            if frames[k] < self.next_update[k]:
                continue
            # a policy that jumped several periods since the last call decides once, not once per period
            self.next_update[k] = (int(frames[k]) // period + 1) * period
            replacement = self._decide(k, frames, objectives)
            if replacement is not None:
                made.append(replacement)
        return made

    def _decide(self, policy: int, frames: Sequence[int], objectives: Sequence[float | None]) -> Replacement | None:
        if frames[policy] < self.cfg.pbt_start_mutation:
            return None  # too early to judge its hyperparameters
        if not all(_known(o) for o in objectives):
            return None  # a ranking with unknowns could replace a good policy that has not finished an episode
        known = [float(o) for o in objectives]  # type: ignore[arg-type]
        count = replace_count(len(known), self.cfg.pbt_replace_fraction)
        ranked = sorted(range(len(known)), key=lambda k: known[k])  # worst first; ties keep the lower index first
        worst, best = ranked[:count], ranked[-count:]
        if policy not in worst:
            return None
        top = known[ranked[-1]]
        if not top - known[policy] > self.cfg.pbt_replace_reward_gap * (abs(top) + GAP_EPS):
            return None  # too close to the best to be worth losing what it has learned
        source = self.rng.choice(best)
        new, mutated = self._mutate(self.hyperparams[source])
        replacement = Replacement(policy=policy, source=source, hyperparams=new)
        self._record(replacement, int(frames[policy]), known, mutated)
        # judged next on a window it played with its new weights: the next period's would still hold episodes
        # begun with the weights it lost
        self.next_update[policy] += self.cfg.pbt_period_env_steps
        return replacement

    # ------------------------------------------------------------------------------------------------
    def _mutate(self, values: dict[str, float]) -> tuple[dict[str, float], list[str]]:
        """A copy of `values`, each mutated with probability --pbt_mutation_rate; and the names mutated."""
        new = dict(values)
        mutated = []
        for name in self.names:  # a fixed order: the same seed draws the same numbers
            if self.rng.random() < self.cfg.pbt_mutation_rate:
                new[name] = self._perturb(name, values[name])
                mutated.append(name)
        return new, mutated

    def _perturb(self, name: str, value: float) -> float:
        factor = self.rng.uniform(self.cfg.pbt_perturb_min, self.cfg.pbt_perturb_max)
        if self.rng.random() < 0.5:
            factor = 1.0 / factor
        if name in BOUNDED_BY_ONE:
            # 1.0 itself has no horizon to scale; the margin makes it mutate to just below 1
            return min(max(1.0 - (1.0 - value) * factor, BOUND_MARGIN), 1.0 - BOUND_MARGIN)
        return value * factor

    def _record(self, r: Replacement, frames: int, objectives: list[float], mutated: list[str]) -> None:
        old = self.hyperparams[r.policy]
        self.hyperparams[r.policy] = dict(r.hyperparams)
        self.replaced[r.policy] += 1
        self.events += 1
        log.info("PBT: policy %d (objective %.6g at %d frames) replaced by policy %d (objective %.6g): %s",
                 r.policy, objectives[r.policy], frames, r.source, objectives[r.source],
                 self._describe(r, mutated))
        if self.log_path is None:
            return
        event = {"time": time.time(), "event": self.events, "frames": frames, "policy": r.policy, "source": r.source,
                 "objectives": objectives, "old_hyperparams": old, "new_hyperparams": r.hyperparams,
                 "source_hyperparams": self.hyperparams[r.source], "mutated": mutated}
        # one line per event, on disk before the learners act on it: a crash loses nothing already decided
        with open(self.log_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(event) + "\n")
            f.flush()

    def _describe(self, r: Replacement, mutated: list[str]) -> str:
        """The new values, the mutated ones with the source's value they came from."""
        parts = []
        for name in self.names:
            was = f" (mutated from {self.hyperparams[r.source][name]:.6g})" if name in mutated else ""
            parts.append(f"{name}={r.hyperparams[name]:.6g}{was}")
        return ", ".join(parts) or "no hyperparameters"

    # ------------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Plain lists, dicts, ints and floats (a checkpoint loads with torch.load(weights_only=True))."""
        version, internal, gauss = self.rng.getstate()
        return {"version": STATE_VERSION, "hyperparams": [dict(h) for h in self.hyperparams],
                "next_update": list(self.next_update), "replaced": list(self.replaced), "events": self.events,
                "rng": [version, list(internal), gauss]}

    def _load(self, state: dict[str, Any]) -> None:
        n = self.cfg.num_policies
        if len(state["hyperparams"]) != n:
            raise ValueError(f"the PBT state is for {len(state['hyperparams'])} policies, --num_policies={n}")
        # names added to --pbt_hyperparams since the state was saved start from the flags; dropped ones are dropped
        self.hyperparams = [{name: float(saved.get(name, start[name])) for name in self.names}
                            for saved, start in zip(state["hyperparams"], self.hyperparams)]
        self.next_update = [int(x) for x in state["next_update"]]
        self.replaced = [int(x) for x in state["replaced"]]
        self.events = int(state["events"])
        version, internal, gauss = state["rng"]
        self.rng.setstate((int(version), tuple(int(x) for x in internal), gauss))

    def scalars(self) -> dict[str, float]:
        """TensorBoard values: each policy's current hyperparameters and how often it was replaced."""
        found: dict[str, float] = {}
        for k, values in enumerate(self.hyperparams):
            found.update({f"policy_{k}/pbt/{name}": value for name, value in values.items()})
            found[f"policy_{k}/pbt/replaced"] = float(self.replaced[k])
        return found
