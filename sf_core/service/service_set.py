"""Rollouts that need several services: each env holds one slot of every named pool, as a set.

With `--env_service=pools.yaml` naming pools (say `sim` and `reward`), the env being trained is a
composition the user registers: its factory gets `ctx.services`, one `gymnasium.Env` per pool, each on
a slot of that pool, and returns the env the policy acts in (for example the simulator's env whose
reward comes from the reward service). `ctx.services.step({...})` calls several of them at once
(sf_core/service/concurrent_calls.py). A rollout worker gets a contiguous slice of every pool
(sf_core/service/endpoints.py) and builds each of its envs on a `ServiceSet`:

- the set's slots are acquired all-or-none, with a timeout: a set never holds one slot while it waits
  for another, so two envs that want the same two pools cannot deadlock;
- when any one of them fails, the whole set lets go: the failed slot is out of service (health-checked
  and re-admitted by its pool as usual), the others are restored and released, and the env raises
  `SlotLost`, which takes the rollout worker's slot-failure path (the trajectory in progress is
  dropped; the next reset acquires a whole new set);
- closing the env releases every slot, restored;
- when one of its slots is drained (sf_core/service/env_pool.py), the rollout worker lets go of the whole set
  at the end of the rollout, as after a failure but with that rollout kept.
"""

from __future__ import annotations

import time
from typing import Any

import gymnasium as gym

from sf_core.service.concurrent_calls import Services
from sf_core.service.env_pool import EnvPool, PoolTimeout, SlotLost, SlotState
from sf_core.service.pooled_env import PooledEnv
from sf_core.service.remote_env import ServiceError

WAIT_STEP_SEC = 0.05  # between all-or-none attempts while a pool has no free slot


class PoolGroup:
    """A rollout worker's pools by name, seen as one pool where the worker needs totals."""

    def __init__(self, pools: dict[str, EnvPool]):
        self.pools = pools

    @property
    def readmitted_total(self) -> int:
        return sum(p.readmitted_total for p in self.pools.values())

    @property
    def joined_total(self) -> int:
        return sum(p.joined_total for p in self.pools.values())

    @property
    def drained_total(self) -> int:
        return sum(p.drained_total for p in self.pools.values())

    def waits_on_servers(self) -> bool:
        return any(p.waits_on_servers() for p in self.pools.values())

    def summary(self) -> str:
        return "; ".join(f"{name}: {pool.summary()}" for name, pool in self.pools.items())

    def counts(self) -> dict[str, int]:
        totals = {state.value: 0 for state in SlotState}
        for pool in self.pools.values():
            for state, n in pool.counts().items():
                totals[state] += n
        return totals

    def describe(self, timeout: float | None = None) -> None:
        for pool in self.pools.values():
            pool.describe(timeout)

    def close(self) -> None:
        for pool in self.pools.values():
            pool.close()


class ServiceSet:
    """One slot of each pool, held together by one env."""

    def __init__(self, group: PoolGroup):
        self.envs = Services({name: PooledEnv(pool, acquire_timeout=0.0) for name, pool in group.pools.items()})

    def held(self) -> bool:
        return all(env.slot is not None for env in self.envs.values())

    def acquire(self, timeout: float) -> None:
        """Every slot of the set, or none: PoolTimeout after `timeout` seconds without a full set."""
        deadline = time.monotonic() + timeout
        while True:
            missing = [env for env in self.envs.values() if env.slot is None]
            taken = [(env, env.pool.try_acquire(env.avoid)) for env in missing]
            if all(slot is not None for _, slot in taken):
                for env, slot in taken:
                    env.slot = slot
                return
            for env, slot in taken:  # not all of them: give back what was taken, wait, try again
                if slot is not None:
                    env.pool.untake(slot)
            if time.monotonic() >= deadline:
                short = [name for name, env in self.envs.items() if env.slot is None and env.pool.counts()["idle"] == 0]
                raise PoolTimeout(f"no full set of slots within {timeout:g}s (no free slot in "
                                  f"{', '.join(short) or 'a pool'})")
            time.sleep(min(WAIT_STEP_SEC, max(0.0, deadline - time.monotonic())))

    def let_go(self) -> None:
        """After a failure: the slots that still work go back to their pools, restored."""
        for env in self.envs.values():
            env.let_go()

    @property
    def draining(self) -> bool:
        """Whether one of the set's slots is being drained: the whole set is let go, as after a failure."""
        return any(env.draining for env in self.envs.values())


class ServiceSetEnv(gym.Wrapper):
    """The user's composed env over a `ServiceSet`: acquires the set before a reset, lets go of all of it
    when any of its slots fails (raising SlotLost), releases it on close."""

    def __init__(self, env: gym.Env, services: ServiceSet, acquire_timeout: float):
        super().__init__(env)
        self.services, self.acquire_timeout = services, acquire_timeout

    def _guarded(self, call, *args: Any, **kwargs: Any):
        try:
            return call(*args, **kwargs)
        except ServiceError as exc:
            self.services.let_go()
            raise exc if isinstance(exc, SlotLost) else SlotLost(f"a service of this env failed: {exc}") from exc

    def reset(self, **kwargs: Any):
        if not self.services.held():
            self.services.acquire(self.acquire_timeout)
        return self._guarded(self.env.reset, **kwargs)

    def step(self, action: Any):
        return self._guarded(self.env.step, action)

    @property
    def draining(self) -> bool:
        return self.services.draining

    def let_go(self) -> None:
        """Give the whole set back (the composed env stays usable: its next reset acquires another)."""
        self.services.let_go()

    def close(self) -> None:
        try:
            self.env.close()
        finally:
            self.services.let_go()


def probe_composed_spaces(cfg, registry, group: PoolGroup) -> tuple[gym.Space, gym.Space]:
    """Before training on named pools: the env being trained, composed once on one slot of each pool of
    `group`, gives the spaces; the group is closed afterwards. ServiceError if a slot does not serve."""
    from sf_core.envs.registry import EnvContext

    try:
        services = ServiceSet(group)
        services.acquire(cfg.env_service_timeout)
        env = registry.make(cfg.env, cfg, EnvContext(worker_index=-1, env_index=-1, seed=cfg.seed,
                                                     services=services.envs))
        try:
            return env.observation_space, env.action_space
        finally:
            env.close()
            services.let_go()
    finally:
        group.close()
