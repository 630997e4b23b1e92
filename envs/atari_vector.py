"""Atari games as one vector env per split: ale-py's `AtariVectorEnv` (--env_vectorization=ale).

ale-py (0.12) ships a vector env derived from EnvPool: N emulators stepped by a C++ thread pool, with the DQN
preprocessing done in C++. `make_atari_vector_env` serves the names envs/atari.py serves (`atari_*`, `ALE/...`;
the same name resolution) with the settings of that module's `AtariPreprocessing`, so presets and scores carry
over: the id's v5 emulator settings (sticky actions as `--repeat_action_probability`, minimal action set,
108,000 frames reported as `truncated`), `--env_frameskip` frames per step with the max of the last two, no-op
frames and FIRE at a game's start, 84x84 grayscale, a stack of 4 channels first, `Box(0, 255, (4, 84, 84),
uint8)`; in training only (`VectorEnvContext.evaluation` False) a lost life ends the learner's episode and
rewards are clipped to their sign. `AtariVectorPreprocessing` adds in Python what the vector env lacks:

- Whole-game statistics. The vector env reports neither the game's score nor its length, so it is made without
  reward clipping and this wrapper clips (training), keeps each sub-env's unclipped score and length in agent
  steps, and hands them over as today: `info["final_info"]` of a step that ends an episode holds
  `episode_return` / `episode_length` of the whole game (all lives), None where only a life was lost.
- A lost life. ale-py's `episodic_life=True` restarts the whole game at a lost life; `life_loss_info=True`
  reports it as `terminated` and plays on, which is what today's wrapper does. The env resets on the step
  that ends a game (`AutoresetMode.SAME_STEP`; the game's last observation is in `info["final_obs"]`). Not
  NEXT_STEP: there the runner takes the step after every `terminated` as the env's reset, but after a lost life
  that step is played. Which ended sub-envs started a new game is read from the frame counters (`frame_number
  - episode_frame_number`, where the current game began, moves only when a game restarts).
- The stack at a game's start. The vector env fills the frames before a game's first with zeros; they are
  filled with the first frame, as today.

What differs from envs/atari.py, and cannot be matched through ale-py's options:

- Reset: FIRE (one frame, in games that have it) comes first, then 0..29 no-op frames less that FIRE frame;
  today's wrapper plays 1..30 no-op frames, then FIRE and action 2 as two agent steps. After a lost life the game
  simply goes on (today: a no-op step and the FIRE steps, and the stack refilled with the new frame).
- The 108,000-frame limit counts from the game's first agent step (today: from its reset, the no-ops included).
  A life lost on the very step the limit cuts the game is reported as `terminated` (the vector env does not
  say which of the two ended it), today as `truncated`.
- `episode_length` counts the agent's steps only (today's also counts the FIRE steps of its resets).
- The 84x84 frame is OpenCV's INTER_AREA; today's numpy area resize rounds the same averages, so a pixel
  differs by at most 1 grey level.
- Seeding: sub-env i of a reset with seed s plays seed s + i, as the per-env path's env i, but the two paths'
  games for one seed differ (ale-py seeds its emulators and no-op draws its own way).
- No rendering: `sf_core.enjoy` and evaluation play single envs through envs/atari.py.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import VectorEnv, VectorWrapper

from sf_core.envs.atari import ATARI_PREFIX, ALE_PREFIX, _import_ale, ale_id, sticky_actions

if TYPE_CHECKING:
    from sf_core.config import Config
    from sf_core.envs.registry import VectorEnvContext


def is_atari_name(name: str) -> bool:
    return name.startswith((ATARI_PREFIX, ALE_PREFIX))


def env_threads(num_envs: int, num_workers: int) -> int:
    """Threads of a split's vector env: one per env, at most this worker's share of the cores. A worker steps
    one split at a time, so its share of the cores (those the process may run on, over --num_workers) is what
    one vector env can use without the workers' threads contending for cores."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, min(num_envs, cores // max(1, num_workers)))


def make_atari_vector_env(name: str, cfg: Config | None, ctx: VectorEnvContext) -> VectorEnv:
    """ale-py's AtariVectorEnv of `ctx.num_envs` games of `name`, preprocessed as envs/atari.py does (module
    docstring). ImportError without ale-py, ValueError for a name that is no installed game."""
    ale_py = _import_ale()
    if ctx.render_mode:
        raise ValueError(f"--env_vectorization=ale does not render (render_mode={ctx.render_mode!r}): "
                         f"render through envs/atari.py")
    env_id = ale_id(name)
    spec = gym.spec(env_id)
    training = not ctx.evaluation
    env = ale_py.AtariVectorEnv(
        spec.kwargs["game"], ctx.num_envs,
        num_threads=env_threads(ctx.num_envs, int(getattr(cfg, "num_workers", 1) or 1)),
        frameskip=int(getattr(cfg, "env_frameskip", 4) or 4),
        repeat_action_probability=sticky_actions(env_id, cfg),
        full_action_space=spec.kwargs.get("full_action_space", False),
        max_num_frames_per_episode=spec.kwargs.get("max_num_frames_per_episode", 108_000),
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
        img_height=84, img_width=84, grayscale=True, stack_num=4, maxpool=True, noop_max=30, use_fire_reset=True,
        episodic_life=False, life_loss_info=training, reward_clipping=False)
    return AtariVectorPreprocessing(env, clip_rewards=training)


class AtariVectorPreprocessing(VectorWrapper):
    """Whole-game statistics, clipped rewards and the stack filled at a game's start, over ale-py's
    AtariVectorEnv made with `autoreset_mode=SAME_STEP` and `reward_clipping=False` (module docstring)."""

    def __init__(self, env: VectorEnv, clip_rewards: bool):
        super().__init__(env)
        n = env.num_envs
        self.clip_rewards = clip_rewards
        self.depth = env.single_observation_space.shape[0]  # frames in the stack
        self.game_return = np.zeros(n, dtype=np.float64)  # unclipped, all lives
        self.game_length = np.zeros(n, dtype=np.int64)  # agent steps
        self.game_start = np.zeros(n, dtype=np.int64)  # the emulator frame each sub-env's game began at
        self.age = np.zeros(n, dtype=np.int64)  # agent steps since the game began: the stack's frames it has

    def reset(self, *, seed: int | np.ndarray | None = None, options: dict[str, Any] | None = None):
        obs, info = self.env.reset(seed=seed, options=options)
        started = np.ones(self.num_envs, dtype=bool) if not options or "reset_mask" not in options \
            else np.asarray(options["reset_mask"], dtype=bool)
        self.game_return[started], self.game_length[started], self.age[started] = 0.0, 0, 0
        self.game_start = self._game_starts(info)
        self._fill_stack(obs, started)
        return obs, info

    def step(self, actions: np.ndarray):
        obs, raw, terminated, truncated, info = self.env.step(actions)
        raw = np.asarray(raw, dtype=np.float64)
        self.game_return += raw
        self.game_length += 1
        self.age += 1
        starts = self._game_starts(info)
        restarted = starts != self.game_start  # the env reset these on this step: their game ended
        self.game_start = starts
        ended = np.asarray(terminated) | np.asarray(truncated)
        if ended.any():
            self._end_episodes(obs, ended, restarted, info)
        else:
            self._fill_stack(obs)
        rewards = np.sign(raw) if self.clip_rewards else raw
        return obs, rewards, terminated, truncated, info

    def _end_episodes(self, obs: np.ndarray, ended: np.ndarray, restarted: np.ndarray, info: dict) -> None:
        """Each ended sub-env's final info (whole-game statistics, or None for a lost life) and final
        observation (a lost life's game goes on: its last observation is the one returned)."""
        over = ended & restarted
        returns = np.full(self.num_envs, None, dtype=object)
        lengths = np.full(self.num_envs, None, dtype=object)
        for e in np.flatnonzero(over).tolist():
            returns[e], lengths[e] = float(self.game_return[e]), int(self.game_length[e])
        info["final_info"] = {"episode_return": returns, "_episode_return": ended,
                              "episode_length": lengths, "_episode_length": ended}
        info["_final_info"] = ended
        final_obs = info["final_obs"]
        self._fill_stack(final_obs, over)  # a game over within its first steps
        self.game_return[over], self.game_length[over], self.age[over] = 0.0, 0, 0
        self._fill_stack(obs)
        life_lost = ended & ~restarted
        final_obs[life_lost] = obs[life_lost]
        info["_final_obs"] = ended

    def _fill_stack(self, obs: np.ndarray, rows: np.ndarray | None = None) -> None:
        """The vector env's stack holds zeros before a game's first frame: the sub-envs (of `rows`, else all)
        whose game is that young get the first frame there instead."""
        young = self.age < self.depth - 1
        if rows is not None:
            young &= rows
        for e in np.flatnonzero(young).tolist():
            first = self.depth - 1 - int(self.age[e])  # the game's first frame in the stack
            obs[e, :first] = obs[e, first]

    @staticmethod
    def _game_starts(info: dict) -> np.ndarray:
        return np.asarray(info["frame_number"], dtype=np.int64) - np.asarray(info["episode_frame_number"],
                                                                             dtype=np.int64)
