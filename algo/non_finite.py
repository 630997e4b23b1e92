"""A gradient that is not finite never reaches the weights, and the run stops with the loss terms that made it.

Checking each SGD step's gradient norm on the host costs nothing on the CPU, but on a GPU reading it makes the
host wait for every step's backward before it may queue the next step: the GPU then idles while Python
launches kernels. So on a GPU, with the fused Adam that can skip a step on the device, the check stays there:
a flag that the first non-finite step of a dataset raises and that holds for the dataset's later steps
(Adam's kernel does nothing while it is up), read once when the dataset is done. Either way no step from
the first non-finite one on changes the weights, and the error names that step's loss terms.
"""

from __future__ import annotations

import torch

from sf_core.algo.adam import FusedAdam


def error(described: dict[str, float]) -> FloatingPointError:
    terms = ", ".join(f"{name} {value}" for name, value in described.items())
    return FloatingPointError(f"non-finite loss or gradients ({terms}): no optimizer step taken; check the env's "
                             f"observations and rewards for NaN/inf")


class StepGuard:
    """One dataset's optimizer steps (of one optimizer): `step` for each, `finish` after the last.

    `on_device`: keep the check on the device (None: where it pays, a CUDA model with the fused Adam)."""

    def __init__(self, optimizer, device: torch.device | str, on_device: bool | None = None):
        if on_device is None:
            on_device = torch.device(device).type == "cuda" and isinstance(optimizer, FusedAdam)
        if on_device and not isinstance(optimizer, FusedAdam):
            raise ValueError("the check on the device needs the fused Adam (sf_core.algo.adam.FusedAdam), "
                             f"not {type(optimizer).__name__}")
        self.optimizer = optimizer
        self.on_device = on_device
        self.found: torch.Tensor | None = None  # 1.0 from the first non-finite step on
        self.first_terms: torch.Tensor | None = None  # that step's loss terms
        self.names: tuple[str, ...] = ()

    def step(self, grad_norm: torch.Tensor, terms: dict[str, torch.Tensor]) -> None:
        """The optimizer's step, unless `grad_norm` (the gradients' norm) or an earlier one was not finite."""
        if not self.on_device:
            if not torch.isfinite(grad_norm):
                raise error({name: value.item() for name, value in terms.items()})
            self.optimizer.step()
            return
        bad = ~torch.isfinite(grad_norm)
        with torch.no_grad():
            values = torch.stack([t.detach().float().reshape(()) for t in terms.values()])
            if self.found is None:
                self.found, self.names = torch.zeros((), device=values.device), tuple(terms)
                self.first_terms = torch.zeros_like(values)
            # in place: a step recorded as a CUDA graph (algo/graphed_sgd.py) writes where it was recorded
            self.first_terms.copy_(torch.where(bad & (self.found == 0), values, self.first_terms))
            self.found.copy_(torch.maximum(self.found, bad.float()))
        self.optimizer.step(found_inf=self.found)

    def reset(self) -> None:
        """Ready for another dataset's steps: no step of it found non-finite yet."""
        if self.found is not None:
            self.found.zero_()

    def finish(self) -> None:
        """Raises if a step of this dataset was not finite (on the device: the one read of the flag)."""
        if self.found is not None and self.found.item():
            raise error(dict(zip(self.names, self.first_terms.tolist())))
