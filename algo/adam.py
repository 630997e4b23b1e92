"""Adam for the learner: torch's fused Adam kernel (`torch._fused_adam_`), driven without `torch.optim.Optimizer`.

Why not `torch.optim.Adam(fused=True)` itself: the first call of any of its methods, the constructor included,
imports `torch._dynamo`, about 2 s of one core (docs/performance.md). The learner's first SGD step waited for
it, and on a 2-core machine it took that core from the envs just as sampling began. This class computes the
same update with the same kernel, and its state and `state_dict` have torch's layout, so checkpoints load in
either. Where the kernel is missing (another device, an older torch), `make_adam` returns torch's Adam.
"""

from __future__ import annotations

from typing import Any, Iterable

import torch

OPTIONS = {"amsgrad": False, "maximize": False, "foreach": None, "capturable": False, "differentiable": False,
           "fused": True, "decoupled_weight_decay": False}  # torch's, in its state_dict: fixed here


def make_adam(params: Iterable[torch.nn.Parameter], device: str | torch.device) -> Any:
    """Fused Adam on the CPU and CUDA (this module's), torch's Adam elsewhere."""
    params = list(params)
    if torch.device(device).type in ("cpu", "cuda") and hasattr(torch, "_fused_adam_"):
        return FusedAdam(params)
    return torch.optim.Adam(params)


class FusedAdam:
    def __init__(self, params: list[torch.nn.Parameter], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0):
        self.params = params
        self.param_groups = [{"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay, **OPTIONS,
                              "params": params}]
        self.state: dict[torch.Tensor, dict[str, torch.Tensor]] = {}  # torch's: per parameter
        # the rate in a tensor on the parameters' device (`keep_lr_in_tensor`), or None: the group's float
        self.lr_tensor: torch.Tensor | None = None

    def keep_lr_in_tensor(self) -> None:
        """From now on `step` reads the rate from a tensor on the parameters' device, which `load_lr` fills from
        the group's value. A step recorded as a CUDA graph (algo/graphed_sgd.py) keeps every float argument as
        a constant, so a rate that changes between datasets must be read from memory."""
        if self.lr_tensor is None:
            self.lr_tensor = torch.tensor(float(self.param_groups[0]["lr"]), device=self.params[0].device)

    def load_lr(self) -> None:
        """The group's rate into the rate's tensor (outside a recording: there the write would be replayed)."""
        if self.lr_tensor is not None:
            self.lr_tensor.fill_(float(self.param_groups[0]["lr"]))

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    @torch.no_grad()
    def step(self, found_inf: torch.Tensor | None = None) -> None:
        """Adam's step; none (the moments and step counts too) where `found_inf`, a float flag on the
        parameters' device, is 1: the kernel reads it there, so skipping needs no read on the host."""
        group = self.param_groups[0]
        params = [p for p in self.params if p.grad is not None]
        for p in params:
            if p not in self.state:  # the first step: zero moments, the step count as a float on the device
                self.state[p] = {"step": torch.zeros((), dtype=torch.float32, device=p.device),
                                 "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                                 "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format)}
        by_kind: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
        for p in params:  # the kernel takes one device and dtype at a time
            by_kind.setdefault((p.device, p.dtype), []).append(p)
        beta1, beta2 = group["betas"]
        lr = self.lr_tensor if self.lr_tensor is not None else group["lr"]
        for same in by_kind.values():
            states = [self.state[p] for p in same]
            steps = [s["step"] for s in states]
            torch._foreach_add_(steps, 1)
            torch._fused_adam_(same, [p.grad for p in same], [s["exp_avg"] for s in states],
                               [s["exp_avg_sq"] for s in states], [], steps, amsgrad=False, lr=lr,
                               beta1=beta1, beta2=beta2, weight_decay=group["weight_decay"], eps=group["eps"],
                               maximize=False, grad_scale=None, found_inf=found_inf)
            if found_inf is not None:  # the kernel skipped the update, not the count added above
                torch._foreach_sub_(steps, [found_inf] * len(steps))

    def state_dict(self) -> dict[str, Any]:
        """torch's layout: state by parameter index, the group with the indices of its parameters."""
        index = {p: i for i, p in enumerate(self.params)}
        group = {k: v for k, v in self.param_groups[0].items() if k != "params"}
        return {"state": {index[p]: dict(s) for p, s in self.state.items()},
                "param_groups": [{**group, "params": list(range(len(self.params)))}]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """From either optimizer's state_dict (this one's or torch.optim.Adam's), onto each parameter's device."""
        groups = state_dict["param_groups"]
        if len(groups) != 1 or len(groups[0]["params"]) != len(self.params):
            raise ValueError(f"the optimizer state is for {sum(len(g['params']) for g in groups)} parameters in "
                             f"{len(groups)} groups; this model has {len(self.params)} in one")
        for key in ("lr", "betas", "eps", "weight_decay"):
            self.param_groups[0][key] = groups[0][key]
        self.state = {}
        for i, s in state_dict["state"].items():
            p = self.params[int(i)]
            # copies: a live optimizer's state_dict holds its own tensors, whose steps must not move this one's
            self.state[p] = {"step": torch.as_tensor(s["step"], dtype=torch.float32).to(p.device).reshape(()).clone(),
                             "exp_avg": s["exp_avg"].to(p.device, p.dtype).clone(),
                             "exp_avg_sq": s["exp_avg_sq"].to(p.device, p.dtype).clone()}
