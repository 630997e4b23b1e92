"""Algorithms as dataflow graphs of model function calls.

A `Node` is one call on one model (or a pure computation): it reads `input_keys` from the batch
dict and writes `output_keys` into it. `build_graph` infers edges from the keys (producer → consumer)
and rejects graphs that cannot run. `sf_core.algo.executor.GraphExecutor` runs a graph on each batch in dependency
order, each node on its device.

Kinds:
- `inference`: a forward pass without gradients (recompute values, a frozen reference policy);
- `compute`:   a function of tensors only (targets, reward shaping);
- `train_step`: changes a model's state: forward + backward + optimizer step on a trainable model (or, as
  `fold_obs_statistics` of --split_actor_critic, the running statistics of its input normalisation).

Parameter versions: nodes run in topological order, every train_step of an iteration comes after the
nodes that feed it, and every other call of its model comes before it (`build_graph` adds those edges),
so each call of a model sees the weights left by its last train_step in the previous iteration. Two
train_steps of one model never run at once (`build_graph` orders them too); train_steps of different models
with no key between them may (`--overlap_graph_nodes`).
"""

from __future__ import annotations

import graphlib
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Callable, Iterable, Iterator

import torch

from sf_core.algo.normalization import Gather

KINDS = ("inference", "compute", "train_step")
NodeFn = Callable[["Context", dict[str, Any]], dict[str, Any]]


class GraphError(ValueError):
    pass


@dataclass(frozen=True)
class Node:
    name: str
    kind: str
    input_keys: tuple[str, ...]
    output_keys: tuple[str, ...]
    fn: NodeFn
    model: str | None = None  # e.g. "actor_critic", "ref_policy", "reward_model"; None for compute
    device: str | None = None  # where it runs and its inputs go; None: its model's device (or the learner's)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise GraphError(f"node {self.name!r}: kind must be one of {KINDS}, got {self.kind!r}")
        if self.kind != "compute" and self.model is None:
            raise GraphError(f"node {self.name!r}: a {self.kind} node must name the model it calls")


@dataclass
class ModelSlot:
    """A model the graph calls: trainable (with optimizer) or frozen (e.g. a reference policy)."""

    module: torch.nn.Module
    optimizer: torch.optim.Optimizer | None = None
    device: str = "cpu"
    offload_device: str | None = None  # a frozen model waits there between iterations (algo/offload.py)
    # the model whose parameters these are a share of ("actor_critic" for the actor and the critic of
    # --split_actor_critic): its weights are saved, published and placed with that model's
    part_of: str | None = None
    # its SGD steps recorded as CUDA graphs, by loss (algo/graphed_sgd.py, --sgd_cuda_graphs)
    sgd_graphs: dict[Any, Any] = field(default_factory=dict)

    @property
    def trainable(self) -> bool:
        return self.optimizer is not None

    @cached_property
    def parameters(self) -> list[torch.nn.Parameter]:
        """The module's parameters, listed once rather than by walking its submodules at every SGD step."""
        return list(self.module.parameters())


@dataclass
class Context:
    """What node functions may use besides the batch: models, hyperparameters, the policy version."""

    models: dict[str, ModelSlot]
    params: Any
    policy_version: int = 0
    on_minibatch: Callable[[], None] = lambda: None
    policy_index: int = 0  # which of --num_policies this learner trains
    extra: dict[str, Any] = field(default_factory=dict)
    # A learner group (--num_learners, sf_core/learning/group/): every rank trains on its share of the
    # batch and all must remain one model. A train_step averages its gradients over the ranks between
    # backward and clipping, and statistics of the data (the normalizers) fold in every rank's share through
    # `gather`. One learner: a no-op, and None.
    average_gradients: Callable[[Iterable[torch.nn.Parameter]], None] = lambda parameters: None
    gather: Gather | None = None
    # Where this call draws random numbers from (a minibatch order): a train_step's own generator, seeded from
    # torch's global one once per dataset in the graph's order, so that train_steps running at once draw what
    # they would one after another. None: torch's global generator.
    generator: torch.Generator | None = None
    # Where a dataset's SGD steps check their gradients are finite (algo/non_finite.py): None: on the device
    # for a CUDA model with the fused Adam, on the host otherwise.
    finite_check_on_device: bool | None = None


class DataflowGraph:
    """Nodes by name (`nodes[name]["node"]`) and producer -> consumer edges (`edges[u, v]["key"]`: a key the
    consumer reads). The standard library's graphlib orders it: networkx took a quarter of a second to import,
    in the trainer's start-up, for a graph of a dozen nodes."""

    def __init__(self):
        self.nodes: dict[str, dict[str, Any]] = {}
        self.edges: dict[tuple[str, str], dict[str, str]] = {}

    def __iter__(self) -> Iterator[str]:
        return iter(self.nodes)

    def __contains__(self, name: object) -> bool:
        return name in self.nodes

    def generations(self) -> list[list[str]]:
        """Nodes in dependency order, in groups whose nodes need nothing from each other; GraphError on a cycle."""
        sorter = graphlib.TopologicalSorter({name: set() for name in self.nodes})
        for u, v in self.edges:
            sorter.add(v, u)
        try:
            sorter.prepare()
        except graphlib.CycleError as exc:
            raise GraphError(f"the graph has a cycle: {' -> '.join(exc.args[1])}") from None
        found = []
        while sorter.is_active():
            ready = sorted(sorter.get_ready())
            sorter.done(*ready)
            found.append(ready)
        return found

    def to_networkx(self):  # scripts/visualize_dfg.py draws with networkx (the dev extra)
        import networkx as nx

        graph = nx.DiGraph()
        for name, attributes in self.nodes.items():
            graph.add_node(name, **attributes)
        for (u, v), attributes in self.edges.items():
            graph.add_edge(u, v, **attributes)
        return graph


def build_graph(nodes: list[Node], inputs: tuple[str, ...] | set[str]) -> DataflowGraph:
    """Dependency graph of `nodes`; `inputs` are the keys the batch provides before any node runs."""
    inputs = set(inputs)
    graph = DataflowGraph()
    producer: dict[str, str] = {}
    for node in nodes:
        if node.name in graph:
            raise GraphError(f"two nodes are named {node.name!r}")
        graph.nodes[node.name] = {"node": node}
        for key in node.output_keys:
            if key in producer:
                raise GraphError(f"key {key!r} is produced by two nodes: {producer[key]!r} and {node.name!r}")
            if key in inputs:
                raise GraphError(f"node {node.name!r} produces {key!r}, which the batch already provides")
            producer[key] = node.name
    for node in nodes:
        for key in node.input_keys:
            if key in producer:
                graph.edges.setdefault((producer[key], node.name), {"key": key})
            elif key not in inputs:
                raise GraphError(f"node {node.name!r} needs key {key!r}, which no node produces and the batch "
                                 f"does not provide (batch keys: {sorted(inputs)})")
    _order_calls_of_each_model(nodes, graph)
    _order_train_steps_of_each_model(nodes, graph)  # a cycle fails here
    return graph


def _order_calls_of_each_model(nodes: list[Node], graph: DataflowGraph) -> None:
    """A model's weights are state the keys do not show: every call of a model that does not train it comes
    before any train_step on it, so it sees the weights of the previous iteration, whatever the nodes' names
    or the executor's overlap."""
    for reader in nodes:
        for trainer in nodes:
            if (reader.model is not None and reader.model == trainer.model and reader.kind != "train_step"
                    and trainer.kind == "train_step"):
                graph.edges.setdefault((reader.name, trainer.name), {"key": f"(the weights of {reader.model})"})


def _order_train_steps_of_each_model(nodes: list[Node], graph: DataflowGraph) -> None:
    """Two train_steps of one model never update it at once: they run in the order of their generations, and
    within one in the order they are listed. Every edge goes from an earlier (generation, position) to a later
    one, so none closes a cycle."""
    generation = {name: index for index, names in enumerate(graph.generations()) for name in names}
    position = {node.name: index for index, node in enumerate(nodes)}
    steps: dict[str, list[str]] = {}
    for node in nodes:
        if node.kind == "train_step":
            steps.setdefault(node.model, []).append(node.name)
    for model, names in steps.items():
        names.sort(key=lambda name: (generation[name], position[name]))
        for first, then in zip(names, names[1:]):
            graph.edges.setdefault((first, then), {"key": f"(the weights of {model})"})
