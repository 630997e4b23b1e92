"""Flags: types, validation messages, presets under explicit flags, JSON round trip."""

import json
import sys

import pytest

from sf_core.cli.arguments import parse_args
from sf_core.config import Config, ConfigError


def test_defaults_and_types():
    cfg, preset = parse_args(["--env=MyEnv-v0", "--encoder_mlp_layers", "32", "16", "--serial_mode=True"])
    assert preset is None
    assert cfg.encoder_mlp_layers == [32, 16]
    assert cfg.serial_mode is True
    assert isinstance(cfg.learning_rate, float)


def test_preset_applies_under_explicit_flags():
    cfg, preset = parse_args(["--env=CartPole-v1", "--learning_rate=0.01"])
    assert preset == "CartPole-v1"
    assert cfg.learning_rate == 0.01  # typed by the user: preset must not override
    assert cfg.encoder_mlp_layers == [64, 64]  # from the preset
    default = Config()
    assert cfg.num_envs_per_worker != default.num_envs_per_worker or cfg.rollout != default.rollout


@pytest.mark.parametrize("argv, message", [
    (["--env=CartPole-v1", "--num_workers=0"], "--num_workers must be at least 1"),
    (["--env=CartPole-v1", "--learning_rate=fast"], "invalid float value: 'fast'"),
    (["--env=CartPole-v1", "--serial_mode=maybe"], "expected a boolean"),
    (["--env=CartPole-v1", "--bogus_flag=1"], "unrecognized arguments: --bogus_flag=1"),
    (["--env=CartPole-v1", "--num_envs_per_worker=6", "--worker_num_splits=4"], "must be divisible by --worker_num_splits=4"),
    (["--env=CartPole-v1", "--batch_size=100", "--num_batches_per_epoch=1", "--rollout=32"], "divisible by --rollout=32"),
    (["--env=CartPole-v1", "--gamma=1.5"], "--gamma must be in [0, 1]"),
    (["--env=CartPole-v1", "--nonlinearity=swish"], "invalid choice: 'swish'"),
    ([], "--env is required"),
    (["--env=CartPole-v1", "--device=mps"], "--device=mps: use cpu, cuda, cuda:N"),
    (["--env=CartPole-v1", "--device=cuda:one"], "--device=cuda:one: use cpu, cuda, cuda:N"),
])
def test_bad_values_name_the_problem(argv, message):
    with pytest.raises(ConfigError) as err:
        parse_args(argv)
    assert message in str(err.value)


@pytest.mark.parametrize("flag, hint", [
    ("--num_worker=4", "--num_worker: did you mean --num_workers?"),
    ("--lerning_rate=0.1", "did you mean --learning_rate"),
    ("--n_envs=8", "--n_envs is another trainer's flag: here it is --num_workers and --num_envs_per_worker"),
    ("--total_timesteps=100000", "here it is --train_for_env_steps"),
    ("--n_steps=128", "here it is --rollout"),
    # CleanRL's and RL-Zoo's flags are dashed
    ("--total-timesteps=100000", "--total-timesteps is another trainer's flag: here it is --train_for_env_steps"),
    ("--num-envs=8", "--num-envs is another trainer's flag: here it is --num_workers and --num_envs_per_worker"),
    ("--ent-coef=0.01", "here it is --exploration_loss_coeff"),
    ("--num-steps=128", "here it is --rollout"),
    ("--update-epochs=4", "here it is --num_epochs"),
    ("--n-timesteps=1000", "--n-timesteps is another trainer's flag: here it is --train_for_env_steps"),
    ("--eval-freq=10000", "here it is --eval_every_env_steps"),
    ("--tensorboard-log=logs", "here it is --train_dir"),
    ("--save-freq=1000", "here it is --save_every_sec (in seconds, not steps)"),
    ("--num-worker=4", "--num-worker: did you mean --num_workers?"),
])
def test_an_unknown_flag_gets_the_closest_known_one(flag, hint):
    with pytest.raises(ConfigError) as err:
        parse_args(["--env=CartPole-v1", flag])
    assert str(err.value).startswith(f"unrecognized arguments: {flag}") and hint in str(err.value)


def test_rl_zoos_short_flags_get_the_hint_too():
    with pytest.raises(ConfigError) as err:
        parse_args(["--env=CartPole-v1", "-n", "1000", "-f", "logs"])
    assert str(err.value).startswith("unrecognized arguments: -n 1000 -f logs")
    assert "-n is another trainer's flag: here it is --train_for_env_steps" in str(err.value)
    assert "-f is another trainer's flag: here it is --train_dir" in str(err.value)


def test_rl_zoos_lower_case_algorithm_is_told_the_case():
    with pytest.raises(ConfigError, match=r"unknown --algo='ppo' \(names are upper case here: --algo=PPO\)"):
        parse_args(["--env=CartPole-v1", "--algo", "ppo"])


def test_a_dashed_spelling_of_a_flag_is_the_flag_and_counts_as_typed():
    cfg, preset = parse_args(["--env=CartPole-v1", "--num-workers=3", "--train-for-env-steps", "1000",
                              "--learning-rate=0.01", "--encoder-mlp-layers", "8", "8", "--serial-mode"])
    assert preset == "CartPole-v1"  # whose values for these flags would otherwise apply
    assert (cfg.num_workers, cfg.train_for_env_steps, cfg.learning_rate) == (3, 1000, 0.01)
    assert cfg.encoder_mlp_layers == [8, 8] and cfg.serial_mode is True
    assert "num_workers" not in cfg.machine_fit


def test_help_lists_the_underscored_names_only():
    from sf_core.cli.arguments import build_parser

    text = build_parser().format_help()
    assert "--num_workers" in text and "--num-workers" not in text and "--train-for-env-steps" not in text


def test_every_tool_takes_dashed_spellings():
    parsers = _entry_point_parsers()
    enjoy, required = parsers["enjoy"]
    args = enjoy.parse_args(required + ["--max-num-episodes=3", "--save-video", "--policy-index", "1"])
    assert (args.max_num_episodes, args.save_video, args.policy_index) == (3, True, 1)
    evaluate, required = parsers["evaluate"]
    assert evaluate.parse_args(required + ["--max-task-retries=5"]).max_task_retries == 5
    server, required = parsers["env_server"]
    assert server.parse_args(required + ["--max-message-bytes=64"]).max_message_bytes == 64
    with pytest.raises(ConfigError, match="--max-num-episode: did you mean --max_num_episodes"):
        enjoy.parse_args(["--experiment=x", "--max-num-episode=3"])


def test_a_flag_nothing_resembles_gets_no_suggestion():
    with pytest.raises(ConfigError) as err:
        parse_args(["--env=CartPole-v1", "--bogus_flag=1"])
    assert str(err.value) == "unrecognized arguments: --bogus_flag=1"


def test_a_cuda_device_this_machine_lacks_is_refused_only_where_cuda_is():
    """Without CUDA, --device=cuda:N runs on the CPU with a warning (resolve_device); with it, N must exist."""
    import torch

    argv = ["--env=CartPole-v1", "--device=cuda:5"]
    if not torch.cuda.is_available():
        assert parse_args(argv)[0].device == "cuda:5"
    elif torch.cuda.device_count() <= 5:
        with pytest.raises(ConfigError, match=r"--device=cuda:5, but this machine has \d+ CUDA device"):
            parse_args(argv)


def test_config_json_round_trip():
    cfg, _ = parse_args(["--env=CartPole-v1", "--seed=3"])
    assert Config(**json.loads(cfg.to_json())) == cfg


# ------------------------------------------------------------------------------------------ booleans

def _entry_point_parsers():
    """Every command-line parser of sf_core, with the arguments it requires."""
    from sf_core.cli import enjoy, env_server, evaluate
    from sf_core.cli.arguments import build_parser

    return {"train": (build_parser(), []), "enjoy": (enjoy.build_parser(), ["--experiment=x"]),
            "evaluate": (evaluate.build_parser(), ["--tasks=t.jsonl", "--env_service=h:1*1"]),
            "env_server": (env_server.build_parser(), ["--env=CartPole-v1"])}


@pytest.mark.parametrize("entry_point", ["train", "enjoy", "evaluate", "env_server"])
def test_every_boolean_flag_accepts_the_bare_form(entry_point):
    from sf_core.cli.arguments import BOOL_EPILOG, str2bool

    parser, required = _entry_point_parsers()[entry_point]
    flags = [a for a in parser._actions if a.type is str2bool]
    assert flags, f"{entry_point} has boolean flags"
    for action in flags:
        name, dest = action.option_strings[0], action.dest
        assert getattr(parser.parse_args(required + [name]), dest) is True
        assert getattr(parser.parse_args(required + [f"{name}=False"]), dest) is False
        assert getattr(parser.parse_args(required + [name, "False", name]), dest) is True  # the last one wins
        assert getattr(parser.parse_args(required + [name, "no"]), dest) is False
        assert getattr(parser.parse_args(required), dest) is action.default
    help_text = " ".join(parser.format_help().split())
    assert f"{flags[0].option_strings[0]} [BOOL]" in help_text and BOOL_EPILOG in help_text


def test_sample_factory_enjoy_command_line_parses():
    from sf_core.cli import enjoy

    args = enjoy.build_parser().parse_args(["--experiment=x", "--save_video", "--no_render", "--max_num_episodes=2"])
    assert args.save_video is True and args.no_render is True and args.max_num_episodes == 2


def test_a_bare_boolean_counts_as_typed_so_presets_do_not_override_it():
    cfg, preset = parse_args(["--env=HalfCheetah-v5", "--async_rl", "--serial_mode"])
    assert preset == "HalfCheetah-v5"  # whose preset sets async_rl=False
    assert cfg.async_rl is True and cfg.serial_mode is True
    cfg, _ = parse_args(["--env=CartPole-v1", "--normalize_input", "False"])
    assert cfg.normalize_input is False


def test_scripts_take_bare_booleans_too():
    from tests.test_docs import load_generator

    assert load_generator().main(["--check"]) == 0  # scripts/gen_docs.py --check: the docs are current


def test_every_boolean_argument_is_made_by_the_one_helper():
    """store_true flags refuse `--flag=True` and str2bool flags refused `--flag` alone: neither is left."""
    import ast

    from tests.test_structure import parsed

    found = []
    for path, tree in parsed():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
                kwargs = {k.arg: ast.unparse(k.value) for k in node.keywords}
                if (kwargs.get("type") == "str2bool" and path != "sf_core/cli/arguments.py") or \
                        kwargs.get("action", "").strip("'\"") in ("store_true", "store_false"):
                    found.append(f"{path}:{node.lineno} {ast.unparse(node)[:80]}")
    assert not found, "\n".join(found)


def test_fork_with_a_gpu_is_refused_and_auto_takes_a_forkserver():
    from sf_core.machine.start_method import start_method

    with pytest.raises(ConfigError, match="--mp_start_method=fork with --device=cuda:1: a forked process cannot use"):
        start_method("fork", "cuda:1")
    assert start_method("auto", "cuda") == "forkserver" and start_method("fork", "cpu") == "fork"
    # a component of several torch threads: OpenMP's pool hangs in a forked child whose parent started its own
    with pytest.raises(ConfigError, match="OpenMP's thread pool does not survive a fork"):
        start_method("fork", "cpu", threads=2)
    assert start_method("auto", "cpu", threads=2) == ("forkserver" if sys.platform.startswith("linux") else "spawn")
