"""The algorithms `--algo` picks from: the built-in ones, and those registered with `register_algorithm`."""

from __future__ import annotations

from typing import Callable

from sf_core.algo.algorithms import Algorithm, appo, ppo, reinforce
from sf_core.algo.params import LearningParams
from sf_core.algo.rnd import appo_rnd
from sf_core.algo.split_actor_critic import split_actor_critic
from sf_core.algo.teacher import appo_teacher
from sf_core.common.user_code import user_code
from sf_core.config import Config, ConfigError, register_check

AlgorithmBuilder = Callable[[LearningParams], Algorithm]
_ALGORITHMS: dict[str, AlgorithmBuilder] = {"APPO": appo, "PPO": ppo, "REINFORCE": reinforce,
                                            "APPO_TEACHER": appo_teacher, "APPO_RND": appo_rnd}


def register_algorithm(name: str, builder: AlgorithmBuilder) -> None:
    """Make `--algo=name` build its graph with `builder(params)`, in the learner's process (any callable:
    a lambda or a notebook's function travels there by value)."""
    _ALGORITHMS[name] = user_code(builder, f"the algorithm registered as {name!r}")


def build_algorithm(builder: AlgorithmBuilder, params: LearningParams) -> Algorithm:
    """The algorithm's graph, with the actor and the critic as two models if --split_actor_critic."""
    algorithm = builder(params)
    return split_actor_critic(algorithm) if params.split_actor_critic else algorithm


def algorithm_builder(name: str) -> AlgorithmBuilder:
    if name not in _ALGORITHMS:
        raise ValueError(unknown_algorithm(name))
    return _ALGORITHMS[name]


def known_algorithms() -> list[str]:
    return sorted(_ALGORITHMS)


def unknown_algorithm(name: str) -> str:
    """The message for an --algo nobody registered; RL-Zoo's lower-case names (`--algo ppo`) are told the case."""
    case = f" (names are upper case here: --algo={name.upper()})" if name.upper() in _ALGORITHMS else ""
    return (f"unknown --algo={name!r}{case}; known: {', '.join(known_algorithms())} "
            f"(register others with sf_core.algo.registry.register_algorithm)")


@register_check
def check_algo(cfg: Config) -> None:
    if cfg.algo not in _ALGORITHMS:
        raise ConfigError(unknown_algorithm(cfg.algo))
