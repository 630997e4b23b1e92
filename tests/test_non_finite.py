"""A non-finite gradient never reaches the weights (algo/non_finite.py): checked on the host at each step, or
on the device and read once per dataset, as a GPU learner does; both leave the same weights and the same error."""

from __future__ import annotations

import copy

import pytest
import torch

from sf_core.algo.adam import FusedAdam
from sf_core.algo.graph import Context, ModelSlot
from sf_core.algo.nodes import _ppo_policy_loss, _sgd_step, step_guard
from sf_core.algo.non_finite import StepGuard
from tests.test_sgd_step import step_context

STEPS = 5


def minibatches(poisoned_step: int | None) -> list[dict[str, torch.Tensor]]:
    _, _, template = step_context()
    gen = torch.Generator().manual_seed(1)
    made = []
    for k in range(STEPS):
        mb = {key: value.clone() for key, value in template.items()}
        mb["obs"] = torch.randn(mb["obs"].shape, generator=gen)
        mb["advantages"] = torch.randn(mb["advantages"].shape, generator=gen)
        if k == poisoned_step:
            mb["targets"][0, 5] = float("nan")
        made.append(mb)
    return made


def train(on_device: bool, poisoned_step: int | None) -> tuple[torch.nn.Module, FusedAdam, str | None, int]:
    """STEPS steps as one dataset; the model, its optimizer, the error (if any) and the steps run before it."""
    ctx, model, _ = step_context()
    optimizer = FusedAdam(list(model.parameters()), lr=1e-2)
    ctx = Context({"actor_critic": ModelSlot(model, optimizer)}, ctx.params, finite_check_on_device=on_device)
    guard = step_guard(ctx, ctx.models["actor_critic"])
    assert guard.on_device is on_device
    ran = 0
    try:
        for mb in minibatches(poisoned_step):
            _sgd_step(ctx, dict(mb), _ppo_policy_loss, guard)
            ran += 1
        guard.finish()
    except FloatingPointError as exc:
        return model, optimizer, str(exc), ran
    return model, optimizer, None, ran


def same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))


def test_finite_steps_train_the_same_with_the_check_on_the_host_or_on_the_device():
    host, _, error, _ = train(on_device=False, poisoned_step=None)
    device, _, device_error, _ = train(on_device=True, poisoned_step=None)
    assert error is None and device_error is None
    assert same_weights(host, device)
    assert not same_weights(host, step_context()[1])  # they trained


@pytest.mark.parametrize("poisoned_step", [0, 2])
def test_a_non_finite_step_stops_the_dataset_with_the_weights_of_the_steps_before_it(poisoned_step):
    host, host_adam, host_error, host_ran = train(on_device=False, poisoned_step=poisoned_step)
    device, device_adam, device_error, device_ran = train(on_device=True, poisoned_step=poisoned_step)
    assert host_ran == poisoned_step  # on the host: raised at the step itself
    assert device_ran == STEPS  # on the device: every step queued, the error when the dataset is read
    assert host_error is not None and host_error == device_error  # the same step's loss terms, named
    assert "value loss nan" in device_error and "no optimizer step taken" in device_error
    assert same_weights(host, device)  # no step from the poisoned one on moved the weights
    unchanged = step_context()[1]
    assert same_weights(device, unchanged) == (poisoned_step == 0)
    # Adam's moments and step counts skipped those steps too: training goes on as if they never came
    for p_host, p_device in zip(host.parameters(), device.parameters()):
        if poisoned_step:
            h, d = host_adam.state[p_host], device_adam.state[p_device]
            assert float(d["step"]) == poisoned_step
            assert all(torch.equal(h[key], d[key]) for key in ("step", "exp_avg", "exp_avg_sq"))
        else:
            assert float(device_adam.state[p_device]["step"]) == 0


def test_the_check_on_the_device_needs_the_fused_adam():
    _, model, _ = step_context()
    with pytest.raises(ValueError, match="needs the fused Adam"):
        StepGuard(torch.optim.Adam(model.parameters()), torch.device("cpu"), on_device=True)
    # where it is not named, a CPU model checks on the host (a read there costs nothing) and CUDA on the device
    assert not StepGuard(FusedAdam(list(model.parameters())), torch.device("cpu")).on_device
    assert StepGuard(FusedAdam(list(model.parameters())), torch.device("cuda")).on_device
    assert not StepGuard(torch.optim.Adam(model.parameters()), torch.device("cuda")).on_device


def test_a_step_on_its_own_checks_at_once():
    ctx, model, mb = step_context()
    optimizer = FusedAdam(list(model.parameters()))
    ctx = Context({"actor_critic": ModelSlot(model, optimizer)}, ctx.params, finite_check_on_device=True)
    mb["advantages"][0, 0] = float("inf")
    before = copy.deepcopy(model)
    with pytest.raises(FloatingPointError, match="non-finite loss or gradients"):
        _sgd_step(ctx, mb, _ppo_policy_loss)
    assert same_weights(model, before)
