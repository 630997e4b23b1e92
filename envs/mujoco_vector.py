"""MuJoCo locomotion envs stepped many at once: one `VectorEnv` per split (--env_vectorization=mujoco).

gymnasium's MuJoCo envs spend about a fifth of a step in Python around the physics (docs/environments.md, "MuJoCo
envs stepped in batch"): reading the body's position, building the observation, the reward terms and the health
check, each with small numpy calls on one env's arrays. Here a split's N envs are N of gymnasium's own env
objects (their models, data, random generators and resets), and a step

- runs the physics env by env, as gymnasium does (the action into `ctrl`, `mj_step` for `frame_skip` steps,
  `mj_rnePostConstraint` for the contact forces) and copies the arrays the env reads into one batch;
- computes the observations, rewards and terminations of all N at once, with the same numpy operations on the
  same values in the same order, so they equal gymnasium's bit for bit (tests/test_mujoco_vector.py steps both
  side by side through resets and time limits);
- resets an ended env with that env's own `reset()` (the same draws from its generator as the per-env path) on
  the same step (`AutoresetMode.SAME_STEP`; the last observation is in `info["final_obs"]`), and cuts an episode
  at the id's `max_episode_steps` as gymnasium's TimeLimit does.

A kind of env is a subclass of `LocomotionVectorEnv` naming the MjData arrays it reads and its observation and
reward; `KINDS` lists the ids served. The step infos (`x_velocity`, the reward terms) are not built: the trainer
reads none of them. No rendering: `sf_core.enjoy` and evaluation play single envs through envs/mujoco.py.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space


def available() -> bool:
    """Whether the [mujoco] extra is installed: looked up, not imported, so that only a run that makes these envs
    pays for the import at start-up."""
    return importlib.util.find_spec("mujoco") is not None


class LocomotionVectorEnv(VectorEnv):
    """N of gymnasium's env objects of one id, their physics stepped one by one and the rest computed in batch."""

    metadata = {"autoreset_mode": AutoresetMode.SAME_STEP}
    # the MjData arrays a step copies into the batch after the physics, by name (each env's views bound once)
    FIELDS: tuple[str, ...] = ("qpos", "qvel")
    # the env's options (gymnasium's defaults) the kind's batch computes as gymnasium does: all must hold
    REQUIRED: tuple[str, ...] = ("_exclude_current_positions_from_observation",)

    def __init__(self, env_id: str, num_envs: int):
        import mujoco

        self.mj_step, self.mj_forces = mujoco.mj_step, mujoco.mj_rnePostConstraint
        spec = gym.spec(env_id)
        self.envs = [gym.make(env_id, disable_env_checker=True).unwrapped for _ in range(num_envs)]
        first = self.envs[0]
        other = [option for option in self.REQUIRED if not getattr(first, option)]
        if other:
            raise ValueError(f"{env_id} is registered with other arguments than the v5 id's defaults "
                             f"({', '.join(name.strip('_') for name in other)} is off)")
        self.forward_weight, self.ctrl_weight = first._forward_reward_weight, first._ctrl_cost_weight
        self.num_envs = num_envs
        self.single_observation_space = first.observation_space
        self.single_action_space = first.action_space
        self.observation_space = batch_space(first.observation_space, num_envs)
        self.action_space = batch_space(first.action_space, num_envs)
        self.max_episode_steps = spec.max_episode_steps
        self.frame_skip, self.dt = first.frame_skip, first.dt
        self.elapsed = np.zeros(num_envs, dtype=np.int64)
        # each env's model, data, control and FIELDS arrays (MjData's arrays are views: bound once, read each step)
        self.physics = [(env.model, env.data, env.data.ctrl,
                         [(name, getattr(env.data, name)) for name in self.FIELDS]) for env in self.envs]
        self.batch = {name: np.empty((num_envs, *view.shape), view.dtype) for name, view in self.physics[0][3]}
        self.before, self.after = np.empty((num_envs, 2)), np.empty((num_envs, 2))  # position() around the physics

    def x_velocity(self) -> np.ndarray:
        """Each env's velocity along x over the step, as gymnasium takes it from the position before and after."""
        return ((self.after - self.before) / self.dt)[:, 0]

    # the kind's own ---------------------------------------------------------------------------------------------
    def position(self, e: int) -> np.ndarray | float:
        """The position of env e whose x velocity the reward pays (x, y; or x alone)."""
        raise NotImplementedError

    def observations(self) -> np.ndarray:
        raise NotImplementedError

    def rewards_and_health(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    # the VectorEnv API ------------------------------------------------------------------------------------------
    def reset(self, *, seed: int | list[int | None] | None = None, options: dict | None = None
              ) -> tuple[np.ndarray, dict]:
        seeds = [seed + e for e in range(self.num_envs)] if isinstance(seed, int) else seed
        seeds = seeds if seeds is not None else [None] * self.num_envs
        obs = np.stack([self._reset(e, s) for e, s in enumerate(seeds)])
        return obs, {}

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        actions = np.asarray(actions, dtype=self.single_action_space.dtype)
        step, forces, skip, batch = self.mj_step, self.mj_forces, self.frame_skip, self.batch
        for e, (model, data, ctrl, views) in enumerate(self.physics):
            self.before[e] = self.position(e)
            ctrl[:] = actions[e]
            step(model, data, nstep=skip)
            forces(model, data)  # the forces an observation or reward reads
            self.after[e] = self.position(e)
            for name, view in views:
                batch[name][e] = view
        obs = self.observations()
        rewards, healthy = self.rewards_and_health(actions)
        terminated = ~healthy
        self.elapsed += 1
        truncated = self.elapsed >= self.max_episode_steps
        ended = terminated | truncated
        if not ended.any():
            return obs, rewards, terminated, truncated, {}
        final_obs = obs.copy()
        for e in np.flatnonzero(ended).tolist():
            obs[e] = self._reset(e, None)
        info = {"final_obs": final_obs, "_final_obs": ended, "final_info": {}, "_final_info": ended}
        return obs, rewards, terminated, truncated, info

    def _reset(self, e: int, seed: int | None) -> np.ndarray:
        self.elapsed[e] = 0
        obs, _ = self.envs[e].reset(seed=seed)
        return obs

    def close(self, **kwargs: Any) -> None:
        for env in self.envs:
            env.close()


class AntVectorEnv(LocomotionVectorEnv):
    """Ant-v5 with gymnasium's default arguments: the torso's forward velocity, a healthy reward while the torso's
    height is in range, the control and contact costs; the observation without the x and y position, with the
    external contact forces of every body but the world, clipped to [-1, 1]."""

    FIELDS = ("qpos", "qvel", "cfrc_ext")
    REQUIRED = LocomotionVectorEnv.REQUIRED + ("_include_cfrc_ext_in_observation", "_terminate_when_unhealthy")

    def __init__(self, env_id: str, num_envs: int):
        super().__init__(env_id, num_envs)
        first = self.envs[0]
        self.torso = [env.data.body(first._main_body).xpos for env in self.envs]
        self.contact_weight, self.healthy_reward = first._contact_cost_weight, first._healthy_reward
        self.force_range, self.z_range = first._contact_force_range, first._healthy_z_range

    def position(self, e: int) -> np.ndarray:
        return self.torso[e][:2]

    def contact_forces(self) -> np.ndarray:
        return np.clip(self.batch["cfrc_ext"], *self.force_range)

    def observations(self) -> np.ndarray:
        n = self.num_envs
        return np.concatenate((self.batch["qpos"][:, 2:], self.batch["qvel"],
                               self.contact_forces()[:, 1:].reshape(n, -1)), axis=1)

    def rewards_and_health(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        qpos, qvel = self.batch["qpos"], self.batch["qvel"]
        low, high = self.z_range
        healthy = (np.isfinite(qpos).all(axis=1) & np.isfinite(qvel).all(axis=1)
                   & (low <= qpos[:, 2]) & (qpos[:, 2] <= high))
        ctrl_cost = self.ctrl_weight * np.square(actions).sum(axis=1)
        # summed over each env's forces as one flat run, the order np.sum takes over one env's [bodies, 6]
        contact_cost = self.contact_weight * np.square(self.contact_forces()).reshape(self.num_envs, -1).sum(axis=1)
        forward = self.x_velocity() * self.forward_weight
        return (forward + healthy * self.healthy_reward) - (ctrl_cost + contact_cost), healthy


class HumanoidVectorEnv(LocomotionVectorEnv):
    """Humanoid-v5 with gymnasium's default arguments: the mass centre's forward velocity, a healthy reward while
    the torso's height is in range, the control cost (of `ctrl`) and the contact cost (capped); the observation
    without the x and y position, with the bodies' inertia and velocity, the actuator forces and the contact
    forces of every body but the world."""

    FIELDS = ("qpos", "qvel", "ctrl", "cinert", "cvel", "qfrc_actuator", "cfrc_ext")
    REQUIRED = LocomotionVectorEnv.REQUIRED + (
        "_include_cinert_in_observation", "_include_cvel_in_observation", "_include_qfrc_actuator_in_observation",
        "_include_cfrc_ext_in_observation", "_terminate_when_unhealthy")

    def __init__(self, env_id: str, num_envs: int):
        from gymnasium.envs.mujoco.humanoid_v5 import mass_center

        super().__init__(env_id, num_envs)
        first = self.envs[0]
        self.mass_center = mass_center  # gymnasium's own, per env: the same sums in the same order
        self.contact_weight, self.contact_range = first._contact_cost_weight, first._contact_cost_range
        self.healthy_reward, self.z_range = first._healthy_reward, first._healthy_z_range

    def position(self, e: int) -> np.ndarray:
        return self.mass_center(self.envs[e].model, self.envs[e].data)

    def observations(self) -> np.ndarray:
        b, n = self.batch, self.num_envs
        return np.concatenate((b["qpos"][:, 2:], b["qvel"], b["cinert"][:, 1:].reshape(n, -1),
                               b["cvel"][:, 1:].reshape(n, -1), b["qfrc_actuator"][:, 6:],
                               b["cfrc_ext"][:, 1:].reshape(n, -1)), axis=1)

    def rewards_and_health(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        z = self.batch["qpos"][:, 2]
        low, high = self.z_range
        healthy = (low < z) & (z < high)
        ctrl_cost = self.ctrl_weight * np.square(self.batch["ctrl"]).sum(axis=1)
        forces = np.square(self.batch["cfrc_ext"]).reshape(self.num_envs, -1).sum(axis=1)
        contact_cost = np.clip(self.contact_weight * forces, *self.contact_range)
        forward = self.forward_weight * self.x_velocity()
        return (forward + healthy * self.healthy_reward) - (ctrl_cost + contact_cost), healthy


class PlanarVectorEnv(LocomotionVectorEnv):
    """The planar bodies of gymnasium's v5 ids with their default arguments: the forward velocity of the root's x
    position, the control cost; the observation without the x position."""

    def __init__(self, env_id: str, num_envs: int):
        super().__init__(env_id, num_envs)
        self.qpos = [env.data.qpos for env in self.envs]

    def position(self, e: int) -> float:
        return self.qpos[e][0]

    def control_cost(self, actions: np.ndarray) -> np.ndarray:
        return self.ctrl_weight * np.square(actions).sum(axis=1)


class HalfCheetahVectorEnv(PlanarVectorEnv):
    """HalfCheetah-v5: runs until the time limit cuts the episode."""

    def observations(self) -> np.ndarray:
        return np.concatenate((self.batch["qpos"][:, 1:], self.batch["qvel"]), axis=1)

    def rewards_and_health(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        rewards = self.forward_weight * self.x_velocity() - self.control_cost(actions)
        return rewards, np.ones(self.num_envs, dtype=bool)


class UprightVectorEnv(PlanarVectorEnv):
    """Hopper-v5 and Walker2d-v5: a healthy reward while the torso's height and angle are in range (and, for
    Hopper, every other coordinate and velocity), the end of the episode when not; the velocities observed are
    clipped to ±10."""

    REQUIRED = PlanarVectorEnv.REQUIRED + ("_terminate_when_unhealthy",)

    def __init__(self, env_id: str, num_envs: int):
        super().__init__(env_id, num_envs)
        first = self.envs[0]
        self.healthy_reward, self.z_range = first._healthy_reward, first._healthy_z_range
        self.angle_range = first._healthy_angle_range
        self.state_range = getattr(first, "_healthy_state_range", None)  # Hopper's; Walker2d has none

    def observations(self) -> np.ndarray:
        return np.concatenate((self.batch["qpos"][:, 1:], np.clip(self.batch["qvel"], -10, 10)), axis=1)

    def rewards_and_health(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        qpos = self.batch["qpos"]
        z, angle = qpos[:, 1], qpos[:, 2]
        healthy = ((self.z_range[0] < z) & (z < self.z_range[1])
                   & (self.angle_range[0] < angle) & (angle < self.angle_range[1]))
        if self.state_range is not None:
            low, high = self.state_range
            state = np.concatenate((qpos[:, 2:], self.batch["qvel"]), axis=1)
            healthy &= ((low < state) & (state < high)).all(axis=1)
        forward = self.forward_weight * self.x_velocity()
        return (forward + healthy * self.healthy_reward) - self.control_cost(actions), healthy


KINDS: dict[str, type[LocomotionVectorEnv]] = {
    "Ant-v5": AntVectorEnv, "Humanoid-v5": HumanoidVectorEnv, "HalfCheetah-v5": HalfCheetahVectorEnv,
    "Hopper-v5": UprightVectorEnv, "Walker2d-v5": UprightVectorEnv}


def make_mujoco_vector_env(name: str, num_envs: int, render_mode: str | None = None) -> LocomotionVectorEnv:
    if render_mode:
        raise ValueError(f"--env_vectorization=mujoco does not render (render_mode={render_mode!r}): "
                         f"render through envs/mujoco.py")
    return KINDS[name](name, num_envs)
