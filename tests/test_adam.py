"""The learner's Adam: torch's fused Adam's updates and state layout, without importing torch._dynamo."""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import torch

from sf_core.algo.adam import FusedAdam, make_adam
from tests.conftest import REPO


def _models():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    return model, copy.deepcopy(model)


def _train(model, optimizer, steps: int, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        model(torch.randn(32, 8, generator=gen)).pow(2).mean().backward()
        optimizer.step()


def _same(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))


def test_the_same_updates_as_torchs_fused_adam_with_the_learners_hyperparameters():
    ours_model, torch_model = _models()
    ours, theirs = FusedAdam(list(ours_model.parameters())), torch.optim.Adam(torch_model.parameters(), fused=True)
    for group in ours.param_groups + theirs.param_groups:  # as the learner's apply_hyperparams sets them
        group.update(lr=3e-4, eps=1e-6, betas=(0.9, 0.99))
    _train(ours_model, ours, 5, seed=1)
    _train(torch_model, theirs, 5, seed=1)
    assert _same(ours_model, torch_model)
    assert not _same(ours_model, _models()[0])  # they did move


@pytest.mark.parametrize("direction", ["torch_to_ours", "ours_to_torch"])
def test_a_checkpoints_optimizer_state_loads_in_either_and_training_goes_on_identically(direction):
    a, b = _models()
    first = torch.optim.Adam(a.parameters(), fused=True) if direction == "torch_to_ours" else FusedAdam(
        list(a.parameters()))
    first.param_groups[0]["lr"] = 5e-3
    _train(a, first, 3, seed=2)
    b.load_state_dict(a.state_dict())
    second = FusedAdam(list(b.parameters())) if direction == "torch_to_ours" else torch.optim.Adam(
        b.parameters(), fused=True)
    second.load_state_dict(copy.deepcopy(first.state_dict()))
    assert second.param_groups[0]["lr"] == 5e-3
    _train(a, first, 3, seed=3)
    _train(b, second, 3, seed=3)
    assert _same(a, b)


def test_a_state_for_another_model_is_one_clear_error():
    a, _ = _models()
    other = torch.nn.Linear(2, 2)
    optimizer = torch.optim.Adam(other.parameters(), fused=True)
    with pytest.raises(ValueError, match="optimizer state is for 2 parameters in 1 groups; this model has 4"):
        FusedAdam(list(a.parameters())).load_state_dict(optimizer.state_dict())


@pytest.mark.slow  # starts a process
def test_the_learners_optimizer_steps_without_importing_torch_dynamo():
    """torch.optim's first call imports torch._dynamo (seconds of CPU): the learner's first SGD step waited."""
    code = ("import sys, torch\n"
            "from sf_core.algo.adam import make_adam\n"
            "model = torch.nn.Linear(4, 2)\n"
            "optimizer = make_adam(model.parameters(), 'cpu')\n"
            "model(torch.randn(3, 4)).sum().backward()\n"
            "torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)\n"
            "optimizer.step(); optimizer.zero_grad(); optimizer.load_state_dict(optimizer.state_dict())\n"
            "print(type(optimizer).__name__, 'torch._dynamo' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["FusedAdam", "False"]


def test_devices_without_the_fused_kernel_get_torchs_adam():
    assert isinstance(make_adam(torch.nn.Linear(2, 2).parameters(), "meta"), torch.optim.Adam)
