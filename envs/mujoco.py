"""MuJoCo locomotion envs (gymnasium[mujoco], v5 ids): plain `gymnasium.make`, plus video-friendly rendering.

Training needs nothing special: `--env=HalfCheetah-v5` (or Hopper-v5, Walker2d-v5, Ant-v5, Humanoid-v5)
is made with `gymnasium.make` and gets its preset from `sf_core/run/presets.py`. When an env is made with
`render_mode="rgb_array"` (`sf_core.enjoy --save_video=True`), this factory

- picks the model's `track` camera, which follows the body (the v5 default camera of HalfCheetah and
  Ant stays where the episode started, so a good runner leaves the picture within seconds);
- sets `MUJOCO_GL=egl` when it is unset and there is no X display, so rendering works headless
  (set `MUJOCO_GL=osmesa` yourself where there is no EGL library).
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING, Any

import gymnasium as gym

if TYPE_CHECKING:
    from sf_core.config import Config

# the v5 locomotion envs whose XML has a body-tracking camera named "track"
TRACKING = re.compile(r"(HalfCheetah|Hopper|Walker2d|Ant|Humanoid|HumanoidStandup|Swimmer)-v5")


def is_mujoco_name(name: str) -> bool:
    return TRACKING.fullmatch(name) is not None


def make_mujoco_env(name: str, cfg: Config | None = None, ctx: Any = None) -> gym.Env:
    """The factory for the v5 locomotion ids (signature of `register_env` factories)."""
    render_mode = getattr(ctx, "render_mode", None)
    if not render_mode:
        return gym.make(name)
    if render_mode == "rgb_array" and "DISPLAY" not in os.environ:
        os.environ.setdefault("MUJOCO_GL", "egl")  # read when the first renderer is created
    return gym.make(name, render_mode=render_mode, camera_name="track")
