"""The scores the field publishes, as scripts/reproduce.py compares with them: published_scores.json (beside
this file) read into `Reference`s, the suites of envs, and where a learning curve first reaches a score."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "published_scores.json")
# which of our figures a published one is compared with (published_scores.json, "metrics")
OURS_FOR_METRIC = {"final_training_return": "final_return", "final_agent_evaluation": "eval",
                   "solved_threshold": "final_return"}


@dataclass(frozen=True)
class Reference:
    """One peer's published score for one of our envs."""

    env: str
    source: str  # its key in published_scores.json
    label: str
    their_env: str
    mean: float
    std: float | None
    metric: str
    budget_frames: int | None
    seeds: int | None
    url: str
    citation: str
    env_note: str

    @property
    def ours(self) -> str:
        """The figure of ours it is compared with: "eval" or "final_return"."""
        return OURS_FOR_METRIC[self.metric]

    def score_text(self) -> str:
        """"1442.64 ± 46.03", or the mean alone where no spread was published."""
        return f"{self.mean:g}" + (f" ± {self.std:g}" if self.std is not None else "")

    def as_dict(self) -> dict:
        return dict(self.__dict__)


class UsageError(ValueError):
    """A command line that cannot be run: one line for the user, exit status 2."""


class PublishedScores:
    """The references per env and the suites, as published_scores.json holds them."""

    def __init__(self, data: dict, path: str = PATH):
        self.path, self.data = path, data
        self.suites: dict[str, list[str]] = {name: list(s["envs"]) for name, s in data["suites"].items()}
        self.also: dict[str, list[str]] = {name: list(s.get("also", ())) for name, s in data["suites"].items()}

    def references(self, env: str) -> list[Reference]:
        """The env's references in the file's order, each with its source's metric, budget and seeds
        unless the entry gives its own."""
        found = []
        for entry in self.data["envs"].get(env, ()):
            source = self.data["sources"][entry["source"]]
            merged = {**source, **entry}
            found.append(Reference(
                env=env, source=entry["source"], label=merged["label"], their_env=merged["their_env"],
                mean=float(merged["mean"]), std=None if merged.get("std") is None else float(merged["std"]),
                metric=merged["metric"], budget_frames=merged.get("budget_frames"), seeds=merged.get("seeds"),
                url=merged["url"], citation=source["source"], env_note=merged.get("env_note", "")))
        return found

    def suite_of(self, env: str) -> str | None:
        return next((name for name in self.suites if env in self.suites[name] + self.also[name]), None)

    def select(self, suites: list[str], envs: list[str]) -> list[tuple[str, str]]:
        """(suite, env) to run: every env of `suites`, or the named `envs` (each in one of `suites` when
        suites are given too). UsageError names what is unknown and what is known."""
        for suite in suites:
            if suite not in self.suites:
                raise UsageError(f"unknown suite {suite!r}; suites: {', '.join(self.suites)}")
        if not envs:
            if not suites:
                raise UsageError("name a suite (--suite=classic) or envs (--envs=CartPole-v1)")
            return [(suite, env) for suite in suites for env in self.suites[suite]]
        chosen = []
        for env in envs:
            suite = self.suite_of(env)
            if suite is None or (suites and suite not in suites):
                where = suites or list(self.suites)
                known = [e for s in where for e in self.suites[s] + self.also[s]]
                within = f" in suite {', '.join(suites)}" if suites else ""
                raise UsageError(f"unknown env {env!r}{within}; envs: {', '.join(known)}")
            chosen.append((suite, env))
        return chosen


def load(path: str = PATH) -> PublishedScores:
    with open(path, encoding="utf-8") as f:
        return PublishedScores(json.load(f), path)


def first_reaching(frames: list[int], seconds: list[float], values: list[float], score: float
                   ) -> tuple[float, int] | None:
    """(seconds, frames) of the first point of the curve at or above `score`; None if it never gets there."""
    for f, s, v in zip(frames, seconds, values):
        if v >= score:
            return s, f
    return None
