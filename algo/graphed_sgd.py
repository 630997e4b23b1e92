"""The learner's SGD step recorded once as a CUDA graph and replayed for every minibatch (`--sgd_cuda_graphs`).

On a GPU, an SGD step of a small model costs the host's launching of its kernels, not the GPU's arithmetic:
the forward pass, the PPO losses, the backward, the clipping and Adam are a few hundred kernels, each through
Python and torch's dispatcher. Pong's step took about 6 ms on an H200 at 256 samples and hardly less at half
of that (docs/results.md), so the learner was the bottleneck of every GPU run. A CUDA graph records the
launches once and replays them with one call.

What a recording needs, and how the step meets it:
- Fixed addresses. Each minibatch is copied into the recording's own input tensors; the statistics come out
  in a tensor the graph owns, copied out at once.
- Nothing read on the host. The finite check stays on the device (algo/non_finite.py), in one guard kept
  for every dataset and reset at each, whose flag the recording updates in place.
- Floats are constants. The learning rate is read from a tensor (FusedAdam.keep_lr_in_tensor); a change of
  any other hyperparameter (PBT) records the step again.
- The optimizer's state where it was recorded. New state (PBT's fresh moments, a loaded checkpoint) records
  again.
- Fixed shapes. One shape is recorded, the first to have had its warm-up steps (an epoch's full minibatches);
  any other (a shorter last minibatch of an epoch) runs eagerly.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Hashable, Protocol

import torch
from torch import nn

from sf_core.algo.adam import FusedAdam
from sf_core.algo.non_finite import StepGuard
from sf_core.algo.normalization import forget_cached_statistics
from sf_core.config import Config, ConfigError, register_check

log = logging.getLogger("sf_core")

Minibatch = dict[str, torch.Tensor]
StepStats = tuple[torch.Tensor, tuple[str, ...]]  # one step's statistics on the model's device, and their names
StepFn = Callable[[Minibatch], StepStats]  # one eager step


class Recording(Protocol):
    """How a step is recorded and replayed (CudaRecording; a test may stand in a recording that reruns)."""

    def warm(self, fn: Callable[[], Any]) -> Any:
        """fn once, eagerly, before any recording (libraries pick kernels and allocate workspaces)."""

    def record(self, fn: Callable[[], torch.Tensor]) -> torch.Tensor:
        """Records fn and runs it once; returns its output, which each replay writes again."""

    def replay(self) -> None: ...


def warm_on_side_stream(device: torch.device | str, fn: Callable[[], Any]) -> Any:
    """fn on a side stream, ordered after and before the current stream's work: the calls before a CUDA graph's
    recording, where cuDNN and cuBLAS pick their kernels and allocate workspaces, kept off the stream a
    recording is made from, as torch asks."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        result = fn()
    torch.cuda.current_stream(device).wait_stream(side)
    return result


class CudaRecording:
    def __init__(self, device: torch.device | str):
        self.device = torch.device(device)
        self.graph: torch.cuda.CUDAGraph | None = None

    def warm(self, fn: Callable[[], Any]) -> Any:
        return warm_on_side_stream(self.device, fn)

    def record(self, fn: Callable[[], torch.Tensor]) -> torch.Tensor:
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):  # records the launches without running them
            output = fn()
        self.graph.replay()
        return output

    def replay(self) -> None:
        assert self.graph is not None
        self.graph.replay()


class _Recorded:
    """A recorded step: the minibatch shapes (`key`) and the hyperparameters and optimizer state it holds."""

    def __init__(self, key: Hashable, inputs: Minibatch, output: torch.Tensor, names: tuple[str, ...],
                 recording: Recording, values: Hashable, state: list[torch.Tensor]):
        self.key, self.inputs, self.output, self.names, self.recording = key, inputs, output, names, recording
        self.values, self.state = values, state


class GraphedSGD:
    """The SGD steps of one model with one loss: eager for the first `warmup_steps`, then recorded and replayed.
    `begin` before each dataset's steps, `step` for each, then the guard's `finish`."""

    def __init__(self, model: nn.Module, optimizer: FusedAdam, device: torch.device | str,
                 recording: Callable[[], Recording] | None = None, warmup_steps: int = 3):
        self.model, self.optimizer, self.warmup_steps = model, optimizer, warmup_steps
        self.new_recording = recording or (lambda: CudaRecording(device))
        self.warmer = self.new_recording()
        self.guard = StepGuard(optimizer, device, on_device=True)
        optimizer.keep_lr_in_tensor()
        self.recorded: _Recorded | None = None  # one shape is recorded, the first to be warm
        self.eager_steps: dict[Hashable, int] = {}
        self._values: Hashable = None  # the current dataset's hyperparameters (`begin`)
        self.failed: str | None = None  # why the step could not be recorded: every step runs eagerly

    def begin(self, hyperparameters: Hashable) -> StepGuard:
        """A dataset's steps start: the learning rate into its tensor, the guard reset, and the recording dropped
        if `hyperparameters` (every value the step reads but the rate) or the optimizer's state changed."""
        group = self.optimizer.param_groups[0]
        values = (hyperparameters, group["betas"], group["eps"], group["weight_decay"])
        if self.recorded is not None and not self._still_holds(self.recorded, values):
            self.recorded = None
            self.eager_steps.clear()
        self.optimizer.load_lr()
        self.guard.reset()
        self._values = values
        return self.guard

    def step(self, mb: Minibatch, run: StepFn) -> StepStats:
        """`run(mb)`'s statistics and their names, by replaying its recording for mb's shapes once there is one."""
        key = tuple((name, tuple(t.shape), t.dtype) for name, t in mb.items())
        recorded = self.recorded
        if recorded is not None and recorded.key == key:
            for name, t in mb.items():
                recorded.inputs[name].copy_(t, non_blocking=True)
            recorded.recording.replay()
            return recorded.output.clone(), recorded.names
        count = self.eager_steps.get(key, 0)
        self.eager_steps[key] = count + 1
        if count < self.warmup_steps:
            return self.warmer.warm(lambda: run(mb))
        if recorded is not None or self.failed:  # another shape holds the recording (an epoch's full minibatches)
            return run(mb)
        return self._record(key, mb, run)

    def _record(self, key: Hashable, mb: Minibatch, run: StepFn) -> StepStats:
        inputs = {name: t.clone() for name, t in mb.items()}
        names: list[tuple[str, ...]] = []

        def step() -> torch.Tensor:
            output, step_names = run(dict(inputs))
            names.append(step_names)
            return output

        recording = self.new_recording()
        forget_cached_statistics(self.model)  # the recording converts the running statistics itself
        try:
            output = recording.record(step)
        except RuntimeError as exc:  # nothing recorded ran: the step runs eagerly, as do all after it
            self.failed = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            log.warning("the SGD step could not be recorded as a CUDA graph (%s): it runs eagerly", self.failed)
            return run(mb)
        finally:
            forget_cached_statistics(self.model)  # eager calls must not read the recording's memory
        self.recorded = _Recorded(key, inputs, output, names[0], recording, self._values, self._optimizer_state())
        shapes = ", ".join(f"{name} {list(t.shape)}" for name, t in inputs.items() if name in ("obs", "actions"))
        log.info("the SGD step is recorded as a CUDA graph (%s) and replayed from now on", shapes)
        return output.clone(), names[0]

    def _optimizer_state(self) -> list[torch.Tensor]:
        return [t for state in self.optimizer.state.values() for t in state.values()]

    def _still_holds(self, recorded: _Recorded, values: Hashable) -> bool:
        now = self._optimizer_state()
        return (values == recorded.values and len(now) == len(recorded.state)
                and all(a is b for a, b in zip(now, recorded.state)))


def is_recording(device: torch.device | str) -> bool:
    """Whether a CUDA graph is being recorded on `device`'s current stream (autocast must then not cache)."""
    return torch.device(device).type == "cuda" and torch.cuda.is_current_stream_capturing()


def graphed_sgd(slot: Any, loss: Hashable, enabled: bool, gather: Any, check_on_device: bool | None
                ) -> GraphedSGD | None:
    """`slot`'s recorded steps for `loss` (made on first use), where a recording can serve: --sgd_cuda_graphs,
    a model on a GPU with the fused Adam, one learner (a group's all-reduce would be recorded too) and the
    finite check on the device. None: eager steps."""
    if loss in slot.sgd_graphs:
        return slot.sgd_graphs[loss]
    if not (enabled and torch.device(slot.device).type == "cuda" and isinstance(slot.optimizer, FusedAdam)
            and gather is None and check_on_device is not False):
        return None
    slot.sgd_graphs[loss] = GraphedSGD(slot.module, slot.optimizer, slot.device)
    return slot.sgd_graphs[loss]


@register_check
def check_graphed_sgd(cfg: Config) -> None:
    if cfg.sgd_cuda_graphs and cfg.overlap_graph_nodes:
        raise ConfigError("--sgd_cuda_graphs=True with --overlap_graph_nodes=True: a step recorded on one thread "
                          "forbids the host waits of the train_steps running at once on others: turn one of the "
                          "two off")
    if cfg.sgd_cuda_graphs and cfg.num_learners > 1:
        raise ConfigError(f"--sgd_cuda_graphs=True records one learner's SGD step; with --num_learners="
                          f"{cfg.num_learners} every step averages its gradients across the ranks, which a "
                          f"recording cannot hold: turn one of the two off")

