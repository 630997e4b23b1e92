"""Atari 2600 games through ale-py, with the standard DQN/PPO preprocessing.

`--env=atari_pong`, `--env=atari_breakout`, `--env=atari_space_invaders`, ... name a game: the part after
`atari_` is matched, ignoring case and underscores, against the ALE game names (`ALE/<Game>-v5`), so
`atari_spaceinvaders` works too; a few Sample Factory spellings are aliases (`atari_montezuma`).
Plain ALE ids (`--env=ALE/Pong-v5`) go through the same preprocessing. The env registry
(`envs/registry.py`) sends both kinds of name here unless a factory is registered under that name.

One wrapper, `AtariPreprocessing`, does everything on the raw emulator (frameskip 1 underneath):

- reset: the game is reset, then 1..`noop_max` (30) no-op frames, drawn from the env's seeded
  generator; games whose action 1 is FIRE get FIRE and then action 2 (one agent step each), as in the
  OpenAI-baselines `FireResetEnv`;
- step: the action is repeated for `frame_skip` frames (`--env_frameskip`, 4 in the Atari preset) and
  the observation is the pixel-wise max of the last two frames;
- 84×84 grayscale (area interpolation, written in numpy: no OpenCV needed), a stack of the last 4
  frames, channels first: `Box(0, 255, (4, 84, 84), uint8)`;
- training only (`EnvContext.evaluation` is False): episodic life (losing a life ends the episode for
  the learner, `terminated=True`, and the next `reset()` continues the same game with a no-op step
  instead of restarting it) and rewards clipped to their sign.

Episode statistics are those of the real game: every step that ends an episode for the learner
carries `info["episode_return"]` — the unclipped score of the whole game (all lives) when the game is
over or cut by the time limit, `None` when only a life was lost — and `info["episode_length"]`, the
game's length in agent steps. The rollout runner records these instead of summing the (clipped,
per-life) rewards it was given.

Sticky actions: `--repeat_action_probability` (default 0.25, the v5 value of Machado et al., 2018,
"Revisiting the ALE") for both kinds of name; 0 gives the deterministic emulator of the NoFrameskip-v4 envs
that the published Atari scores were run on. `make_atari_env(..., repeat_action_probability=p)` sets it
whatever the flag (register it with `functools.partial` under a name of your own). The v5 time limit of
108,000 frames (30 minutes of play) is kept, reported as `truncated`.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np

if TYPE_CHECKING:
    from sf_core.config import Config

ATARI_PREFIX = "atari_"
ALE_PREFIX = "ALE/"
INSTALL_HINT = "pip install -e '.[atari]'"

# Sample Factory's atari_* names whose game part is not the ALE name with its capitals dropped
ALIASES = {"montezuma": "montezumarevenge", "asteroid": "asteroids", "kongfumaster": "kungfumaster"}


def _import_ale():
    try:
        import ale_py
    except ImportError as exc:
        raise ImportError(f"Atari envs need ale-py, which is not installed ({exc}): {INSTALL_HINT}") from None
    gym.register_envs(ale_py)
    return ale_py


def ale_game_ids() -> dict[str, str]:
    """Normalized game name (lowercase, no underscores) -> `ALE/<Game>-v5` id, for every installed ROM."""
    _import_ale()
    ids = {}
    for env_id in gym.envs.registry:
        match = re.fullmatch(r"ALE/([A-Za-z0-9]+)-v5", env_id)
        if match:
            ids[match.group(1).lower()] = env_id
    return ids


def ale_id(name: str) -> str:
    """The ALE id an `atari_*` name or an `ALE/...` id stands for; ValueError if there is none."""
    ids = ale_game_ids()
    if name.startswith(ALE_PREFIX):
        if name not in gym.envs.registry:
            raise ValueError(f"unknown ALE id {name!r}; ids look like ALE/Pong-v5 ({len(ids)} games installed)")
        if "-ram" in name:
            raise ValueError(f"{name!r}: RAM observations are not supported by the Atari integration; "
                             f"use the image id ({name.replace('-ram', '')})")
        return name
    game = name[len(ATARI_PREFIX):].replace("_", "").lower()
    game = ALIASES.get(game, game)
    if game not in ids:
        close = sorted(g for g in ids if g.startswith(game[:3]))[:8]
        hint = f"; similar: {', '.join('atari_' + g for g in close)}" if close else ""
        raise ValueError(f"unknown Atari game {name!r}: no ALE/<Game>-v5 matches {game!r}{hint}")
    return ids[game]


def _area_matrix(src: int, dst: int) -> np.ndarray:
    """[dst, src] weights of area (box-filter) downsampling: each output pixel averages the source span
    it covers, partial pixels weighted by overlap (what OpenCV's INTER_AREA does when shrinking)."""
    scale = src / dst
    weights = np.zeros((dst, src), dtype=np.float32)
    for i in range(dst):
        lo, hi = i * scale, (i + 1) * scale
        for j in range(int(np.floor(lo)), min(src, int(np.ceil(hi)))):
            weights[i, j] = (min(hi, j + 1) - max(lo, j)) / scale
    return weights


class AreaResize:
    """uint8 [H, W] -> uint8 [h, w] with the weights of `_area_matrix`, as a few gathers and multiply-adds
    (each output pixel reads at most 3 source rows and 3 source columns for 210×160 -> 84×84).

    Not a matrix product on purpose: a multithreaded BLAS turns a product this small into a few hundred
    microseconds of thread wake-ups in every rollout worker process.
    """

    def __init__(self, src_shape: tuple[int, int], dst_shape: tuple[int, int]):
        self.row_index, row_weights = self._taps(_area_matrix(src_shape[0], dst_shape[0]))
        self.row_weights = row_weights[:, :, None]
        self.col_index, self.col_weights = self._taps(_area_matrix(src_shape[1], dst_shape[1]))

    @staticmethod
    def _taps(weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        taps = int((weights > 0).sum(1).max())
        index = np.zeros((taps, weights.shape[0]), dtype=np.intp)
        values = np.zeros((taps, weights.shape[0]), dtype=np.float32)
        for i, row in enumerate(weights):
            nonzero = np.nonzero(row)[0]
            index[:len(nonzero), i], values[:len(nonzero), i] = nonzero, row[nonzero]
        return index, values

    def __call__(self, frame: np.ndarray) -> np.ndarray:
        source = frame.astype(np.float32)
        rows = source[self.row_index[0]] * self.row_weights[0]
        for k in range(1, len(self.row_index)):
            rows += source[self.row_index[k]] * self.row_weights[k]
        out = rows[:, self.col_index[0]] * self.col_weights[0]
        for k in range(1, len(self.col_index)):
            out += rows[:, self.col_index[k]] * self.col_weights[k]
        return np.rint(out, out=out).astype(np.uint8)


class AtariPreprocessing(gym.Wrapper):
    """All of the standard preprocessing in one wrapper around an ALE env created with frameskip=1.

    The emulator is driven through `env.unwrapped.ale` directly (one `act` per frame, a screen grab
    only for the two frames that are pooled), which costs about a sixth less per frame than
    stepping the gymnasium env frame by frame.
    """

    def __init__(self, env: gym.Env, frame_skip: int = 4, noop_max: int = 30, screen_size: int = 84,
                 frame_stack: int = 4, episodic_life: bool = True, clip_rewards: bool = True,
                 fire_reset: bool = True):
        super().__init__(env)
        if frame_skip < 1 or frame_stack < 1 or noop_max < 0:
            raise ValueError(f"frame_skip and frame_stack must be >= 1 and noop_max >= 0, got "
                             f"{frame_skip}, {frame_stack}, {noop_max}")
        base = env.unwrapped
        self.ale = base.ale
        self.action_set = list(base._action_set)
        self.frame_skip, self.noop_max = frame_skip, noop_max
        self.episodic_life, self.clip_rewards = episodic_life, clip_rewards
        meanings = base.get_action_meanings()
        self.fire_reset = fire_reset and len(meanings) >= 3 and meanings[1] == "FIRE"

        height, width = self.ale.getScreenDims()
        self.buffers = np.zeros((2, height, width), dtype=np.uint8)
        self.resize = AreaResize((height, width), (screen_size, screen_size))
        self.stack = np.zeros((frame_stack, screen_size, screen_size), dtype=np.uint8)
        self.observation_space = gym.spaces.Box(0, 255, self.stack.shape, np.uint8)
        self.action_space = gym.spaces.Discrete(len(self.action_set))

        self.lives = 0
        self.game_over = True  # the next reset() restarts the game
        self.game_return, self.game_length = 0.0, 0

    # -- emulator -----------------------------------------------------------------------------------
    def _act(self, action: int) -> tuple[float, bool, bool]:
        """`frame_skip` frames of `action`; pools the last two screens into buffers[1]."""
        ale, code, skip = self.ale, self.action_set[action], self.frame_skip
        reward, grabbed_first = 0.0, False
        terminal = truncated = False
        for i in range(skip):
            reward += ale.act(code)
            terminal, truncated = ale.game_over(with_truncation=False), ale.game_truncated()
            if terminal or truncated:
                break
            if i == skip - 2:
                ale.getScreenGrayscale(self.buffers[0])
                grabbed_first = True
        ale.getScreenGrayscale(self.buffers[1])
        if grabbed_first:
            np.maximum(self.buffers[0], self.buffers[1], out=self.buffers[1])
        return float(reward), terminal, truncated

    def _push_frame(self, fill: bool = False) -> np.ndarray:
        frame = self.resize(self.buffers[1])
        if fill:
            self.stack[:] = frame
        else:
            self.stack[:-1] = self.stack[1:]
            self.stack[-1] = frame
        return self.stack.copy()

    # -- gymnasium API ------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        if self.game_over or seed is not None or not self.episodic_life:
            info = self._new_game(seed, options)
        else:
            # episodic life: a life was lost, the game goes on (its score keeps counting)
            info = {}
            reward, terminal, truncated = self._act(0)
            self.game_return += reward
            self.game_length += 1
            if not (terminal or truncated):
                terminal, truncated = self._press_fire()
            if terminal or truncated:  # practically never: the game ended during the no-op step
                info = self._new_game(None, options)
        self.lives = self.ale.lives()
        info["lives"] = self.lives
        return self._push_frame(fill=True), info

    def _new_game(self, seed: int | None, options: dict[str, Any] | None) -> dict[str, Any]:
        for _attempt in range(100):
            _, info = self.env.reset(seed=seed, options=options)
            seed = None
            self.game_over, self.game_return, self.game_length = False, 0.0, 0
            ended = False
            noops = int(self.env.unwrapped.np_random.integers(1, self.noop_max + 1)) if self.noop_max else 0
            for _ in range(noops):
                self.game_return += self.ale.act(self.action_set[0])
                if self.ale.game_over():
                    ended = True
                    break
            if not ended:
                self.ale.getScreenGrayscale(self.buffers[1])  # FIRE below replaces it with a pooled screen
                terminal, truncated = self._press_fire()
                ended = terminal or truncated
            if not ended:
                return dict(info)
        raise RuntimeError("the Atari game kept ending during its reset no-ops")

    def _press_fire(self) -> tuple[bool, bool]:
        if not self.fire_reset:
            return False, False
        for action in (1, 2):
            reward, terminal, truncated = self._act(action)
            self.game_return += reward
            self.game_length += 1
            if terminal or truncated:
                return terminal, truncated
        return False, False

    def step(self, action):
        reward, terminal, truncated = self._act(int(action))
        self.game_return += reward
        self.game_length += 1
        lives = self.ale.lives()
        life_lost = self.episodic_life and 0 < lives < self.lives
        self.lives = lives
        info: dict[str, Any] = {"lives": lives}
        if terminal or truncated:
            self.game_over = True
            info["episode_return"], info["episode_length"] = self.game_return, self.game_length
        elif life_lost:
            terminal = True
            info["episode_return"], info["episode_length"] = None, None  # the game goes on
        if self.clip_rewards:
            reward = float(np.sign(reward))
        return self._push_frame(), reward, terminal, truncated, info


def sticky_actions(env_id: str, cfg: Config | None, given: float | None = None) -> float:
    """The repeat_action_probability an ALE env is made with: `given`, else --repeat_action_probability, else
    (no config) the id's own."""
    if given is not None:
        return float(given)
    if cfg is not None and getattr(cfg, "repeat_action_probability", None) is not None:
        return float(cfg.repeat_action_probability)
    return float(gym.spec(env_id).kwargs.get("repeat_action_probability", 0.25))


@functools.cache
def _seeded_atari_env_class() -> type:
    """ale-py's AtariEnv, seeded when made. ale-py loads the game's ROM when an env is made and again to apply
    a seed given to reset(): 0.19 s each, most of an Atari env's start-up. Made with `first_seed`, a first
    reset(seed=first_seed) finds the emulator already as that reload would leave it (ROM loaded with that
    seed, the generators seeded from it, nothing played) and skips the reload."""
    from ale_py.env import AtariEnv

    class SeededAtariEnv(AtariEnv):
        def __init__(self, first_seed: int, **kwargs: Any):
            self.first_seed: int | None = first_seed
            super().__init__(**kwargs)  # seeds the game (seed_game below) and loads the ROM

        def seed_game(self, seed: int | None = None):
            return super().seed_game(self.first_seed if seed is None else seed)

        def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
            fresh = seed is not None and seed == self.first_seed
            self.first_seed = None
            return super().reset(seed=None if fresh else seed, options=options)

    return SeededAtariEnv


def make_atari_env(name: str, cfg: Config | None = None, ctx: Any = None, repeat_action_probability: float | None = None,
                   **wrapper_kwargs: Any) -> gym.Env:
    """The env factory for `atari_*` names and `ALE/...` ids (signature of `register_env` factories).

    `cfg.env_frameskip` is the frame skip (4 in the Atari preset); `repeat_action_probability`, where given,
    wins over `cfg.repeat_action_probability`. With `ctx.evaluation` the env plays
    whole games with raw rewards (no episodic life, no clipping), as `sf_core.enjoy` wants.
    `ctx.render_mode="rgb_array"` makes `render()` return the full-colour 210×160 screen.
    """
    _import_ale()
    env_id = ale_id(name)
    kwargs: dict[str, Any] = {"frameskip": 1, "obs_type": "grayscale",
                              "repeat_action_probability": sticky_actions(env_id, cfg, repeat_action_probability)}
    render_mode = getattr(ctx, "render_mode", None)
    if render_mode:
        kwargs["render_mode"] = render_mode
    seed = getattr(ctx, "seed", None)
    if seed is None:
        env = gym.make(env_id, **kwargs)
    else:  # seeded as it is made: its first reset(seed) then skips reloading the ROM (0.2 s an env)
        spec = dataclasses.replace(gym.spec(env_id), entry_point=_seeded_atari_env_class())
        env = gym.make(spec, first_seed=seed, **kwargs)
    evaluation = bool(getattr(ctx, "evaluation", False))
    options = {"frame_skip": int(getattr(cfg, "env_frameskip", 4) or 4), "episodic_life": not evaluation,
               "clip_rewards": not evaluation}
    options.update(wrapper_kwargs)
    return AtariPreprocessing(env, **options)
