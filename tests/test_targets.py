"""GAE and V-trace against straightforward per-step reference loops."""

import torch

from sf_core.algo.targets import discounted_cumsum, gae, vtrace


def reference_discounted_cumsum(x, c):
    y = torch.zeros_like(x)
    acc = torch.zeros(x.shape[1], dtype=x.dtype)
    for t in reversed(range(x.shape[0])):
        acc = x[t] + c[t] * acc
        y[t] = acc
    return y


def reference_gae(r, v, d, gamma, lam):
    adv = torch.zeros_like(r)
    last = torch.zeros(r.shape[1], dtype=r.dtype)
    for t in reversed(range(r.shape[0])):
        nd = 1.0 - d[t]
        delta = r[t] + gamma * nd * v[t + 1] - v[t]
        last = delta + gamma * lam * nd * last
        adv[t] = last
    return adv, adv + v[:-1]


def reference_vtrace(r, v, d, log_rho, gamma, lam, rho_bar, c_bar):
    ratio = log_rho.exp()
    T = r.shape[0]
    vs = torch.zeros_like(r)
    acc = torch.zeros(r.shape[1], dtype=r.dtype)
    for t in reversed(range(T)):
        nd = 1.0 - d[t]
        delta = ratio[t].clamp(max=rho_bar) * (r[t] + gamma * nd * v[t + 1] - v[t])
        acc = delta + gamma * nd * lam * ratio[t].clamp(max=c_bar) * acc
        vs[t] = v[t] + acc
    vs_next = torch.cat([vs[1:], v[-1:]])
    adv = ratio.clamp(max=rho_bar) * (r + gamma * (1.0 - d) * vs_next - v[:-1])
    return adv, vs


def random_batch(T=17, B=9, seed=0):
    g = torch.Generator().manual_seed(seed)
    r = torch.randn(T, B, generator=g, dtype=torch.float64)
    v = torch.randn(T + 1, B, generator=g, dtype=torch.float64)
    d = (torch.rand(T, B, generator=g) < 0.15).double()
    log_rho = 0.5 * torch.randn(T, B, generator=g, dtype=torch.float64)
    return r, v, d, log_rho


def test_discounted_cumsum_matches_loop_with_zero_discounts():
    r, _, d, _ = random_batch()
    c = 0.9 * (1 - d) * torch.rand_like(r)
    torch.testing.assert_close(discounted_cumsum(r, c), reference_discounted_cumsum(r, c))


def test_discounted_cumsum_matches_the_unrolled_sum():
    """Against the closed form y_t = sum over s >= t of (c_t ... c_{s-1}) x_s, term by term."""
    r, _, d, _ = random_batch(T=9, B=4, seed=3)
    c = 0.95 * (1 - d)
    T, B = r.shape
    expected = torch.zeros_like(r)
    for t in range(T):
        for s in range(t, T):
            expected[t] += torch.prod(c[t:s], dim=0) * r[s]  # an empty product is 1
    torch.testing.assert_close(discounted_cumsum(r, c), expected)


def test_gae_matches_loop():
    r, v, d, _ = random_batch(seed=1)
    adv, ret = gae(r, v, d, 0.99, 0.95)
    ref_adv, ref_ret = reference_gae(r, v, d, 0.99, 0.95)
    torch.testing.assert_close(adv, ref_adv)
    torch.testing.assert_close(ret, ref_ret)


def test_vtrace_matches_loop():
    r, v, d, log_rho = random_batch(seed=2)
    adv, vs = vtrace(r, v, d, log_rho, 0.99, 1.0, 1.0, 1.0)
    ref_adv, ref_vs = reference_vtrace(r, v, d, log_rho, 0.99, 1.0, 1.0, 1.0)
    torch.testing.assert_close(vs, ref_vs)
    torch.testing.assert_close(adv, ref_adv)


def test_vtrace_on_policy_equals_lambda_returns():
    """With π = μ and no clipping active, V-trace targets are the GAE(λ) returns."""
    r, v, d, _ = random_batch(seed=3)
    _, vs = vtrace(r, v, d, torch.zeros_like(r), 0.97, 0.9, 1.0, 1.0)
    _, ret = gae(r, v, d, 0.97, 0.9)
    torch.testing.assert_close(vs, ret)


def test_float32_long_rollouts_stay_accurate():
    r, v, d, _ = random_batch(T=128, B=4, seed=4)
    adv, _ = gae(r.float(), v.float(), d.float(), 0.999, 0.99)
    ref_adv, _ = reference_gae(r, v, d, 0.999, 0.99)
    torch.testing.assert_close(adv.double(), ref_adv, atol=1e-4, rtol=1e-4)
