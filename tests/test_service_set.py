"""Rollouts that need several services: an env holds one slot of every named pool, acquired all-or-none
and let go of together; training on a `sim` and a `reward` pool survives a reward server's death."""

from __future__ import annotations

import threading

import gymnasium as gym
import pytest

from sf_core.envs.registry import EnvRegistry
from sf_core import register_env
from sf_core.service.env_pool import EnvPool, PoolTimeout, SlotLost
from sf_core.service.service_set import PoolGroup, ServiceSet, ServiceSetEnv
from sf_core.service.skip import serve_in_process, stop_in_process
from tests.helpers import EnvServerProcess, train
from tests.service_envs import ObsReward


class SimWithReward(gym.Wrapper):
    """The simulator's env, rewarded by the reward service's score of each observation it reaches."""

    def __init__(self, services):
        super().__init__(services["sim"])
        self.reward_model = services["reward"]

    def reset(self, **kwargs):
        self.reward_model.reset()
        return self.env.reset(**kwargs)

    def step(self, action):
        obs, _, terminated, truncated, info = self.env.step(action)
        _, reward, *_ = self.reward_model.step(obs)
        return obs, reward, terminated, truncated, info


def make_sim_with_reward(name, cfg, ctx):
    return SimWithReward(ctx.services)


register_env("SimWithReward-v0", make_sim_with_reward)


@pytest.fixture
def pools():
    """A sim pool of 2 slots and a reward pool of 1, on in-process servers (skip mode: no sockets)."""
    registry = EnvRegistry({"ObsReward-v0": lambda name, cfg, ctx: ObsReward()})
    sim, reward = serve_in_process("CartPole-v1", 2, owner="sim"), serve_in_process("ObsReward-v0", 1, registry=registry,
                                                                                    owner="reward")
    group = PoolGroup({"sim": EnvPool([(sim, 0), (sim, 1)], None), "reward": EnvPool([(reward, 0)], None)})
    yield group
    group.close()
    stop_in_process(sim)
    stop_in_process(reward)


def test_a_set_is_acquired_all_or_none_and_let_go_of_together(pools):
    first, second = ServiceSet(pools), ServiceSet(pools)
    first.acquire(timeout=1.0)
    assert first.held()
    with pytest.raises(PoolTimeout, match="no free slot in reward"):
        second.acquire(timeout=0.3)  # a sim slot is free, the reward slot is not: it takes neither
    assert not any(env.slot for env in second.envs.values())
    assert pools.pools["sim"].counts()["idle"] == 1
    first.let_go()
    second.acquire(timeout=1.0)
    assert second.held() and pools.counts()["busy"] == 2


def test_a_failing_service_lets_go_of_the_whole_set(pools):
    services = ServiceSet(pools)
    env = ServiceSetEnv(SimWithReward(services.envs), services, acquire_timeout=1.0)
    env.reset(seed=0)
    env.step(0)
    stop_in_process(services.envs["reward"].slot.address)  # the reward server is gone
    with pytest.raises(SlotLost):
        env.step(0)
    counts = pools.pools["sim"].counts()
    assert counts["idle"] == 2 and counts["busy"] == 0, "the sim slot was not given back with the set"
    assert pools.pools["reward"].counts()["error"] == 1
    with pytest.raises(PoolTimeout):  # no healthy reward slot: no set, and nothing held meanwhile
        env.reset(seed=1)
    assert pools.pools["sim"].counts()["idle"] == 2


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_training_on_a_sim_and_a_reward_pool_goes_on_when_a_reward_server_dies(tmp_path):
    sim = EnvServerProcess(tmp_path, "CartPole-v1", 4).start()
    rewards = [EnvServerProcess(tmp_path, "ObsReward-v0", 2).start() for _ in range(2)]
    (tmp_path / "pools.yaml").write_text(
        f"pools:\n  sim: [{sim.spec}]\n  reward: [{rewards[0].spec}, {rewards[1].spec}]\n")
    killer = threading.Timer(8.0, rewards[0].kill)  # worker 0's reward slots: its envs lose their sets
    try:
        killer.start()
        code, summary = train(tmp_path, "--env=SimWithReward-v0", f"--env_service={tmp_path / 'pools.yaml'}",
                              "--num_workers=2", "--train_for_env_steps=20000", "--env_service_timeout=1",
                              "--env_service_recheck_interval=0.5", experiment="pools")
    finally:
        killer.cancel()
        for server in (sim, *rewards):
            server.kill()
    assert code == 0, summary.get("error")
    assert summary["frames"] >= 20000
    assert summary["slot_faults"] >= 1 and summary["interrupted_episodes"] >= 1, summary
    assert summary["mean_return"] is not None and summary["mean_return"] > 0


def test_training_flags_take_named_pools_with_the_arithmetic(tmp_path):
    from sf_core.cli.arguments import parse_args
    from sf_core.config import ConfigError

    path = tmp_path / "pools.yaml"
    path.write_text("pools:\n  sim: [127.0.0.1:5555*8]\n  reward: [127.0.0.1:6000*2, 127.0.0.1:6001*2]\n")
    cfg, _ = parse_args(["--env=SimWithReward-v0", f"--env_service={path}", "--num_workers=2"])
    assert cfg.num_envs_per_worker == 2  # the smaller share: 4 reward slots // 2 workers
    with pytest.raises(ConfigError, match=r"pool reward: 4 slots // 2 workers = 2\) = 2 envs per worker"):
        parse_args(["--env=SimWithReward-v0", f"--env_service={path}", "--num_workers=2",
                    "--num_envs_per_worker=1"])
    with pytest.raises(ConfigError, match="each rollout worker needs at least one slot"):
        parse_args(["--env=SimWithReward-v0", f"--env_service={path}", "--num_workers=5"])


def make_mock_reward(name, cfg, ctx):
    return ObsReward()


register_env("MockReward-v0", make_mock_reward)  # module-level factory: it travels to the worker processes


def _pools_file(tmp_path, sim: str) -> str:
    """A sim pool at `sim` and a reward pool at an address nothing listens on (it must never be asked)."""
    path = tmp_path / "pools.yaml"
    path.write_text(f"pools:\n  sim: [{sim}]\n  reward: [127.0.0.1:1*2]\n")
    return str(path)


def test_skip_flag_names_pools_of_the_file_each_with_its_env(tmp_path):
    from sf_core.cli.arguments import parse_args
    from sf_core.config import ConfigError

    path = _pools_file(tmp_path, "127.0.0.1:5555*2")
    base = ["--env=SimWithReward-v0", f"--env_service={path}", "--num_workers=1"]
    cfg, _ = parse_args([*base, "--env_service_skip=reward=MockReward-v0"])
    assert cfg.num_envs_per_worker == 2  # the arithmetic of the file, skipped pools included
    for value, message in (("rewrd=MockReward-v0", r"there is no pool 'rewrd' in --env_service \(its pools: sim, "
                                                    r"reward\)"),
                           ("reward", "'reward' must be POOL=ENV"),
                           ("reward=A,reward=B", "names pool 'reward' twice")):
        with pytest.raises(ConfigError, match=message):
            parse_args([*base, f"--env_service_skip={value}"])
    with pytest.raises(ConfigError, match="names pools of an --env_service YAML file"):
        parse_args(["--env=CartPole-v1", "--env_service=127.0.0.1:5555*2", "--num_workers=1",
                    "--env_service_skip=reward=MockReward-v0"])


def test_a_skipped_pool_is_served_in_process_and_the_other_stays_on_its_server(tmp_path):
    from sf_core.cli.arguments import parse_args
    from sf_core.envs.registry import registry_snapshot
    from sf_core.service.env_server import EnvServer
    from sf_core.service.training import open_worker_pool, probe_spaces

    server = EnvServer("CartPole-v1", 2)  # the real simulator, on 127.0.0.1
    serving = threading.Thread(target=server.serve, daemon=True)
    serving.start()
    try:
        pools = _pools_file(tmp_path, f"127.0.0.1:{server.port}*2")
        cfg, _ = parse_args(["--env=SimWithReward-v0", f"--env_service={pools}", "--num_workers=1",
                             "--env_service_skip=reward=MockReward-v0", "--env_service_timeout=1"])
        registry = registry_snapshot()
        obs_space, _, _ = probe_spaces(cfg, registry)  # 127.0.0.1:1 was never asked: it would not answer
        assert obs_space.shape == (4,)
        group = open_worker_pool(cfg, registry, worker=0, seed=0, owner="w0")
        services = ServiceSet(group)
        env = ServiceSetEnv(SimWithReward(services.envs), services, acquire_timeout=1.0)
        try:
            requests = server.requests
            env.reset(seed=0)
            _, reward, *_ = env.step(0)
            assert 0.0 < reward <= 1.0  # scored by the in-process reward model
            assert server.requests >= requests + 2  # the sim's reset and step went to its server
            assert services.envs["sim"].slot.address == f"127.0.0.1:{server.port}"
            assert services.envs["reward"].slot.address == "skip:MockReward-v0@w0/reward"
            assert [s.index for s in group.pools["reward"].slots] == [0, 1]  # the worker's share: 2 slots
        finally:
            env.close()
            group.close()
    finally:
        server.stop()
        serving.join(timeout=5)
        server.close()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_training_with_the_reward_pool_skipped_and_the_sim_on_its_server(tmp_path):
    sim = EnvServerProcess(tmp_path, "CartPole-v1", 2).start()
    try:
        code, summary = train(tmp_path, "--env=SimWithReward-v0", f"--env_service={_pools_file(tmp_path, sim.spec)}",
                              "--env_service_skip=reward=MockReward-v0", "--num_workers=1",
                              "--train_for_env_steps=3000", "--env_service_timeout=1", experiment="skip_reward")
    finally:
        sim.kill()
    assert code == 0, summary.get("error")
    assert summary["frames"] >= 3000 and summary["slot_faults"] == 0
