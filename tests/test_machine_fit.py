"""Defaults that fit the machine (sf_core/machine/fit.py): what is fitted, what never is, and where it is said."""

from __future__ import annotations

import json
import os

import pytest

from sf_core.cli.arguments import build_parser, parse_args
from sf_core.config import Config, ConfigError
from sf_core.machine.fit import Machine, describe, fit, fitted_values, refit_on_node


@pytest.mark.parametrize("cores, gpu, expected", [
    (2, False, {"num_workers": 2, "num_envs_per_worker": 8, "policy_workers_per_policy": 1}),
    (16, False, {"num_workers": 16, "num_envs_per_worker": 8, "policy_workers_per_policy": 2}),
    (16, True, {"num_workers": 16, "num_envs_per_worker": 16, "policy_workers_per_policy": 2}),
    (96, True, {"num_workers": 96, "num_envs_per_worker": 16, "policy_workers_per_policy": 4}),
])
def test_fitted_values_follow_the_cores_and_the_device(cores, gpu, expected):
    assert fitted_values(Machine(cores, gpu)) == expected


def test_typed_workers_size_the_inference_workers_but_never_beyond_the_cores():
    assert fitted_values(Machine(16, True), num_workers=32)["policy_workers_per_policy"] == 4
    assert fitted_values(Machine(2, False), num_workers=32)["policy_workers_per_policy"] == 1


def test_only_flags_nobody_chose_are_fitted_and_envs_fill_whole_splits():
    values = {"num_workers": 5, "num_envs_per_worker": 1, "policy_workers_per_policy": 1, "worker_num_splits": 3}
    names = fit(values, {"num_workers"}, Machine(64, True))
    assert names == ["num_envs_per_worker", "policy_workers_per_policy"]
    assert values == {"num_workers": 5, "num_envs_per_worker": 18, "policy_workers_per_policy": 1,
                      "worker_num_splits": 3}


def test_the_command_line_fits_what_is_neither_typed_nor_preset():
    cfg, _ = parse_args(["--env=CartPole-v1", "--env_vectorization=none"])  # the preset sets 64 envs per worker
    assert cfg.machine_fit == ["num_workers", "policy_workers_per_policy"]
    assert cfg.num_envs_per_worker == 64 and cfg.num_workers == len(os.sched_getaffinity(0))
    cfg, _ = parse_args(["--env=CartPole-v1", "--num_workers=3", "--policy_workers_per_policy=2"])
    assert cfg.machine_fit == [] and (cfg.num_workers, cfg.policy_workers_per_policy) == (3, 2)
    cfg, _ = parse_args(["--env=HalfCheetah-v5"])  # MuJoCo's preset pins two workers (a lag-0 dataset)
    assert cfg.num_workers == 2 and "num_workers" not in cfg.machine_fit


def test_large_workers_of_a_vector_env_get_two_cores_each():
    assert fitted_values(Machine(2, False), cores_per_worker=2)["num_workers"] == 1
    assert fitted_values(Machine(1, False), cores_per_worker=2)["num_workers"] == 1
    assert fitted_values(Machine(16, False), cores_per_worker=2)["num_workers"] == 8
    assert fitted_values(Machine(16, False), num_workers=3, cores_per_worker=2)["num_workers"] == 3
    cores = len(os.sched_getaffinity(0))
    cfg, preset = parse_args(["--env=CartPole-v1"])  # gymnasium's numpy CartPole: the preset's vector-env values
    assert (cfg.num_workers, cfg.num_envs_per_worker) == (max(1, cores // 2), 256)
    assert cfg.machine_fit == ["num_workers", "policy_workers_per_policy"]
    cfg, _ = parse_args(["--env=CartPole-v1", "--num_envs_per_worker=64"])  # small workers: one per core
    assert (cfg.num_workers, cfg.num_envs_per_worker) == (cores, 64)
    cfg, _ = parse_args(["--env=CartPole-v1", "--num_workers=3"])
    assert (cfg.num_workers, cfg.num_envs_per_worker) == (3, 256)


def test_the_workers_follow_this_process_cpu_affinity():
    before = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, {min(before)})
        cfg, _ = parse_args(["--env=CartPole-v1"])
    finally:
        os.sched_setaffinity(0, before)
    assert cfg.num_workers == 1


def test_machine_fit_is_recorded_not_a_flag():
    with pytest.raises(ConfigError, match="unrecognized arguments: --machine_fit"):
        build_parser().parse_args(["--env=CartPole-v1", "--machine_fit=num_workers"])
    cfg, _ = parse_args(["--env=CartPole-v1"])
    assert json.loads(cfg.to_json())["machine_fit"] == cfg.machine_fit


def test_the_console_line_names_each_fitted_flag_and_the_machine():
    cfg, _ = parse_args(["--env=CartPole-v1", "--num_workers=4"])
    line = describe(cfg, Machine(12, True))
    assert line.startswith("fitted to this machine (12 cores, a GPU): --policy_workers_per_policy=1 ")
    assert "--num_workers" not in line and "--sweep" in line


def test_a_cluster_sampler_refits_to_its_node_unless_env_service_slots_were_divided():
    cores = len(os.sched_getaffinity(0))
    cfg = Config(env="CartPole-v1", num_workers=99, policy_workers_per_policy=1, machine_fit=["num_workers"])
    assert refit_on_node(cfg).num_workers == cores
    typed = Config(env="CartPole-v1", num_workers=99, machine_fit=[])
    assert refit_on_node(typed).num_workers == 99
    served = Config(env="CartPole-v1", num_workers=99, env_service="127.0.0.1:5555*99", machine_fit=["num_workers"])
    assert refit_on_node(served).num_workers == 99



def test_a_learner_process_gets_its_own_torch_threads_and_every_other_process_keeps_torch_threads(tmp_path):
    from sf_core.run.runner import Runner

    flags = ["--env=CartPole-v1", "--num_workers=2", f"--train_dir={tmp_path}", "--experiment=threads"]
    for extra, learner in (([], 1), (["--learner_torch_threads=2"], 2), (["--torch_threads=3"], 3)):
        cfg, _ = parse_args(flags + extra)
        runner = Runner(cfg)
        runner._build()  # the processes made, none started
        try:
            threads = {proc.name: proc.torch_threads for proc in runner.topology.processes}
        finally:
            runner.topology.close_processes()
        assert threads.pop("learner_proc") == learner
        assert set(threads) >= {"rollout_worker_0_proc", "rollout_worker_1_proc"}
        assert set(threads.values()) == {cfg.torch_threads}
    with pytest.raises(ConfigError, match="--learner_torch_threads must be at least 0"):
        parse_args(flags + ["--learner_torch_threads=-1"])


def test_a_learner_of_two_threads_trains_from_a_process_whose_openmp_pool_runs(tmp_path):
    """A notebook or a test that ran torch on several threads has OpenMP's pool running; a learner forked from it
    that starts its own hung on its first SGD step. auto then starts the components from a forkserver."""
    from tests import launch

    code = ("import sys, torch; torch.set_num_threads(2); a = torch.randn(512, 512); (a @ a).sum(); "
            "import sf_core.train; sys.exit(sf_core.train.main(sys.argv[1:]))")
    # HalfCheetah's preset: two learner threads, and SGD steps large enough for OpenMP to split them
    done = launch.run(["--env=HalfCheetah-v5", "--seed=1", "--train_for_env_steps=8192", f"--train_dir={tmp_path}",
                       "--experiment=pool"], timeout=90, code=code)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    summary = json.loads((tmp_path / "pool" / "training_summary.json").read_text())
    assert summary["samples_trained"] >= 8192
