"""What a sample is: one table of fields, from which every buffer, copy and batch is derived.

A trajectory slot is time-major, `[rollout + 1, rows, ...]` per field: row t holds the observation at
step t and, once inference has acted on it, the action, log-prob, value and policy version chosen
there; the reward and end flags of step t are in row t too. Row `rollout` (T) holds the next
observation, and what inference chose for it.

Two properties of a field decide where its rows go:
- `bootstrap`: row T reaches the learner (the bootstrap observation, its value, and the recurrent state
  it was seen with). Every other field trains on rows 0..T-1 only.
- `carried`: row T of a finished slot becomes row 0 of the split's next slot, so the next trajectory
  starts where this one stopped without another forward pass.

The same names are the keys of the learner's batch (`sf_core.algo.algorithms`): no field is renamed on the way.

The row-0 rule. Inference is asked to act on a row for one of three reasons (`RowOrigin`), and each
reason says what the row before it holds. The truncation bootstrap and the recurrent state depend on
it, so `check_request` enforces it where requests arrive.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Literal

import gymnasium as gym
import torch

from sf_core.algo.distributions import action_storage
from sf_core.algo.observations import obs_storage


@dataclass(frozen=True)
class SampleField:
    name: str
    # "obs" / "action": the space's storage shape and dtype; "rnn_state": [state size]; "scalar": ()
    shape_of: Literal["obs", "action", "rnn_state", "scalar"]
    dtype: torch.dtype | None  # for "scalar" and "rnn_state"; None: the space's
    bootstrap: bool  # row T goes to the learner
    carried: bool  # row T becomes row 0 of the next slot
    written_by: str
    meaning: str

    def rows(self, rollout: int) -> int:
        """Rows of this field in a training batch."""
        return rollout + 1 if self.bootstrap else rollout


FIELDS: tuple[SampleField, ...] = (
    SampleField("obs", "obs", None, True, True, "rollout worker",
                "observation at step t; row T: the bootstrap observation"),
    SampleField("actions", "action", None, False, True, "inference worker", "action chosen at step t"),
    SampleField("log_prob", "scalar", torch.float32, False, True, "inference worker",
                "log-probability of that action under the behaviour policy"),
    SampleField("behaviour_values", "scalar", torch.float32, True, True, "inference worker",
                "V(obs) by the behaviour policy, in reward units; row T bootstraps the trajectory; "
                "not written where the learner computes values (Config.values_at_learner)"),
    SampleField("rewards", "scalar", torch.float32, False, False, "rollout worker",
                "reward of step t, scaled by --reward_scale and clipped"),
    SampleField("dones", "scalar", torch.bool, False, False, "rollout worker", "step t terminated its episode"),
    SampleField("truncated", "scalar", torch.bool, False, False, "rollout worker",
                "step t was cut by a time limit (not terminated): bootstrap from trunc_values"),
    SampleField("trunc_values", "scalar", torch.float32, False, False, "inference worker",
                "V(final observation) of a truncated step"),
    SampleField("policy_version", "scalar", torch.int64, False, True, "inference worker",
                "version of the weights that chose the action (policy lag = learner's version - this)"),
    SampleField("rnn_states", "rnn_state", torch.float32, True, True, "inference worker",
                "recurrent state the action was chosen with (width 0 without a core): the learner unrolls from it"),
    SampleField("inactive", "scalar", torch.bool, False, True, "rollout worker",
                "a multi-agent env's agent that finished early and waits: its row is no sample"),
    SampleField("policy_id", "scalar", torch.int16, False, True, "rollout worker",
                "the policy acting for this row's agent (--policy_mapping, drawn at its episode start); another "
                "policy's batcher marks the row inactive in its copy"),
)

FIELD = {f.name: f for f in FIELDS}
BATCH_KEYS: tuple[str, ...] = tuple(f.name for f in FIELDS)
CARRIED: tuple[str, ...] = tuple(f.name for f in FIELDS if f.carried)


@dataclass(frozen=True)
class SampleSpaces:
    """What shapes a sample: the (per-agent) spaces and the recurrent state's width (0: no core)."""

    obs_space: gym.Space
    action_space: gym.Space
    rnn_state_size: int = 0

    def storage(self, f: SampleField) -> tuple[tuple[int, ...], torch.dtype]:
        """Per-row shape and dtype of a field."""
        if f.shape_of == "obs":
            return obs_storage(self.obs_space)
        if f.shape_of == "action":
            return action_storage(self.action_space)
        if f.shape_of == "rnn_state":
            return (self.rnn_state_size,), f.dtype
        return (), f.dtype


def batch_tensors(spaces: SampleSpaces, rollout: int, trajectories: int) -> dict[str, torch.Tensor]:
    """Zeroed tensors of one training batch, time-major: `[field.rows(rollout), trajectories, ...]`."""
    batch = {}
    for f in FIELDS:
        shape, dtype = spaces.storage(f)
        batch[f.name] = torch.zeros((f.rows(rollout), trajectories) + shape, dtype=dtype)
    return batch


class RowOrigin(IntEnum):
    """Why a split asks inference to act on a row, and so what the row before it holds."""

    AFTER_RESET = 0  # row 0 of fresh episodes: no previous row; recurrent state zero
    CARRIED = 1  # row 0 carried from the previous slot (sync mode acts again with the new weights):
    #              its recorded recurrent state is the one to act with
    AFTER_STEP = 2  # row t >= 1, filled by the step of row t-1: its dones/truncated say where episodes ended


class RowRuleError(AssertionError):
    pass


def check_request(row: int, origin: int, has_truncation: bool) -> None:
    """The row-0 rule: rows 0 come from a reset or a carry-over, every other row from a step, and only
    a step can truncate (the truncated step is then row - 1 of the same slot)."""
    if (row == 0) != (origin != RowOrigin.AFTER_STEP) or (has_truncation and origin != RowOrigin.AFTER_STEP):
        raise RowRuleError(f"policy request for row {row} with origin {RowOrigin(origin).name} "
                           f"(has_truncation={has_truncation}) breaks the row-0 rule (sf_core/contracts/sample.py)")
