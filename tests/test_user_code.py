"""User code registered from Python (env factories, model parts, algorithms) reaches worker processes
whatever it is: a module-level function, a lambda, a closure, or a function of a notebook."""

import json
import pickle
import textwrap
import threading

import gymnasium as gym
import pytest

from sf_core.algo import custom_models
from sf_core.algo.algorithms import appo
from sf_core.algo.registry import algorithm_builder, register_algorithm
from sf_core.envs.registry import EnvContext, EnvRegistry
from sf_core.common.user_code import UnsendableError, UserCode, user_code
from sf_core.config import Config
from sf_core.machine.wiring import check_user_code
from tests import launch
from tests.helpers import read_summary


def _closure(steps):
    def factory(name, cfg, ctx):
        return gym.make("CartPole-v1", max_episode_steps=steps)

    return factory


@pytest.mark.parametrize("kind", ["lambda", "closure"])
def test_a_lambda_or_closure_factory_survives_a_trip_through_pickle(kind):
    factory = (lambda name, cfg, ctx: gym.make("CartPole-v1", max_episode_steps=7)) if kind == "lambda" else _closure(7)
    with pytest.raises(Exception):
        pickle.dumps(factory)  # what a spawned worker used to be refused
    registry = EnvRegistry({"Short-v0": factory})
    registry.check_picklable()
    arrived = pickle.loads(pickle.dumps(registry))  # as multiprocessing sends a component under spawn
    env = arrived.make("Short-v0", Config(), EnvContext(0, 0, 1))
    try:
        env.reset(seed=1)
        steps = 1
        while not any(env.step(0)[2:4]):
            steps += 1
        assert steps <= 7  # the closure's captured value arrived with it
    finally:
        env.close()


def test_a_module_level_function_still_travels_by_reference():
    wrapped = user_code(appo, "the algorithm")
    assert b"appo" in wrapped.payload() and len(wrapped.payload()) < 200  # a name, not the code
    assert pickle.loads(pickle.dumps(wrapped)).fn is appo
    assert user_code(wrapped, "again") is wrapped  # a registry copying another does not wrap twice


def test_what_cannot_travel_even_by_value_is_named():
    lock = threading.Lock()
    registry = EnvRegistry({"Locked-v0": lambda name, cfg, ctx: lock and gym.make("CartPole-v1")})
    with pytest.raises(UnsendableError, match="factory registered for env 'Locked-v0' cannot be sent") as info:
        registry.check_picklable()
    assert "lock" in str(info.value)


def test_registered_model_parts_and_algorithms_are_checked_before_any_process_starts(monkeypatch):
    from sf_core.algo import registry

    # registrations of this test only
    monkeypatch.setattr(registry, "_ALGORITHMS", dict(registry._ALGORITHMS))
    monkeypatch.setattr(custom_models, "_FACTORIES", {kind: {} for kind in custom_models.KINDS})
    lock = threading.Lock()
    custom_models.register_encoder("test_locked_encoder", lambda obs_space, spec: lock)
    register_algorithm("TEST_LAMBDA_ALGO", lambda params: appo(params))
    assert isinstance(custom_models.resolve("encoder", "test_locked_encoder"), UserCode)
    builder = pickle.loads(pickle.dumps(algorithm_builder("TEST_LAMBDA_ALGO")))
    assert builder.what == "the algorithm registered as 'TEST_LAMBDA_ALGO'"
    check_user_code(Config(env="CartPole-v1", algo="TEST_LAMBDA_ALGO"), EnvRegistry())
    with pytest.raises(UnsendableError, match="the encoder registered as 'test_locked_encoder' cannot be sent"):
        check_user_code(Config(env="CartPole-v1", encoder_custom="test_locked_encoder"), EnvRegistry())


# ------------------------------------------------------------------------------------------ learning

USER_SCRIPT = textwrap.dedent('''
    """A user's script: a CartPole factory written as a lambda or a closure, registered in the main block."""
    import sys

    import gymnasium as gym

    import sf_core.train
    from sf_core import register_env


    class Unchanged(gym.Wrapper):
        """A class of this script: under spawn it travels by value with the closure that uses it."""


    def wrapped(max_steps):
        def factory(name, cfg, ctx):
            return Unchanged(gym.make("CartPole-v1", max_episode_steps=max_steps))
        return factory


    if __name__ == "__main__":
        kind, flags = sys.argv[1], sys.argv[2:]
        if kind == "lambda":
            register_env("MyCartPole-v0", lambda name, cfg, ctx: gym.make("CartPole-v1"))
        else:
            register_env("MyCartPole-v0", wrapped(500))
        sys.exit(sf_core.train.main(["--env=MyCartPole-v0"] + flags))
''')

# the CartPole-v1 preset's values (a registered name gets no preset), and a bar CartPole passes quickly
CARTPOLE = ["--num_envs_per_worker=64", "--rollout=32", "--batch_size=1024", "--num_batches_per_epoch=2",
            "--num_epochs=2", "--learning_rate=3e-4", "--exploration_loss_coeff=0.003", "--encoder_mlp_layers",
            "64", "64", "--target_mean_return=150", "--train_for_seconds=150", "--seed=1"]
MODES = {"serial": ["--serial_mode=True", "--num_workers=1"],
         "fork": ["--num_workers=2", "--mp_start_method=fork"],
         "spawn": ["--num_workers=2", "--mp_start_method=spawn"]}


@pytest.mark.slow
@pytest.mark.timeout(240)
# spawn pickles the factory (cloudpickle, by value): both kinds there; serial and fork hand the same object on,
# whichever kind it is, so one kind each
@pytest.mark.parametrize("kind, mode", [("lambda", "spawn"), ("closure", "spawn"), ("lambda", "serial"),
                                        ("closure", "fork")])
def test_lambda_and_closure_factories_learn_cartpole(tmp_path, kind, mode):
    script = tmp_path / "my_training.py"
    script.write_text(USER_SCRIPT)
    result = launch.run([kind, f"--train_dir={tmp_path}", "--experiment=mine", *CARTPOLE, *MODES[mode]],
                        timeout=200, script=str(script), cwd=str(tmp_path))
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    summary = read_summary(tmp_path, "mine")
    assert summary["mean_return_at_target"] >= 150, summary


NOTEBOOK = textwrap.dedent('''
    import sys
    import gymnasium as gym
    import sf_core.train
    from sf_core import register_env

    def make_cartpole(name, cfg, ctx):  # "module level" of a notebook: no file a worker could import
        return gym.make("CartPole-v1")

    register_env("NotebookCartPole-v0", make_cartpole)
    sys.exit(sf_core.train.main(["--env=NotebookCartPole-v0"] + sys.argv[1:]))
''')


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_notebook_function_learns_cartpole_under_spawn(tmp_path):
    """`python -c` has no main file, like a notebook: a spawned worker cannot import its functions by
    name (plain pickle passed the check and the worker died at start)."""
    result = launch.run([f"--train_dir={tmp_path}", "--experiment=notebook", *CARTPOLE, *MODES["spawn"]],
                        timeout=200, code=NOTEBOOK, cwd=str(tmp_path))
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert read_summary(tmp_path, "notebook")["mean_return_at_target"] >= 150


MY_ENVS = '''
import gymnasium as gym
from sf_core import register_env


def make_short_cartpole(name, cfg, ctx):
    return gym.wrappers.TimeLimit(gym.make("CartPole-v1").unwrapped, max_episode_steps=50)


register_env("ShortCartPole-v0", make_short_cartpole)
'''

def train_from_a_module(tmp_path, source: str, module: str, env: str, experiment: str, flags: list[str]) -> list[str]:
    """Write `source` as `module`.py and train `env` from it with --env_module (one worker); returns the flags
    that name the experiment's folder, for the commands that follow."""
    (tmp_path / f"{module}.py").write_text(source)
    where = [f"--train_dir={tmp_path / 'runs'}", f"--experiment={experiment}"]
    trained = launch.run([f"--env={env}", f"--env_module={module}", *where, "--num_workers=1", *flags], timeout=120,
                         cwd=str(tmp_path))
    assert trained.returncode == 0, trained.stderr[-3000:]
    return where


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_one_flag_brings_a_users_env_to_every_command_line_tool(tmp_path):
    """--env_module: train a custom env from the command line (spawned workers find it too); enjoy and export
    import it again from config.json, with no flag; a module that cannot be imported is one line and exit 2."""
    where = train_from_a_module(tmp_path, MY_ENVS, "my_envs", "ShortCartPole-v0", "short",
                                ["--train_for_env_steps=3000", "--mp_start_method=spawn"])
    played = launch.run([*where, "--max_num_episodes=2"], timeout=60, module="sf_core.enjoy", cwd=str(tmp_path))
    assert played.returncode == 0, played.stderr[-3000:]
    results = json.loads((tmp_path / "runs" / "short" / "eval_results.json").read_text())
    assert max(results["returns"]) <= 50  # the module's 50-step limit: its env, not CartPole-v1's
    exported = launch.run([*where, "--format=torchscript"], timeout=120, module="sf_core.export", cwd=str(tmp_path))
    assert exported.returncode == 0, exported.stderr[-3000:]
    for module in ("sf_core.enjoy", "sf_core.export"):  # as from a script's run: config.json names no module
        unknown = launch.run([*where, "--env_module="], timeout=60, module=module, cwd=str(tmp_path))
        assert unknown.returncode == 1 and "unknown env 'ShortCartPole-v0'" in unknown.stderr, unknown.stderr[-2000:]
        assert ("the training script registered it in its own process, probably: pass --env_module=MODULE, a module "
                "that calls register_env when it is imported, at its top level, not under `if __name__ == "
                "\"__main__\":`") in unknown.stderr and "Traceback" not in unknown.stderr, unknown.stderr[-2000:]
    for module in ("sf_core.train", "sf_core.enjoy", "sf_core.export", "sf_core.env_server"):
        flags = {"sf_core.train": ["--env=ShortCartPole-v0", *where], "sf_core.env_server": ["--env=ShortCartPole-v0"]
                 }.get(module, where)
        missing = launch.run([*flags, "--env_module=not_my_envs"], timeout=60, module=module, cwd=str(tmp_path))
        assert missing.returncode == 2 and "--env_module=not_my_envs: No module named 'not_my_envs'" in \
            missing.stderr and "Traceback" not in missing.stderr, (module, missing.stderr[-2000:])


NO_RENDER_ENV = '''
import gymnasium as gym
import numpy as np
from sf_core import register_env


class Coin(gym.Env):
    """Guess a coin that always shows heads: no render()."""
    observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self.t += 1
        return np.zeros(1, np.float32), float(action == 0), False, self.t >= 10, {}


register_env("Coin-v0", lambda name, cfg, ctx: Coin())
'''


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_a_video_of_an_env_without_render_is_one_line_naming_render_mode(tmp_path):
    where = train_from_a_module(tmp_path, NO_RENDER_ENV, "coin_envs", "Coin-v0", "coin",
                                ["--train_for_env_steps=2000", "--serial_mode=True"])
    played = launch.run([*where, "--max_num_episodes=1", "--save_video"], timeout=60, module="sf_core.enjoy",
                        cwd=str(tmp_path))
    assert played.returncode == 2, played.stderr[-3000:]
    assert "Traceback" not in played.stderr and "NotImplementedError" not in played.stderr, played.stderr[-3000:]
    assert "--save_video: the env Coin-v0 cannot render" in played.stderr
    assert "render_mode='rgb_array'" in played.stderr
