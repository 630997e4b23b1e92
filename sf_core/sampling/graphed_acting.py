"""The inference worker's forward pass and sampling replayed as CUDA graphs (`--cuda_graphs`).

A forward pass of a few dozen rows is short on a GPU; what costs is the host launching its kernels one by
one (the encoder, the heads, the sampling, each a handful of kernels, each through Python and torch's
dispatcher). A CUDA graph records those launches once and replays them with one call. Graphs have fixed
shapes, so each batch is padded up to a bucket (a power of two times the smallest request) and the rows
past the batch are ignored; a bucket's graph is recorded the first time a batch needs it.

A graph reads and writes fixed addresses: the input is copied into the bucket's own input tensor, the
outputs are views of tensors the graph owns (valid until its next replay), and the weights must be updated
in place (`load_state_dict` copies into the parameters, which is what `SharedWeights.load_into` does).
Sampling draws from torch's CUDA generator, which advances on every replay as it does eagerly.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from sf_core.algo.graphed_sgd import warm_on_side_stream
from sf_core.algo.normalization import forget_cached_statistics

Acting = Callable[[torch.Tensor], dict[str, torch.Tensor]]  # observations -> actions, log_prob, values


class GraphedActing:
    def __init__(self, act: Acting, model: nn.Module, device: torch.device | str, min_rows: int,
                 warmup_calls: int = 2):
        self.act, self.model, self.device = act, model, torch.device(device)
        self.min_rows, self.warmup_calls = max(1, min_rows), warmup_calls
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor, dict[str, torch.Tensor]]] = {}
        self.pool = None  # every bucket's graph allocates from one memory pool: one is replayed at a time

    def bucket(self, rows: int) -> int:
        size = self.min_rows
        while size < rows:
            size *= 2
        return size

    def __call__(self, obs: torch.Tensor) -> dict[str, torch.Tensor]:
        """`act(obs)` by replaying the graph of obs's bucket; the outputs are valid until the next call."""
        rows = obs.shape[0]
        size = self.bucket(rows)
        if size not in self.graphs:
            self.graphs[size] = self._record(size, obs)
        graph, static_in, static_out = self.graphs[size]
        static_in[:rows].copy_(obs, non_blocking=True)
        graph.replay()
        return {name: t[:rows] for name, t in static_out.items()}

    def _record(self, size: int, example: torch.Tensor):
        static_in = torch.zeros((size, *example.shape[1:]), dtype=example.dtype, device=self.device)
        warm_on_side_stream(self.device, lambda: [self.act(static_in) for _ in range(self.warmup_calls)])
        graph = torch.cuda.CUDAGraph()
        forget_cached_statistics(self.model)  # so the graph converts the running statistics itself on each replay
        with torch.cuda.graph(graph, pool=self.pool):
            static_out = self.act(static_in)
        forget_cached_statistics(self.model)  # eager calls must not read tensors of the graph's memory pool
        self.pool = graph.pool()
        return graph, static_in, static_out
