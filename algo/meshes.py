"""A group of learner ranks per model: `--model_ranks`, e.g. critic=0,1; actor=2,3 with --num_learners=4.

Each named model trains data-parallel on its own ranks only, with a torch.distributed subgroup of its own for
its gradient all-reduce and its statistics (sf_core/learning/group/link.py builds the subgroups). A rank that
does not hold a model builds no optimizer for it, skips its train_steps and keeps no trainable copy; every
rank keeps the actor-critic's shared state (the observation normalisation, folded on every rank).

Data: in a meshed group every rank reads the whole dataset. The graph's compute nodes run on all of it on every
rank (they are cheap and deterministic), and each train_step takes its model's share: rank r, the k-th of its
model's n ranks, trains on the k-th contiguous 1/n of the trajectories in minibatches of --batch_size / n, so
each model's ranks together take the SGD steps one learner with the whole batch would.

Checked twice: the flags alone (`check_model_ranks_flags`, with every other flag check), and against the
algorithm's graph in the runner before any process starts (`check_model_ranks`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import torch

from sf_core.algo.graph import Context, Node
from sf_core.config import Config, ConfigError, register_check

WHOLE = "actor_critic"  # trained by every rank: its shared state (the observation normalisation) is everyone's
FLAG = "--model_ranks"


def parse_ranks(text: str) -> dict[str, tuple[int, ...]]:
    """'critic=0,1; actor=2-3' -> {'critic': (0, 1), 'actor': (2, 3)}: NAME=RANKS pairs split by ';', ranks by
    ',' with A-B for a range."""
    found: dict[str, tuple[int, ...]] = {}
    for pair in filter(None, (part.strip() for part in text.split(";"))):
        name, sep, ranks = (s.strip() for s in pair.partition("="))
        if not sep or not name:
            raise ConfigError(f"{FLAG}: {pair!r} is not NAME=RANKS (e.g. critic=0,1; actor=2,3)")
        if name in found:
            raise ConfigError(f"{FLAG}: {name!r} is named twice")
        found[name] = _rank_list(name, ranks)
    return found


def _rank_list(name: str, text: str) -> tuple[int, ...]:
    ranks: list[int] = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        first, dash, last = item.partition("-")
        try:
            span = range(int(first), int(last) + 1) if dash else range(int(first), int(first) + 1)
        except ValueError:
            raise ConfigError(f"{FLAG}: {name}={text}: {item!r} is not a rank (N) or a range of ranks (A-B)") from None
        ranks += span
    if not ranks:
        raise ConfigError(f"{FLAG}: model {name!r} has no rank (give it at least one: {name}=0)")
    if len(set(ranks)) != len(ranks):
        raise ConfigError(f"{FLAG}: {name}={text} names a rank twice")
    return tuple(sorted(ranks))


@register_check
def check_model_ranks_flags(cfg: Config) -> None:
    """What --model_ranks needs of the other flags: ranks that exist, each holding a model, groups that can
    share the dataset evenly, and the weights published once per dataset."""
    if not cfg.model_ranks:
        return
    ranks = parse_ranks(cfg.model_ranks)
    n = cfg.num_learners
    if n == 1:
        raise ConfigError(f"{FLAG} places models on the ranks of a learner group: it needs --num_learners > 1")
    for name, held in ranks.items():
        outside = [r for r in held if not 0 <= r < n]
        if outside:
            raise ConfigError(f"{FLAG}: {name} is given rank {outside[0]}, out of range: --num_learners={n} has "
                              f"ranks 0..{n - 1}")
    idle = sorted(set(range(n)) - {r for held in ranks.values() for r in held})
    if idle:
        raise ConfigError(f"{FLAG}: rank {idle[0]} holds no model (each of the --num_learners={n} ranks must "
                          f"hold at least one)")
    if cfg.ray_address:
        raise ConfigError(f"{FLAG} runs the ranks on one machine, where each reads the whole dataset in shared "
                          f"memory; not with --ray_address")
    if cfg.publish_every_sgd_step:
        raise ConfigError(f"{FLAG} hands a model's weights to rank 0 once per dataset; not with "
                          f"--publish_every_sgd_step=True")
    trajectories = cfg.dataset_size() // cfg.rollout
    for name, held in ranks.items():
        k = len(held)
        if trajectories % k or cfg.batch_size % k:
            raise ConfigError(f"{FLAG}: {name}'s {k} ranks must divide the dataset's {trajectories} trajectories "
                              f"and --batch_size={cfg.batch_size}: each of its ranks trains on an equal share")


def check_model_ranks(cfg: Config, nodes: list[Node]) -> None:
    """The names against the algorithm's graph: each a model it trains, every model it trains but the
    actor-critic named, and a named model called by its own train_steps only (a rank without it runs the rest)."""
    if not cfg.model_ranks:
        return
    ranks = parse_ranks(cfg.model_ranks)
    trained = sorted({node.model for node in nodes if node.kind == "train_step"} - {WHOLE})
    hint = (f"its models besides {WHOLE}: {', '.join(trained)}" if trained else
            f"it trains no model besides {WHOLE} (--split_actor_critic=True makes the actor and the critic two)")
    for name in ranks:
        if name == WHOLE:
            raise ConfigError(f"{FLAG}: {WHOLE} is trained on every rank (its observation normalisation is shared "
                              f"by the models); place the models it is split into ({hint})")
        if name not in trained:
            raise ConfigError(f"{FLAG}: --algo={cfg.algo} trains no model {name!r} ({hint})")
    for name in trained:
        if name not in ranks:
            raise ConfigError(f"{FLAG}: model {name!r} has no rank: name every model --algo={cfg.algo} trains "
                              f"({hint})")
    readers = {key: node.name for node in nodes for key in node.input_keys}
    for node in nodes:
        if node.model == WHOLE and node.kind != "train_step":
            raise ConfigError(f"{FLAG}: node {node.name!r} calls the whole {WHOLE}, whose parts train on "
                              f"different ranks (--with_vtrace and --recompute_values recompute with it)")
        if node.model in ranks and node.kind != "train_step":
            raise ConfigError(f"{FLAG}: node {node.name!r} calls {node.model} without training it, which the ranks "
                              f"not holding {node.model} could not do")
        used = [key for key in node.output_keys if key in readers] if node.model in ranks else []
        if used:
            raise ConfigError(f"{FLAG}: node {readers[used[0]]!r} reads {used[0]!r} from {node.name!r}, which "
                              f"runs only on {node.model}'s ranks")


@dataclass(frozen=True)
class ModelHooks:
    """A model's collectives on this rank, within the model's own ranks."""

    average_gradients: Callable[[Iterable[torch.nn.Parameter]], None]
    gather: Callable[[torch.Tensor], list[torch.Tensor]]


@dataclass
class RankMesh:
    """One rank's view of the placement: which models it holds and, for each train_step, the share of the
    dataset it trains on and the collectives it uses."""

    rank: int
    size: int
    ranks: dict[str, tuple[int, ...]]  # meshed model -> its ranks; any other model: every rank
    batch_size: int  # --batch_size: a model's n ranks take minibatches of batch_size / n each
    hooks: dict[str, ModelHooks] = field(default_factory=dict)  # per model held here; WHOLE: the world's

    def group(self, model: str | None) -> tuple[int, ...]:
        return self.ranks.get(model or WHOLE, tuple(range(self.size)))

    def holds(self, model: str | None) -> bool:
        return self.rank in self.group(model)

    def prepare(self, node: Node, context: Context, inputs: dict[str, Any]) -> tuple[Context, dict[str, Any]]:
        """A train_step's context (its model's collectives and minibatch size) and its share of the inputs:
        [T, N, ...] tensors cut along the trajectories (dim 1)."""
        group = self.group(node.model)
        k, n = group.index(self.rank), len(group)
        hooks = self.hooks[node.model if node.model in self.ranks else WHOLE]
        params = dataclasses.replace(context.params, batch_size=self.batch_size // n)
        context = dataclasses.replace(context, params=params, average_gradients=hooks.average_gradients,
                                      gather=hooks.gather)
        return context, {key: _share(value, k, n) for key, value in inputs.items()}


def _share(value: Any, k: int, n: int) -> Any:
    if not isinstance(value, torch.Tensor) or value.dim() < 2:
        return value
    columns = value.shape[1] // n
    return value[:, k * columns:(k + 1) * columns]
