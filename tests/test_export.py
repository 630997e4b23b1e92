"""`python -m sf_core.export`: the exported policy (ONNX in onnxruntime, TorchScript in torch.jit) acts as
the framework does: deterministic actions equal `model.distribution(params).mode()` on 1,000 recorded
observations, for an MLP, an Atari CNN and a recurrent policy (state fed back step by step)."""

import json
import os

import numpy as np
import pytest
import torch

from tests import launch
from tests.conftest import extra
from tests.policies import packed, random_policy_experiment

ort = extra("onnxruntime", "export")

SMALL = {"encoder_mlp_layers": [64, 64]}


def export(train_dir, name: str, fmt: str = "onnx") -> tuple[str, dict]:
    result = launch.run([f"--train_dir={train_dir}", f"--experiment={name}", f"--format={fmt}"], timeout=240,
                        module="sf_core.export")
    assert result.returncode == 0, result.stderr[-3000:]
    folder = os.path.join(str(train_dir), name, "export")
    with open(os.path.join(folder, "policy.json")) as f:
        return os.path.join(folder, "policy.onnx" if fmt == "onnx" else "policy.pt"), json.load(f)


@torch.no_grad()
def framework_actions(model, space, observations, starts) -> tuple[np.ndarray, np.ndarray]:
    """Deterministic actions and values as sf_core.enjoy computes them, state carried through episodes."""
    rows = packed(space, observations)
    if not model.recurrent:
        params, values, _ = model.step(rows, model.initial_state(len(rows)))
        return model.distribution(params).mode().numpy(), model.denormalize_value(values).numpy()
    actions, values, state = [], [], model.initial_state(1)
    for row, start in zip(rows, starts):
        if start:
            state = model.initial_state(1)
        params, value, state = model.step(row[None], state)
        actions.append(model.distribution(params).mode()[0].numpy())
        values.append(model.denormalize_value(value)[0].numpy())
    return np.stack(actions), np.stack(values)


def onnx_actions(path: str, observations, starts, state_size: int) -> tuple[np.ndarray, np.ndarray]:
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    obs = np.stack([np.asarray(o) for o in observations])
    obs = obs if obs.dtype == np.uint8 else obs.astype(np.float32)
    if not state_size:
        action, _, value = session.run(["action", "action_params", "value"], {"obs": obs})
        return action, value
    actions, values, state = [], [], np.zeros((1, state_size), np.float32)
    for row, start in zip(obs, starts):
        if start:
            state = np.zeros_like(state)
        action, value, state = session.run(["action", "value", "rnn_state_out"], {"obs": row[None], "rnn_state": state})
        actions.append(action[0])
        values.append(value[0])
    return np.stack(actions), np.stack(values)


CASES = {
    "mlp": ("CartPole-v1", SMALL),
    "cnn": ("atari_pong", {"env_frameskip": 4}),
    "lstm": ("CartPole-v1", {**SMALL, "use_rnn": True, "rnn_type": "lstm", "rnn_size": 32}),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_onnx_actions_match_the_framework_on_1000_recorded_observations(tmp_path, case):
    env, flags = CASES[case]
    path, model, observations, starts = random_policy_experiment(tmp_path, case, env, **flags)
    onnx_path, description = export(tmp_path, case)
    assert [i["name"] for i in description["inputs"]] == (["obs", "rnn_state"] if model.recurrent else ["obs"])
    assert description["rnn_state_size"] == model.rnn_state_size and description["policy_version"] == 7
    space = model.preprocess.fields[0].space
    expected, expected_values = framework_actions(model, space, observations, starts)
    actions, values = onnx_actions(onnx_path, observations, starts, model.rnn_state_size)
    assert len(actions) == 1000 and starts[1:].any()  # episodes ended inside the recording
    assert len(np.unique(expected)) > 1, "a policy that always takes one action would prove little"
    np.testing.assert_array_equal(actions, expected)
    # values in reward units: the return normalization travelled with the weights
    np.testing.assert_allclose(values, expected_values, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["onnx", "torchscript"])
def test_an_export_says_only_what_it_wrote(tmp_path, fmt):
    """No exporter note that reads as a bug (a module in training mode, torchvision's operators, torch's own
    deprecations): one line, the file written."""
    random_policy_experiment(tmp_path, "quiet", "CartPole-v1", steps=10, **SMALL)
    result = launch.run([f"--train_dir={tmp_path}", "--experiment=quiet", f"--format={fmt}"], timeout=240,
                        module="sf_core.export")
    assert result.returncode == 0, result.stderr[-3000:]
    said = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    assert len(said) == 1 and "INFO exported" in said[0], said


def test_torchscript_export_matches_and_normalizes_inside(tmp_path):
    path, model, observations, starts = random_policy_experiment(tmp_path, "ts", "Pendulum-v1", **SMALL)
    ts_path, description = export(tmp_path, "ts", fmt="torchscript")
    assert description["format"] == "torchscript" and description["outputs"] == ["action", "action_params", "value"]
    loaded = torch.jit.load(ts_path)
    obs = torch.as_tensor(np.stack(observations), dtype=torch.float32)
    with torch.no_grad():
        actions = loaded(obs)[0]
    expected, _ = framework_actions(model, model.preprocess.fields[0].space, observations, starts)
    np.testing.assert_allclose(actions.numpy(), expected, rtol=1e-5, atol=1e-5)
    # raw observations went in and the actions match: the fitted normalizer (far from mean 0, std 1) is inside
    norm = model.preprocess.norms["obs"]
    assert norm.mean.abs().max() > 0.1 or (norm.var - 1).abs().max() > 0.1
