"""Dict/Tuple observations (packed into one byte row per step) and custom model parts."""

import gymnasium as gym
import numpy as np
import pytest
import torch

from sf_core.algo.custom_models import register_core, register_encoder
from sf_core.algo.model import ActorCritic, ModelSpec
from sf_core.algo.observations import ObsWriter, PackedObs, obs_storage
from sf_core import register_env
from tests.helpers import train

NESTED = gym.spaces.Dict({
    "image": gym.spaces.Box(0, 255, (3, 36, 36), np.uint8),
    "state": gym.spaces.Dict({"position": gym.spaces.Box(-1, 1, (2,), np.float64),
                              "flags": gym.spaces.MultiBinary(3)}),
    "mode": gym.spaces.Discrete(3, start=1),
    "pair": gym.spaces.Tuple((gym.spaces.Box(-5, 5, (1,), np.float32), gym.spaces.Discrete(2))),
})


def test_nested_observations_pack_and_unpack_losslessly():
    packed = PackedObs(NESTED)
    keys = [f.key for f in packed.fields]
    assert sorted(keys) == ["image", "mode", "pair/0", "pair/1", "state/flags", "state/position"]
    assert all(f.offset % 8 == 0 for f in packed.fields)  # dtype views need aligned fields
    assert obs_storage(NESTED) == ((packed.nbytes,), torch.uint8)
    NESTED.seed(0)
    samples = [NESTED.sample() for _ in range(4)]
    rows = np.zeros((4, packed.nbytes), dtype=np.uint8)
    writer = ObsWriter(NESTED)
    for i, obs in enumerate(samples):
        writer.write(obs, rows[i])
    assert writer.is_finite(rows)
    fields = packed.unpack(torch.from_numpy(rows))
    for i, obs in enumerate(samples):
        assert torch.equal(fields["image"][i], torch.from_numpy(obs["image"]))
        np.testing.assert_allclose(fields["state/position"][i].numpy(), obs["state"]["position"].astype(np.float32))
        assert fields["mode"][i].item() == obs["mode"] and fields["pair/1"][i].item() == obs["pair"][1]
    position = next(f for f in packed.fields if f.key == "state/position")
    rows[1, position.offset:position.offset + 4] = np.frombuffer(np.float32(np.nan).tobytes(), np.uint8)
    assert not writer.is_finite(rows)  # NaN in a float field is caught like in a Box observation


def test_model_encodes_every_field():
    model = ActorCritic(NESTED, gym.spaces.Discrete(4), ModelSpec(encoder_mlp_layers=(16,),
                                                                 encoder_conv_mlp_layers=(32,)))
    widths = model.preprocess.widths()
    assert widths == {"image": (3, 36, 36), "state/position": 2, "state/flags": 3, "mode": 3, "pair/0": 1, "pair/1": 2}
    assert model.actor.encoder.out_features == 32 + 16
    rows = np.zeros((5, PackedObs(NESTED).nbytes), dtype=np.uint8)
    writer = ObsWriter(NESTED)
    for i in range(5):
        writer.write(NESTED.sample(), rows[i])
    model.update_obs_stats(torch.from_numpy(rows))  # running statistics for the float vector fields only
    assert set(model.preprocess.norms.keys()) == {"state__position", "state__flags", "pair__0"}
    params, values = model(torch.from_numpy(rows))
    assert params.shape == (5, 4) and values.shape == (5,)
    (params.sum() + values.sum()).backward()
    assert all(p.grad is not None for p in model.actor.encoder.parameters())


class TwoFieldDictEnv(gym.Env):
    """One-step episodes: the answer is 2 × (bright half left?) + (vector positive?), one of 4 actions.
    Either field alone gets at most 0.5; chance is 0.25."""

    def __init__(self):
        self.observation_space = gym.spaces.Dict({
            "image": gym.spaces.Box(0, 255, (1, 36, 36), np.uint8),
            "vector": gym.spaces.Box(-1, 1, (1,), np.float32),
        })
        self.action_space = gym.spaces.Discrete(4)
        self.answer = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        left, positive = self.np_random.integers(2, size=2)
        image = np.zeros((1, 36, 36), dtype=np.uint8)
        image[0, :, :18] = 255 if left else 0
        image[0, :, 18:] = 0 if left else 255
        self.answer = 2 * int(left) + int(positive)
        return {"image": image, "vector": np.array([1.0 if positive else -1.0], np.float32)}, {}

    def step(self, action):
        reward = float(int(action) == self.answer)
        obs, _ = self.reset()
        return obs, reward, True, False, {}


def make_two_field_env(name, cfg, ctx):
    return TwoFieldDictEnv()


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_dict_observation_env_trains_end_to_end(tmp_path):
    register_env("TwoFieldDict-v0", make_two_field_env)
    code, summary = train(tmp_path, "--env=TwoFieldDict-v0", "--num_workers=2", "--num_envs_per_worker=8",
                          "--rollout=8", "--batch_size=256", "--encoder_conv_mlp_layers", "32",
                          "--encoder_mlp_layers", "16", "--decoder_mlp_layers", "32", "--num_epochs=2",
                          "--ppo_clip_ratio=0.2", "--learning_rate=1e-3", "--target_mean_return=0.8",
                          "--train_for_env_steps=200000", "--train_for_seconds=100", "--seed=1")
    assert code == 0, summary.get("error")
    assert summary["time_to_target"] is not None, summary
    assert summary["mean_return_at_target"] >= 0.8, summary  # chance is 0.25, one field alone 0.5


class TinyEncoder(torch.nn.Module):
    """A user's encoder: receives the (normalized) observation tensor of a Box space."""

    def __init__(self, obs_space, spec):
        super().__init__()
        self.user_layers = torch.nn.Sequential(torch.nn.Linear(obs_space.shape[0], 24), torch.nn.Tanh())
        self.out_features = 24

    def forward(self, obs):
        return self.user_layers(obs)


class ResidualGru(torch.nn.Module):
    """A user's core: a GRU cell whose output adds its input back."""

    def __init__(self, input_size, spec):
        super().__init__()
        self.cell = torch.nn.GRUCell(input_size, input_size)
        self.out_features = self.state_size = input_size

    def forward(self, x, state):
        h = self.cell(x, state)
        return x + h, h


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_custom_encoder_and_core_train_in_spawned_processes(tmp_path):
    register_encoder("tiny", TinyEncoder)
    register_core("residual_gru", ResidualGru)
    code, summary = train(tmp_path, "--env=CartPole-v1", "--encoder_custom=tiny", "--core_custom=residual_gru",
                          "--num_workers=2", "--mp_start_method=spawn", "--rollout=16", "--batch_size=512",
                          "--target_mean_return=150", "--train_for_env_steps=400000", "--train_for_seconds=100")
    assert code == 0, summary.get("error")
    assert summary["time_to_target"] is not None, summary
    assert summary["mean_return_at_target"] >= 150, summary  # random play: about 22
    state = torch.load(summary["last_checkpoint"], weights_only=True)["model"]
    assert "actor.encoder.user_layers.0.weight" in state and "actor.core.cell.weight_hh" in state
