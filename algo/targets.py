"""Learning targets: GAE and V-trace.

Both are a discounted sum with a per-step discount, y_t = x_t + c_t · y_{t+1}, computed by one
backward pass over time, vectorised over the batch. (An earlier version had no loop over time: it
weighted x by a masked [T, T, B] matrix of discount products, O(T²) work and much slower for long
rollouts: docs/performance.md.)
All tensors are time-major: [T, B] (values carry T+1 rows, the last one being the bootstrap value
after the final step).
"""

from __future__ import annotations

import torch


def discounted_cumsum(x: torch.Tensor, discounts: torch.Tensor) -> torch.Tensor:
    """y_t = x_t + discounts_t · y_{t+1} with y_T = 0, for x and discounts of shape [T, B]."""
    # one op per step: the rows are split and stacked once, not indexed and written per step (on a GPU each
    # op is a kernel launch)
    xs, ds = x.unbind(0), discounts.unbind(0)
    running, ys = xs[-1], [xs[-1]]
    for t in range(x.shape[0] - 2, -1, -1):
        running = torch.addcmul(xs[t], ds[t], running)
        ys.append(running)
    return torch.stack(ys[::-1])


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
