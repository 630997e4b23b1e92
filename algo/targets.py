"""Learning targets: GAE and V-trace, vectorised over time.

Both are a discounted sum with a per-step discount, y_t = x_t + c_t · y_{t+1}. Unrolled,
y_t = Σ_{s≥t} (Π_{k=t}^{s-1} c_k) x_s, so the whole recursion is one masked [T, T] weighting of x:
no Python loop over time. All tensors are time-major: [T, B] (values carry T+1 rows, the last one
being the bootstrap value after the final step).
"""

from __future__ import annotations

import torch

_MAX_ELEMENTS = 1 << 22  # bound on the [T, T, B] weight tensor per chunk (32 MiB in float64)


def discounted_cumsum(x: torch.Tensor, discounts: torch.Tensor) -> torch.Tensor:
    """y_t = x_t + discounts_t · y_{t+1} with y_T = 0, for x and discounts of shape [T, B]."""
    T, B = x.shape
    chunk = max(1, _MAX_ELEMENTS // (T * T))
    if B > chunk:
        return torch.cat([discounted_cumsum(x[:, i:i + chunk], discounts[:, i:i + chunk])
                          for i in range(0, B, chunk)], dim=1)

    c = discounts.double()
    is_zero = c == 0
    log_c = torch.where(is_zero, torch.zeros_like(c), c.clamp_min(1e-300).log())
    # exclusive prefix sums: index t covers steps k < t
    log_prefix = torch.cumsum(log_c, 0) - log_c
    zero_prefix = torch.cumsum(is_zero.long(), 0) - is_zero.long()

    # weight[t, s] = prod_{k=t}^{s-1} c_k for s >= t, which is 0 if any c_k in that range is 0
    log_w = log_prefix.unsqueeze(0) - log_prefix.unsqueeze(1)  # [t, s, B]
    t_idx = torch.arange(T, device=x.device)
    upper = (t_idx.unsqueeze(1) <= t_idx.unsqueeze(0)).unsqueeze(-1)
    unbroken = zero_prefix.unsqueeze(0) == zero_prefix.unsqueeze(1)
    log_w = torch.where(upper & unbroken, log_w, torch.full_like(log_w, float("-inf")))
    return torch.einsum("tsb,sb->tb", log_w.exp(), x.double()).to(x.dtype)


def gae(rewards: torch.Tensor, values: torch.Tensor, dones: torch.Tensor, gamma: float, lam: float
        ) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized advantage estimation. Returns (advantages [T, B], value targets [T, B])."""
    not_done = 1.0 - dones.to(rewards.dtype)
    deltas = rewards + gamma * not_done * values[1:] - values[:-1]
    advantages = discounted_cumsum(deltas, gamma * lam * not_done)
    return advantages, advantages + values[:-1]


def vtrace(rewards: torch.Tensor, values: torch.Tensor, dones: torch.Tensor, log_ratio: torch.Tensor,
           gamma: float, lam: float, rho_bar: float, c_bar: float) -> tuple[torch.Tensor, torch.Tensor]:
    """V-trace (Espeholt et al. 2018). log_ratio = log π(a|x) − log μ(a|x) for the taken actions.

    Returns (policy-gradient advantages [T, B], value targets v_s [T, B]).
    """
    ratio = log_ratio.exp()
    rho = ratio.clamp(max=rho_bar)
    c = lam * ratio.clamp(max=c_bar)
    not_done = 1.0 - dones.to(rewards.dtype)
    deltas = rho * (rewards + gamma * not_done * values[1:] - values[:-1])
    vs = values[:-1] + discounted_cumsum(deltas, gamma * not_done * c)
    vs_next = torch.cat([vs[1:], values[-1:]], dim=0)
    advantages = rho * (rewards + gamma * not_done * vs_next - values[:-1])
    return advantages, vs
