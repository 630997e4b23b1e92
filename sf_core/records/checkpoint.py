"""Checkpoint files: written atomically, the last few kept, plus the best: by mean episode return, or with
--eval_every_env_steps by evaluation (a checkpoint held for its evaluation becomes best.pt, and
`evaluation.json` records the best and the last evaluations, so the best survives a resume).

A checkpoint is a dict of tensors and plain Python values, loadable with `torch.load(weights_only=True)`:
model (state_dict, including normalisation statistics), optimizer, policy version, samples trained,
learning rate, RNG states, the runner's counters (env frames, episodes, best return), the algorithm's other
models (`extra_models`) and the run's flags (`config`).
"""

from __future__ import annotations

import glob
import json
import os
import random
import shutil

import numpy as np
import torch

from sf_core.contracts.names import per_policy
from sf_core.records.atomic_file import replacing

PATTERN = "checkpoint_v{version:09d}_f{frames:012d}.pt"
BEST = "best.pt"
HELD = "eval_"  # prefix of a checkpoint held for its evaluation, beside the periodic ones
EVALUATIONS = "evaluation.json"


def checkpoint_dir(experiment_path: str, policy: int = 0, num_policies: int = 1) -> str:
    """`checkpoint/` for a run of one policy; `checkpoint_p{K}/` for each policy of several."""
    return os.path.join(experiment_path, per_policy("checkpoint", policy, num_policies))


def list_checkpoints(directory: str) -> list[str]:
    """Periodic checkpoints, oldest first (names sort by version)."""
    return sorted(glob.glob(os.path.join(directory, "checkpoint_v*_f*.pt")))


def version_of(path: str) -> int:
    """The policy version in a checkpoint's file name (PATTERN)."""
    return int(os.path.basename(path).split("_v", 1)[1].split("_", 1)[0])


def latest_checkpoint(directory: str) -> str | None:
    found = list_checkpoints(directory)
    return found[-1] if found else None


def find_checkpoint(experiment_path: str, which: str = "latest", policy: int = 0, num_policies: int = 1) -> str | None:
    """`latest`, `best` (of that policy's folder), or a path."""
    directory = checkpoint_dir(experiment_path, policy, num_policies)
    if which == "latest":
        return latest_checkpoint(directory)
    if which == "best":
        path = os.path.join(directory, BEST)
        return path if os.path.exists(path) else latest_checkpoint(directory)
    return which if os.path.exists(which) else None


def save(directory: str, state: dict, keep: int, is_best: bool) -> str:
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, PATTERN.format(version=state["version"], frames=state["runner"]["frames"]))
    _atomic_save(state, path)
    if is_best:
        _atomic_copy(path, os.path.join(directory, BEST))
    for old in list_checkpoints(directory)[:-keep]:
        os.remove(old)
    return path


def hold_for_evaluation(path: str) -> str | None:
    """A second name for checkpoint `path`, which its rotation (--keep_checkpoints) leaves alone until the
    evaluation decides whether it becomes best.pt; None if the file is gone already."""
    held = os.path.join(os.path.dirname(path), HELD + os.path.basename(path))
    try:
        os.link(path, held)  # instant, and no second copy on disk
    except FileNotFoundError:
        return None
    except FileExistsError:
        pass
    except OSError:  # a file system without hard links
        try:
            _atomic_copy(path, held)
        except FileNotFoundError:
            return None
    return held


def make_best(held: str) -> None:
    """A held checkpoint becomes best.pt (atomically)."""
    os.replace(held, os.path.join(os.path.dirname(held), BEST))
    _fsync_dir(os.path.dirname(held))


def drop_held(directory: str) -> None:
    """Held checkpoints whose evaluation never came (the run stopped meanwhile)."""
    for path in glob.glob(os.path.join(directory, HELD + "checkpoint_v*_f*.pt")):
        os.remove(path)


def load_evaluations(directory: str) -> dict:
    """evaluation.json of a policy's folder: {"best": ..., "last": ...}; empty if there is none (yet)."""
    try:
        with open(os.path.join(directory, EVALUATIONS)) as f:
            found = json.load(f)
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def save_evaluations(directory: str, evaluations: dict) -> None:
    with replacing(os.path.join(directory, EVALUATIONS)) as tmp, open(tmp, "w") as f:
        json.dump(evaluations, f, indent=2)
        f.flush()
        os.fsync(f.fileno())


def load(path: str, map_location: str = "cpu") -> dict:
    return torch.load(path, map_location=map_location, weights_only=True)


def _atomic_save(state: dict, path: str) -> None:
    # A crash mid-write leaves a .tmp file, never a half-written checkpoint under the real name; a failed
    # write (a full disk) leaves neither.
    with replacing(path) as tmp:
        try:
            with open(tmp, "wb") as f:
                torch.save(state, f)
                f.flush()
                os.fsync(f.fileno())
        except RuntimeError as exc:  # torch reports a refused write as "unexpected pos": the OSError is its context
            if isinstance(exc.__context__, OSError):
                raise exc.__context__ from None
            raise
    _fsync_dir(os.path.dirname(path))


def _atomic_copy(src: str, dst: str) -> None:
    with replacing(dst) as tmp:
        shutil.copyfile(src, tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
    _fsync_dir(os.path.dirname(dst))


def _fsync_dir(directory: str) -> None:
    """Make a rename durable: the directory entry itself must reach the disk."""
    fd = os.open(directory or ".", os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def rng_state() -> dict:
    np_state = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "numpy": {"keys": torch.from_numpy(np_state[1].astype(np.int64)), "pos": int(np_state[2]),
                  "has_gauss": int(np_state[3]), "cached_gaussian": float(np_state[4])},
        "python": [list(x) if isinstance(x, tuple) else x for x in random.getstate()],
    }


def restore_rng(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state(("MT19937", n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"],
                         n["cached_gaussian"]))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
