"""Reading gymnasium's `VectorEnv` API (gymnasium 1.x): one sub-env's part of a batch, and how the env resets
the sub-envs whose episodes ended.

- A batched observation is an array with the sub-envs on its first axis, or a dict / tuple of such arrays
  (the batched form of a Dict / Tuple space): `env_row` takes sub-env e's observation out of it.
- A vectorized info dict holds each key's values in an array over the sub-envs, beside a `_key` mask of those
  that have it; nested dicts are vectorized the same way: `env_info` rebuilds sub-env e's plain info dict.
- `metadata["autoreset_mode"]` (`gymnasium.vector.AutoresetMode`) says what a step after an episode's end
  returns; an env that does not say resets on the next step, gymnasium's default.
"""

from __future__ import annotations

from typing import Any

from gymnasium.vector import AutoresetMode, VectorEnv


def env_row(batch: Any, e: int) -> Any:
    """Sub-env e's observation in a batched one."""
    if isinstance(batch, dict):
        return {key: env_row(value, e) for key, value in batch.items()}
    if isinstance(batch, tuple):
        return tuple(env_row(value, e) for value in batch)
    return batch[e]


def env_info(info: dict, e: int) -> dict:
    """Sub-env e's info dict in a vectorized one: the keys whose `_key` mask holds e (or that have no mask)."""
    found = {}
    for key, value in info.items():
        if key.startswith("_"):
            continue
        mask = info.get("_" + key)
        if mask is not None and not mask[e]:
            continue
        found[key] = env_info(value, e) if isinstance(value, dict) else value[e]
    return found


def autoreset_mode(env: VectorEnv) -> AutoresetMode:
    """How `env` resets sub-envs whose episode ended; raises ValueError for a mode gymnasium does not define."""
    mode = getattr(env, "metadata", {}).get("autoreset_mode", AutoresetMode.NEXT_STEP)
    try:
        return AutoresetMode(mode)
    except ValueError:
        raise ValueError(f"{type(env).__name__}.metadata['autoreset_mode'] is {mode!r}, not one of gymnasium's "
                         f"AutoresetMode values ({', '.join(m.value for m in AutoresetMode)})") from None
