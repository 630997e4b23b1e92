"""A frozen model that waits off its device between calls, and comes back ahead of them.

A teacher policy or an RND target network is only read, once per training iteration: keeping it on the GPU
all the time spends device memory the trainable models could use. `OffloadedModel` keeps its weights in host
memory (pinned where the device is a GPU, so a copy can run asynchronously) and makes a device copy for
the iteration's calls:

    prefetch()   starts the copy (on a side CUDA stream: it overlaps whatever the compute stream runs);
    acquire()    makes the compute stream wait for the copy, and points the module at the device copy;
    release()    points the module back at the host weights; the device copy is freed.

The executor prefetches a model one generation before the nodes that call it (algo/executor.py). The copy
never goes back: a frozen model's weights do not change. On a machine without a GPU the device copy is a
plain copy in host memory, so the same path runs (and is tested) everywhere.
"""

from __future__ import annotations

import time

import torch
from torch import nn


class OffloadedModel:
    def __init__(self, module: nn.Module, device: str | torch.device, home: str | torch.device = "cpu"):
        self.module, self.device, self.home = module, torch.device(device), torch.device(home)
        self.cuda = self.device.type == "cuda"
        module.to(self.home)
        # (owner, attribute, is a parameter): every tensor the module reads, to point at one copy or the other
        self.places = [(owner, name, True) for owner in module.modules() for name, p in owner._parameters.items()
                       if p is not None]
        self.places += [(owner, name, False) for owner in module.modules() for name, b in owner._buffers.items()
                        if b is not None]
        self.host = [self._get(place).detach() for place in self.places]
        if self.cuda:
            self.host = [t.pin_memory() for t in self.host]
            self.copy_stream = torch.cuda.Stream(self.device)
        self._set_all(self.host)
        self.copies: list[torch.Tensor] | None = None
        self.events: tuple | None = None  # (copy started, copy done) on the copy stream
        self.seconds = 0.0  # transfer time not yet collected by `take_seconds`

    def prefetch(self) -> None:
        if self.copies is not None:
            return
        if self.cuda:
            start, done = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            with torch.cuda.stream(self.copy_stream):
                start.record()
                self.copies = [t.to(self.device, non_blocking=True) for t in self.host]
                done.record()
            self.events = (start, done)
        else:
            started = time.perf_counter()
            self.copies = [t.to(self.device, copy=True) for t in self.host]
            self.seconds += time.perf_counter() - started

    def acquire(self) -> None:
        """The module on its device, for calls made on the current stream from now on."""
        self.prefetch()  # not prefetched (the first generation): the copy starts now
        assert self.copies is not None
        if self.cuda and self.events is not None:
            current = torch.cuda.current_stream(self.device)
            current.wait_event(self.events[1])
            for t in self.copies:  # allocated on the copy stream, read on this one: freed only after its reads
                t.record_stream(current)
        self._set_all(self.copies)

    def release(self) -> None:
        self._collect_cuda_time()
        self._set_all(self.host)
        self.copies = None

    def take_seconds(self) -> float:
        """Transfer time since the last call (GPU: measured on the copy stream)."""
        self._collect_cuda_time(wait=True)
        seconds, self.seconds = self.seconds, 0.0
        return seconds

    def _collect_cuda_time(self, wait: bool = False) -> None:
        if self.events is None:
            return
        start, done = self.events
        if not wait and not done.query():
            return
        done.synchronize()
        self.seconds += start.elapsed_time(done) / 1000.0
        self.events = None

    def _get(self, place) -> torch.Tensor:
        owner, name, is_param = place
        return owner._parameters[name] if is_param else owner._buffers[name]

    def _set_all(self, tensors: list[torch.Tensor]) -> None:
        for (owner, name, is_param), tensor in zip(self.places, tensors):
            if is_param:
                owner._parameters[name] = nn.Parameter(tensor, requires_grad=False)
            else:
                owner._buffers[name] = tensor
