"""How an inference worker's forward pass reaches its device and comes back.

On the CPU the model reads what numpy gathers from the trajectory buffers, with no copy beyond the gather,
and its outputs are read in place. On a GPU both directions go through page-locked (pinned) staging buffers,
allocated once and grown when a larger batch comes:

    inputs   gathered from shared memory straight into a pinned buffer (one pass, `np.take` into it), then
             copied to the GPU with non_blocking=True: the host does not wait, and the copy runs at the
             bus's speed rather than through the driver's pageable bounce buffer;
    outputs  every output copied into its pinned buffer with non_blocking=True, then one wait for all of
             them (an event after the copies), instead of a blocking `.cpu()` per output.

A staging buffer is reused by the next forward pass, so what `to_host` returns must be consumed (written to
the trajectory buffers) before the next `gather`: the inference worker does exactly that. `staged` and `pin`
can be forced for tests, which run the staging path on the CPU.
"""

from __future__ import annotations

import numpy as np
import torch


class DeviceIO:
    def __init__(self, device: str | torch.device, staged: bool | None = None, pin: bool | None = None,
                 yield_while_waiting: bool = False):
        self.device = torch.device(device)
        # waiting for the GPU: spin on a core (the fastest wake-up) or sleep in the driver, leaving the core
        # to the envs of a machine where every core has a rollout worker
        self.yield_while_waiting = yield_while_waiting
        self.done: torch.cuda.Event | None = None
        self.staged = self.device.type != "cpu" if staged is None else staged
        self.pin = self.device.type == "cuda" if pin is None else pin
        self.buffers: dict[str, torch.Tensor] = {}

    def gather(self, name: str, source: np.ndarray, index: tuple, row_shape: tuple[int, ...]) -> torch.Tensor:
        """`source[index]` as a [rows, *row_shape] tensor on the device; `index` selects along `source`'s
        leading dims with broadcastable integer arrays (a numpy advanced index)."""
        if not self.staged:
            return torch.from_numpy(source[index]).reshape((-1, *row_shape)).to(self.device)
        k = len(index)
        flat_index = np.ravel_multi_index(np.broadcast_arrays(*index), source.shape[:k]).ravel()
        blocks = source.reshape((-1, *source.shape[k:]))  # a view: the trajectory buffers are contiguous
        staging = self._staging(name, (flat_index.size, *source.shape[k:]), source.dtype)
        # mode="clip" writes straight into `out`; "raise" would gather into a temporary first (numpy's docs)
        np.take(blocks, flat_index, axis=0, out=staging.numpy(), mode="clip")
        return staging.reshape((-1, *row_shape)).to(self.device, non_blocking=True)

    def to_device(self, name: str, array: np.ndarray) -> torch.Tensor:
        """A host array computed on the fly (a recurrent state) on the device."""
        if not self.staged:
            return torch.from_numpy(array).to(self.device)
        staging = self._staging(name, array.shape, array.dtype)
        np.copyto(staging.numpy(), array)
        return staging.to(self.device, non_blocking=True)

    def to_host(self, outputs: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
        """Every output as a numpy array, with one wait for all of them; valid until the next call."""
        if not self.staged:
            return {name: t.cpu().numpy() for name, t in outputs.items()}
        host = {}
        for name, t in outputs.items():
            staging = self._staging(f"out_{name}", tuple(t.shape), t.dtype)
            staging.copy_(t, non_blocking=True)
            host[name] = staging.numpy()
        if self.device.type == "cuda":
            if self.done is None:
                self.done = torch.cuda.Event(blocking=self.yield_while_waiting)
            self.done.record(torch.cuda.current_stream(self.device))
            self.done.synchronize()
        return host

    def _staging(self, name: str, shape: tuple[int, ...], dtype: np.dtype | torch.dtype) -> torch.Tensor:
        """A [shape] view of staging buffer `name`; grown (to twice the need, so a slowly growing batch does not
        reallocate every pass) when too small or of another row shape or dtype."""
        torch_dtype = dtype if isinstance(dtype, torch.dtype) else torch.from_numpy(np.empty(0, dtype)).dtype
        rows, row_shape = (shape[0], shape[1:]) if shape else (1, ())
        buffer = self.buffers.get(name)
        if buffer is None or buffer.shape[0] < rows or buffer.shape[1:] != row_shape or buffer.dtype != torch_dtype:
            capacity = max(rows, 2 * buffer.shape[0] if buffer is not None and buffer.shape[1:] == row_shape else 0)
            buffer = torch.empty((capacity, *row_shape), dtype=torch_dtype, pin_memory=self.pin)
            self.buffers[name] = buffer
        return buffer[:rows].reshape(shape) if shape else buffer[0]
