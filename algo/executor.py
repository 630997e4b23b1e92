"""Runs an algorithm's graph (algo/graph.py) on each dataset: nodes in dependency order, each on its device.

Placement. A node runs on its own `device` if it names one, else on its model's (`ModelSlot.device`), else on
the learner's (`home`). Its inputs are moved there as it reads them (one copy per key and device, shared by
every node on that device), and its outputs stay where they were made until a consumer elsewhere reads them.

Overlap (`overlap=True`, the `--overlap_graph_nodes` flag). The nodes of one generation need nothing from
each other and run at once, each on a thread (torch releases the GIL inside its kernels, so on a CPU they take
a core each, and the process's intra-op threads are shared out among them) and, on a GPU, each on a CUDA
stream of its own. A node's stream first waits for the work queued before the generation (its inputs), and
the stream the next generation runs on waits for each node's stream, so consumers never read an output early.
The generation's train_steps are among them unless `overlap_train_steps=False` (a learner group whose models
share one process group, so its ranks must issue their collectives in one order), when they follow one by one;
with a group per model (`--model_ranks`) each step's collectives are on its own group, and they overlap. Every train_step draws its random
numbers from a generator of its own (`Context.generator`), seeded from torch's global one in the graph's
order, and every node computes what it would alone: the results are those of sequential execution.

Meshes (`mesh`, the `--model_ranks` flag, algo/meshes.py). A train_step of a model this rank does not hold is
skipped; the others run on their model's share of the batch, with their model's collectives.

Release (`release_after`). The nodes after which the weights inference acts with are final for the dataset (the
actor's train_step of --split_actor_critic when the learner computes the values): `run`'s `release` is called as
soon as they are done, before the nodes left run (the critic's training), so the learner can publish the weights
and hand the dataset's slots back while the rest trains. Those nodes read copies of the batch's host tensors,
whose memory the sampler fills again once released (on a GPU the batch is the learner's copy already). With
overlap, the release generation's other train_steps start with the release nodes and may still be training at
the release: `release` then gets the state their models had before (`Held`), for the learner to publish in
place of the half-updated one, so what inference loads is the state a release before them would have given.

Offload. A frozen model with an `offload_device` waits there between iterations (algo/offload.py): its copy to
the device starts one generation before its first call, across datasets, and is dropped after its last call;
`take_transfer_seconds` tells the learner how long the copies took and how much of that the calls waited for.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import torch

from sf_core.algo.graph import Context, DataflowGraph, GraphError, Node
from sf_core.algo.meshes import RankMesh
from sf_core.algo.offload import OffloadedModel, OffloadSchedule

# by the model that is published (a part's whole model: "actor_critic" for the critic of --split_actor_critic),
# the state_dict entries that the train_steps still running at the release may change, as they were before
Held = dict[str, dict[str, torch.Tensor]]
Release = Callable[[Held], None]


@functools.cache
def per_thread_intra_op_threads() -> bool:
    """Whether torch.set_num_threads on one thread leaves the others' counts alone. With ATen's OpenMP backend
    (torch's builds for Linux and Windows) it does: OpenMP and MKL keep the count per thread. With another
    backend the count is the process's, and each node keeps it."""
    return "parallel backend: OpenMP" in torch.__config__.parallel_info()


def train_steps_at_once(graph: DataflowGraph) -> list[list[str]]:
    """The groups of train_steps that --overlap_graph_nodes runs at once: those of one generation."""
    found = [[name for name in generation if graph.nodes[name]["node"].kind == "train_step"]
             for generation in graph.generations()]
    return [names for names in found if len(names) > 1]


class GraphExecutor:
    def __init__(self, graph: DataflowGraph, context: Context, overlap: bool = False,
                 home: str | torch.device = "cpu", overlap_train_steps: bool = True, mesh: RankMesh | None = None,
                 release_after: tuple[str, ...] = ()):
        self.graph, self.context, self.home, self.mesh = graph, context, torch.device(home), mesh
        self.overlap_train_steps = overlap and overlap_train_steps
        self.generations = graph.generations()
        self.release_after, self.late = set(release_after), self._after_release(release_after)
        # the generation the last release node is in: the nodes left run from there on with copies of the batch
        self.release_generation = max((i for i, g in enumerate(self.generations) if self.release_after & set(g)),
                                      default=-1)
        widest = max((len(g) for g in self.generations), default=1)
        self.pool = ThreadPoolExecutor(max_workers=widest, thread_name_prefix="graph") if overlap else None
        self.streams: dict[str, Any] = {}  # node name -> its CUDA stream, when nodes overlap on a GPU
        self.generators: dict[str, torch.Generator] = {}  # train_step name -> its generator
        offloaded: dict[str, OffloadedModel] = {}
        for name, slot in (context.models.items() if context is not None else ()):
            if slot.offload_device is not None:
                if slot.trainable:
                    raise GraphError(f"model {name!r} is trained: only a frozen model can be offloaded")
                offloaded[name] = OffloadedModel(slot.module, slot.device, slot.offload_device)
        first, last = {}, {}  # per offloaded model: the generation of its first call and of its last
        for index, generation in enumerate(self.generations):
            for name in generation:
                model = graph.nodes[name]["node"].model
                if model in offloaded:
                    first.setdefault(model, index)
                    last[model] = index
        self.offloaded = {name: model for name, model in offloaded.items() if name in first}
        self.offload = OffloadSchedule(self.offloaded, first, last, len(self.generations))

    def device_of(self, node: Node) -> torch.device:
        if node.device is not None:
            return torch.device(node.device)
        slot = self.context.models.get(node.model) if node.model else None
        return torch.device(slot.device) if slot is not None else self.home

    def _after_release(self, release_after: tuple[str, ...]) -> set[str]:
        """The nodes that may run once the release nodes are done: neither one of them nor needed by them."""
        unknown = [name for name in release_after if name not in self.graph]
        if unknown:
            raise GraphError(f"release_after names {unknown[0]!r}, which is not a node of the graph")
        needed, todo = set(), list(release_after)
        while todo:
            name = todo.pop()
            for u, v in self.graph.edges:
                if v == name and u not in needed:
                    needed.add(u)
                    todo.append(u)
        return set(self.graph.nodes) - needed - set(release_after) if release_after else set()

    def run(self, batch: dict[str, Any], release: Release | None = None) -> dict[str, Any]:
        """The graph on `batch`; `release`: called once the `release_after` nodes are done (not called without
        any)."""
        data, placed = dict(batch), {}
        self._seed_train_steps()
        for index, generation in enumerate(self.generations):
            self.offload.before(index)
            nodes, then = [self.graph.nodes[name]["node"] for name in generation], None
            if release is not None and index == self.release_generation:
                nodes, then = self._split_at_release(nodes, batch, data, placed, release)
            for out in self._run_generation(nodes, data, placed, then):
                data.update(out)
            self.offload.after(index)
        return data

    def _split_at_release(self, nodes: list[Node], batch: dict[str, Any], data: dict[str, Any], placed: dict,
                          release: Release) -> tuple[list[Node], tuple[int, Callable[[], None]] | None]:
        """The release generation: its release nodes run, then `release`, and the nodes to run after that are
        returned. With overlap they all run at once: the nodes returned are the release nodes first, and with
        them how many those are and the call to make when they are done."""
        self._copy_batch_for_late_nodes(batch, data)
        early = [node for node in nodes if node.name in self.release_after]
        late = [node for node in nodes if node.name not in self.release_after]
        if self.overlap_train_steps and self.pool is not None and late:
            return early + late, (len(early), functools.partial(release, self._state_before(late, early)))
        for out in self._run_generation(early, data, placed):
            data.update(out)
        release({})
        return late, None

    def _state_before(self, late: list[Node], early: list[Node]) -> Held:
        """What `release` publishes in place of the state the `late` train_steps are changing (`Held`)."""
        models = self.context.models

        def tensors(nodes: list[Node]) -> set[int]:
            return {t.data_ptr() for node in nodes if node.kind == "train_step" and node.model
                    for t in models[node.model].module.state_dict().values()}

        changing, held = tensors(late) - tensors(early), {}
        for node in late:
            if node.kind == "train_step" and node.model:
                whole = models[node.model].part_of or node.model
                state = models[whole].module.state_dict()
                held.setdefault(whole, {}).update({name: t.detach().clone() for name, t in state.items()
                                                   if t.data_ptr() in changing})
        return held

    def _copy_batch_for_late_nodes(self, batch: dict[str, Any], data: dict[str, Any]) -> None:
        """The batch's tensors the nodes left will read, as copies of their own: the batch's memory is handed back
        at the release. Only host memory is: on another device the batch is already the learner's own copy."""
        storages = {t.untyped_storage().data_ptr() for t in batch.values()
                    if isinstance(t, torch.Tensor) and t.device.type == "cpu"}
        keys = {key for name in self.late for key in self.graph.nodes[name]["node"].input_keys}
        for key in keys & set(data):
            value = data[key]
            if (isinstance(value, torch.Tensor) and value.device.type == "cpu"
                    and value.untyped_storage().data_ptr() in storages):
                data[key] = value.clone()

    def take_transfer_seconds(self) -> tuple[float, float]:
        """Seconds the offloaded models' copies to their devices took since the last call, and the part of them
        the calls waited for (on a GPU, what the side stream did not hide; in host memory, all of it)."""
        return self.offload.take_seconds()

    def _seed_train_steps(self) -> None:
        """One draw from torch's global generator per train_step, in the graph's order, whichever runs first."""
        for generation in self.generations:
            for name in generation:
                node = self.graph.nodes[name]["node"]
                if node.kind == "train_step":
                    if name not in self.generators:
                        self.generators[name] = torch.Generator(device=self.device_of(node))
                    self.generators[name].manual_seed(int(torch.randint(2**62, (1,))))

    def _run_generation(self, nodes: list[Node], data: dict, placed: dict,
                        then: tuple[int, Callable[[], None]] | None = None) -> list[dict[str, Any]]:
        """`then` (with overlap): a call to make once the first so many of `nodes` are done, the rest running on."""
        if self.overlap_train_steps:
            return self._run_at_once(nodes, data, placed, then)
        calls = [node for node in nodes if node.kind != "train_step"]
        steps = [node for node in nodes if node.kind == "train_step"]
        found = self._run_at_once(calls, data, placed) if calls else []
        return found + [self._call(node, self._inputs(node, data, placed)) for node in steps]

    def _run_at_once(self, nodes: list[Node], data: dict, placed: dict,
                     then: tuple[int, Callable[[], None]] | None = None) -> list[dict[str, Any]]:
        inputs = [self._inputs(node, data, placed) for node in nodes]  # copies made here, on this thread
        if self.pool is None or len(nodes) == 1:  # (never with `then`: _split_at_release runs several on the pool)
            return [self._call(node, x) for node, x in zip(nodes, inputs)]
        threads = torch.get_num_threads()
        share = max(1, threads // len(nodes)) if per_thread_intra_op_threads() else None
        try:
            cuda = {self.device_of(node) for node in nodes if self.device_of(node).type == "cuda"}
            before = {device: torch.cuda.current_stream(device).record_event() for device in cuda}
            futures = [self.pool.submit(self._call_on_stream, node, x, before, share)
                       for node, x in zip(nodes, inputs)]
            first = then[0] if then is not None else 0
            for node, future in zip(nodes[:first], futures):
                self._follow(node, *future.result())
            if then is not None:
                then[1]()
            results = [future.result() for future in futures]
        finally:
            if share is not None and share != threads:
                torch.set_num_threads(threads)  # the process's count again, for threads started from now on
        for node, (out, done) in zip(nodes[first:], results[first:]):
            self._follow(node, out, done)
        return [out for out, _ in results]

    def _follow(self, node: Node, out: dict[str, Any], done: Any) -> None:
        """The current stream, which the next generation runs on, waits for `node`'s outputs (made on a stream of
        its own, which recorded the event `done`; None on the CPU)."""
        if done is not None:
            current = torch.cuda.current_stream(self.device_of(node))
            current.wait_event(done)
            for value in out.values():
                if isinstance(value, torch.Tensor) and value.is_cuda:
                    value.record_stream(current)

    def _call_on_stream(self, node: Node, inputs: dict, before: dict, share: int | None
                        ) -> tuple[dict[str, Any], Any]:
        device = self.device_of(node)
        if device.type != "cuda":
            return self._call(node, inputs, share), None
        stream = self.streams.setdefault(node.name, torch.cuda.Stream(device))
        stream.wait_event(before[device])
        with torch.cuda.stream(stream):
            for value in inputs.values():  # made on the current stream, read on this one
                if isinstance(value, torch.Tensor) and value.is_cuda:
                    value.record_stream(stream)
            out = self._call(node, inputs, share)
            return out, stream.record_event()

    def _inputs(self, node: Node, data: dict[str, Any], placed: dict) -> dict[str, Any]:
        device = self.device_of(node)
        found = {}
        for key in node.input_keys:
            value = data[key]
            if isinstance(value, torch.Tensor) and value.device != device:
                if (key, device) not in placed:
                    placed[key, device] = value.to(device, non_blocking=True)
                value = placed[key, device]
            found[key] = value
        return found

    def _call(self, node: Node, inputs: dict[str, Any], threads: int | None = None) -> dict[str, Any]:
        """`threads`: this thread's intra-op thread count, on a thread of the pool."""
        if threads is not None:
            torch.set_num_threads(threads)
        offloaded = self.offloaded.get(node.model) if node.model else None
        if offloaded is not None:
            offloaded.acquire()
        context = self.context
        if self.mesh is not None and node.kind == "train_step":  # --model_ranks
            if not self.mesh.holds(node.model):
                return {}  # another rank's model: nothing reads its outputs (algo/meshes.py checked)
            context, inputs = self.mesh.prepare(node, context, inputs)
        if node.name in self.generators:
            context = dataclasses.replace(context, generator=self.generators[node.name])
        with torch.no_grad() if node.kind == "inference" else contextlib.nullcontext():
            out = node.fn(context, inputs)
        missing = set(node.output_keys) - set(out)
        if missing:
            raise GraphError(f"node {node.name!r} did not produce {sorted(missing)}")
        return {key: out[key] for key in node.output_keys}

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=False)
