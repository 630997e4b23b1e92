"""Runs an algorithm's graph (algo/graph.py) on each dataset: nodes in dependency order, each on its device.

Placement. A node runs on its own `device` if it names one, else on its model's (`ModelSlot.device`), else on
the learner's (`home`). Its inputs are moved there as it reads them (one copy per key and device, shared by
every node on that device), and its outputs stay where they were made until a consumer elsewhere reads them.

Overlap (`overlap=True`, the `--overlap_graph_nodes` flag). The nodes of one generation need nothing from
each other: those that train nothing run at once, each on a thread (torch releases the GIL inside its
kernels, so on a CPU they take a core each) and, on a GPU, each on a CUDA stream of its own. A node's stream
first waits for the work queued before the generation (its inputs), and the stream the next generation runs
on waits for each node's stream, so consumers never read an output early. The generation's train_steps
follow, one by one, in both modes. Every node computes what it would alone: the results are those of
sequential execution.

Offload. A frozen model with an `offload_device` waits there between iterations (algo/offload.py). Its copy
to the device starts one generation before its first call, beside the calls before it, and is dropped after
its last call; `take_transfer_seconds` tells the learner how long the copies took.
"""

from __future__ import annotations

import contextlib
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from sf_core.algo.graph import Context, DataflowGraph, GraphError, Node
from sf_core.algo.offload import OffloadedModel


class GraphExecutor:
    def __init__(self, graph: DataflowGraph, context: Context, overlap: bool = False,
                 home: str | torch.device = "cpu"):
        self.graph, self.context, self.home = graph, context, torch.device(home)
        self.generations = graph.generations()
        widest = max((len(g) for g in self.generations), default=1)
        self.pool = ThreadPoolExecutor(max_workers=widest, thread_name_prefix="graph") if overlap else None
        self.streams: dict[str, Any] = {}  # node name -> its CUDA stream, when nodes overlap on a GPU
        self.offloaded: dict[str, OffloadedModel] = {}
        for name, slot in (context.models.items() if context is not None else ()):
            if slot.offload_device is not None:
                if slot.trainable:
                    raise GraphError(f"model {name!r} is trained: only a frozen model can be offloaded")
                self.offloaded[name] = OffloadedModel(slot.module, slot.device, slot.offload_device)
        # per offloaded model: the generation of its first call (prefetched one earlier) and of its last
        self.first_use, self.last_use = {}, {}
        for index, generation in enumerate(self.generations):
            for name in generation:
                model = graph.nodes[name]["node"].model
                if model in self.offloaded:
                    self.first_use.setdefault(model, index)
                    self.last_use[model] = index

    def device_of(self, node: Node) -> torch.device:
        if node.device is not None:
            return torch.device(node.device)
        slot = self.context.models.get(node.model) if node.model else None
        return torch.device(slot.device) if slot is not None else self.home

    def run(self, batch: dict[str, Any]) -> dict[str, Any]:
        data, placed = dict(batch), {}
        for index, generation in enumerate(self.generations):
            for model, first in self.first_use.items():
                if first in (index, index + 1):
                    self.offloaded[model].prefetch()
            nodes = [self.graph.nodes[name]["node"] for name in generation]
            for out in self._run_generation(nodes, data, placed):
                data.update(out)
            for model, last in self.last_use.items():
                if last == index:
                    self.offloaded[model].release()
        return data

    def take_transfer_seconds(self) -> tuple[float, bool]:
        """Seconds the offloaded models' copies to their devices took since the last call, and whether they held
        up the calls (a copy in host memory) or ran beside them (a side CUDA stream)."""
        seconds = sum(model.take_seconds() for model in self.offloaded.values())
        return seconds, not any(model.cuda for model in self.offloaded.values())

    def _run_generation(self, nodes: list[Node], data: dict, placed: dict) -> list[dict[str, Any]]:
        # train_steps last, one by one, in both modes: they draw from torch's global random generator (the
        # minibatches' shuffle), whose draws must come in the same order for the same results
        calls = [node for node in nodes if node.kind != "train_step"]
        steps = [node for node in nodes if node.kind == "train_step"]
        found = self._run_at_once(calls, data, placed) if calls else []
        return found + [self._call(node, self._inputs(node, data, placed)) for node in steps]

    def _run_at_once(self, nodes: list[Node], data: dict, placed: dict) -> list[dict[str, Any]]:
        inputs = [self._inputs(node, data, placed) for node in nodes]  # copies made here, on this thread
        if self.pool is None or len(nodes) == 1:
            return [self._call(node, x) for node, x in zip(nodes, inputs)]
        cuda = [self.device_of(node) for node in nodes if self.device_of(node).type == "cuda"]
        if not cuda:
            return list(self.pool.map(self._call, nodes, inputs))
        before = {device: torch.cuda.current_stream(device).record_event() for device in set(cuda)}
        results = list(self.pool.map(lambda node, x: self._call_on_stream(node, x, before), nodes, inputs))
        for node, (out, done) in zip(nodes, results):
            if done is not None:  # the next generation, on the current stream, reads this node's outputs
                current = torch.cuda.current_stream(self.device_of(node))
                current.wait_event(done)
                for value in out.values():
                    if isinstance(value, torch.Tensor) and value.is_cuda:
                        value.record_stream(current)
        return [out for out, _ in results]

    def _call_on_stream(self, node: Node, inputs: dict, before: dict) -> tuple[dict[str, Any], Any]:
        device = self.device_of(node)
        if device.type != "cuda":
            return self._call(node, inputs), None
        stream = self.streams.setdefault(node.name, torch.cuda.Stream(device))
        stream.wait_event(before[device])
        with torch.cuda.stream(stream):
            for value in inputs.values():  # made on the current stream, read on this one
                if isinstance(value, torch.Tensor) and value.is_cuda:
                    value.record_stream(stream)
            out = self._call(node, inputs)
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

    def _call(self, node: Node, inputs: dict[str, Any]) -> dict[str, Any]:
        offloaded = self.offloaded.get(node.model) if node.model else None
        if offloaded is not None:
            offloaded.acquire()
        with torch.no_grad() if node.kind == "inference" else contextlib.nullcontext():
            out = node.fn(self.context, inputs)
        missing = set(node.output_keys) - set(out)
        if missing:
            raise GraphError(f"node {node.name!r} did not produce {sorted(missing)}")
        return {key: out[key] for key in node.output_keys}

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=False)
