"""Real learning runs: CartPole solved serially, asynchronously and with non-batched sampling, a user's
env, Pendulum-style Box. (Multi-agent learning: tests/test_multi_agent.py.)"""

import json
import os
import textwrap

import numpy as np
import pytest

from tests import launch
from tests.helpers import read_summary, train

pytestmark = pytest.mark.slow  # every test here trains or runs a script

SOLVED = 475.0


def solve_cartpole(tmp_path, *flags: str) -> dict:
    """Train CartPole until the 100-episode mean reaches 475 (150 s budget); returns the summary."""
    code, summary = train(tmp_path, "--env=CartPole-v1", f"--target_mean_return={SOLVED}",
                          "--train_for_seconds=150", "--train_for_env_steps=10000000", *flags)
    assert code == 0, summary.get("error")
    assert summary["time_to_target"] is not None, f"not solved with {flags}: {summary}"
    # (the closing mean may dip under the target by episodes that end during the shutdown)
    assert summary["mean_return_at_target"] >= SOLVED
    return summary


@pytest.mark.timeout(240)
def test_cartpole_solved_serial_then_enjoy_with_video(tmp_path, capsys):
    summary = solve_cartpole(tmp_path, "--serial_mode=True", "--seed=1")
    assert summary["last_checkpoint"] and os.path.exists(summary["last_checkpoint"])

    # the saved policy, evaluated on its own, is as good as training said
    import imageio.v2 as imageio

    import sf_core.enjoy

    code = sf_core.enjoy.main([f"--train_dir={tmp_path}", "--experiment=exp", "--max_num_episodes=5",
                               "--eval_deterministic=True", "--save_video=True", "--video_frames=120"])
    assert code == 0
    with open(tmp_path / "exp" / "eval_results.json") as f:
        results = json.load(f)
    assert results["episodes"] == 5 and len(results["returns"]) == 5
    assert results["mean_return"] >= SOLVED, results
    reader = imageio.get_reader(str(tmp_path / "exp" / "replay.mp4"))
    try:
        assert reader.count_frames() == 120
        assert reader.get_data(0).shape == (400, 600, 3)  # CartPole's rgb_array frames
    finally:
        reader.close()

    # --device as training reads it: a device it cannot name is one line; a GPU where there is none, the CPU
    import torch

    played = [f"--train_dir={tmp_path}", "--experiment=exp", "--max_num_episodes=1"]
    capsys.readouterr()
    assert sf_core.enjoy.main([*played, "--device=mps"]) == 2
    assert capsys.readouterr().err.strip() == ("sf_core.enjoy: error: --device=mps: use cpu, cuda, cuda:N (the Nth "
                                               "GPU) or gpu (the same as cuda)")
    if not torch.cuda.is_available():
        assert sf_core.enjoy.main([*played, "--device=gpu"]) == 0


@pytest.mark.timeout(180)
def test_cartpole_solved_async(tmp_path):
    summary = solve_cartpole(tmp_path, "--num_workers=2", "--policy_workers_per_policy=2", "--seed=2")
    # the learner's weights kept reaching both inference workers: at its last report (each second) each acted
    # with a version past half the final one
    versions = summary["inference_versions"]
    assert sorted(versions) == ["inference_worker_0", "inference_worker_1"], versions
    assert all(v > summary["policy_version"] // 2 > 0 for v in versions.values()), (versions, summary["policy_version"])
    # the SGD steps' statistics, averaged over the last dataset's steps: a two-action policy's entropy, a gradient
    stats = summary["final_learner_stats"]
    assert 0 < stats["entropy"] < np.log(2) + 1e-6 and stats["grad_norm"] > 0 and 0 <= stats["clip_fraction"] <= 1


@pytest.mark.timeout(180)
def test_cartpole_solved_non_batched(tmp_path):
    """--batched_sampling=False: each env stepped on its own, through the multi-agent runner (one agent)."""
    solve_cartpole(tmp_path, "--batched_sampling=False", "--num_workers=2", "--seed=3")


USER_SCRIPT = textwrap.dedent('''
    """A user's script: its own env class, registered from Python, trained with 2 worker processes."""
    import sys

    import gymnasium as gym
    import numpy as np

    import sf_core.train
    from sf_core import register_env


    class Corridor(gym.Env):
        """Walk right to the end of a corridor; each step costs a little, the goal pays 1."""

        def __init__(self, length=8):
            self.length = length
            self.observation_space = gym.spaces.Box(0.0, 1.0, (length,), np.float32)
            self.action_space = gym.spaces.Discrete(2)

        def _obs(self):
            obs = np.zeros(self.length, np.float32)
            obs[self.pos] = 1.0
            return obs

        def reset(self, seed=None, options=None):
            super().reset(seed=seed)
            self.pos, self.steps = 0, 0
            return self._obs(), {}

        def step(self, action):
            self.pos = min(self.length - 1, max(0, self.pos + (1 if action == 1 else -1)))
            self.steps += 1
            at_goal = self.pos == self.length - 1
            reward = 1.0 if at_goal else -0.01
            return self._obs(), reward, at_goal, self.steps >= 50, {}


    def make_corridor(name, cfg, ctx):
        return Corridor()


    if __name__ == "__main__":
        register_env("Corridor-v0", make_corridor)
        sys.exit(sf_core.train.main(["--env=Corridor-v0", "--num_workers=2"] + sys.argv[1:]))
''')


@pytest.mark.timeout(150)
@pytest.mark.parametrize("start_method", ["forkserver", "fork"])
def test_user_registered_env_learns_async_two_workers(tmp_path, start_method):
    """Under forkserver (auto's choice with a GPU) and spawn (tests/test_user_code.py), workers import the user's
    script afresh: the registration must reach them."""
    script = tmp_path / "my_training.py"
    script.write_text(USER_SCRIPT)
    # optimal return is 1 - 6 * 0.01 = 0.94; a random walk rarely reaches the goal within 50 steps
    result = launch.run([f"--train_dir={tmp_path}", "--experiment=corridor", "--num_envs_per_worker=8",
                      "--rollout=16", "--batch_size=512", "--encoder_mlp_layers", "64",
                      "--learning_rate=0.001", "--target_mean_return=0.9", "--train_for_seconds=100", "--seed=3",
                      f"--mp_start_method={start_method}"],
                     timeout=130, script=str(script), cwd=str(tmp_path))
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    summary = read_summary(tmp_path, "corridor")
    assert summary["time_to_target"] is not None, f"not learned: {summary}"
    assert os.path.exists(tmp_path / "corridor" / "config.json")


@pytest.mark.timeout(120)
def test_truncation_bootstraps_from_final_value(tmp_path):
    """Reward 1 every step, cut by a time limit after 20 steps, with nothing in the observation
    that tells the time: the true value of every state is 1/(1-γ) = 10 for γ = 0.9."""
    import gymnasium as gym
    import numpy as np

    from sf_core import register_env

    class Constant(gym.Env):
        observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        action_space = gym.spaces.Discrete(2)

        def reset(self, seed=None, options=None):
            self.t = 0
            return np.zeros(1, np.float32), {}

        def step(self, action):
            self.t += 1
            return np.zeros(1, np.float32), 1.0, False, self.t >= 20, {}

    register_env("ConstantTruncated-v0", lambda name, cfg, ctx: Constant())
    code, summary = train(tmp_path, "--env=ConstantTruncated-v0", "--serial_mode=True", "--gamma=0.9",
                          "--num_workers=1", "--num_envs_per_worker=16", "--rollout=16", "--batch_size=256",
                          "--learning_rate=0.001", "--train_for_env_steps=60000", "--seed=4")
    assert code == 0
    # Treating the time limit as termination would average (1-0.9^k)/0.1 over k = 1..20, about 6.1.
    assert summary["final_learner_stats"]["value_mean"] > 9.0, summary["final_learner_stats"]


@pytest.mark.timeout(200)
@pytest.mark.parametrize("algo", ["PPO", "REINFORCE"])
def test_other_algorithms_solve_cartpole(tmp_path, algo):
    solve_cartpole(tmp_path, f"--algo={algo}", "--num_workers=2", "--seed=1")
