"""A frozen model that waits off its device between calls, and comes back ahead of them.

A teacher policy or an RND target network is only read, once per training iteration: keeping it on the GPU
all the time spends device memory the trainable models could use. `OffloadedModel` keeps its weights in host
memory (pinned where the device is a GPU, so a copy can run asynchronously) and makes a device copy for
the iteration's calls:

    prefetch()   starts the copy (on a side CUDA stream: it overlaps whatever the compute stream runs);
    acquire()    makes the compute stream wait for the copy, and points the module at the device copy;
    release()    points the module back at the host weights; the device copy is freed.

`OffloadSchedule` says when, counting generations across datasets: the copy starts one generation before
the model's first call, and for a model called in the first generation that is the last generation of the
dataset before, so its copy runs beside that dataset's training. The copy never goes back: a frozen model's
weights do not change.

The time a copy took, and the part of it the calls waited for (its *exposed* time), are measured: on a GPU
with events on the copy stream and on the stream that called the model; in host memory, where the copy is a
plain copy on the calling thread, all of it is exposed. The same path runs (and is tested) everywhere, though
`--offload_models` leaves a model on a CPU in place (sf_core.algo.placement): there it would save nothing.
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
        self.events: list = []  # per copy on the copy stream: [started, done, the first call's stream asked]
        self.seconds = self.exposed = 0.0  # copy time and its exposed part, not yet collected by `take_seconds`

    def prefetch(self) -> None:
        if self.copies is not None:
            return
        if self.cuda:
            start, done = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            with torch.cuda.stream(self.copy_stream):
                start.record()
                self.copies = [t.to(self.device, non_blocking=True) for t in self.host]
                done.record()
            self.events.append([start, done, None])
        else:
            started = time.perf_counter()
            self.copies = [t.to(self.device, copy=True) for t in self.host]
            seconds = time.perf_counter() - started
            self.seconds, self.exposed = self.seconds + seconds, self.exposed + seconds  # it held the thread up

    def acquire(self) -> None:
        """The module on its device, for calls made on the current stream from now on."""
        self.prefetch()  # not prefetched (the first generation of the first dataset): the copy starts now
        assert self.copies is not None
        if self.cuda:
            current = torch.cuda.current_stream(self.device)
            pending = self.events[-1]
            if pending[2] is None:  # the first call after this copy: when it asked, against when the copy ended
                pending[2] = torch.cuda.Event(enable_timing=True)
                pending[2].record(current)
            current.wait_event(pending[1])
            for t in self.copies:  # allocated on the copy stream, read on this one: freed only after its reads
                t.record_stream(current)
        self._set_all(self.copies)

    def release(self) -> None:
        self._set_all(self.host)
        self.copies = None

    def take_seconds(self) -> tuple[float, float]:
        """Copy time since the last call, and the part of it the calls waited for. On a GPU only the copies that
        are over and were waited for are counted; a copy still running (the next dataset's) counts later."""
        while self.events and all(e is not None and e.query() for e in self.events[0]):
            start, done, asked = self.events.pop(0)
            self.seconds += start.elapsed_time(done) / 1000.0
            self.exposed += max(0.0, asked.elapsed_time(done)) / 1000.0  # negative: it was over before the ask
        seconds, exposed = self.seconds, self.exposed
        self.seconds = self.exposed = 0.0
        return seconds, exposed

    def _get(self, place) -> torch.Tensor:
        owner, name, is_param = place
        return owner._parameters[name] if is_param else owner._buffers[name]

    def _set_all(self, tensors: list[torch.Tensor]) -> None:
        for (owner, name, is_param), tensor in zip(self.places, tensors):
            if is_param:
                owner._parameters[name] = nn.Parameter(tensor, requires_grad=False)
            else:
                owner._buffers[name] = tensor


class OffloadSchedule:
    """When each offloaded model's copy starts and is dropped, for a graph of `generations` generations in which
    model `name` is called from generation `first[name]` to `last[name]`."""

    def __init__(self, models: dict[str, OffloadedModel], first: dict[str, int], last: dict[str, int],
                 generations: int):
        self.models = models
        # one generation before the first call, counted across datasets: -1 is the dataset before's last
        self.fetch_at = {name: (first[name] - 1) % generations for name in models}
        # kept when its copy for the next dataset starts in its own last generation (or the graph has only one)
        self.drop_at = {name: last[name] for name in models if last[name] != self.fetch_at[name]}

    def before(self, generation: int) -> None:
        for name, at in self.fetch_at.items():
            if at == generation:
                self.models[name].prefetch()

    def after(self, generation: int) -> None:
        for name, at in self.drop_at.items():
            if at == generation:
                self.models[name].release()

    def take_seconds(self) -> tuple[float, float]:
        taken = [model.take_seconds() for model in self.models.values()]
        return sum(seconds for seconds, _ in taken), sum(exposed for _, exposed in taken)
