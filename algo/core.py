"""The recurrent core between encoder and heads (`--use_rnn`): a GRU or LSTM cell.

A core maps (features [B, F], state [B, state_size]) -> (output [B, out_features], new state).
State is one flat tensor per env so the buffers hold it like any other per-step value; an LSTM keeps
its (h, c) pair concatenated. A zero state starts an episode.
"""

from __future__ import annotations

import torch
from torch import nn


class RecurrentCore(nn.Module):
    def __init__(self, kind: str, input_size: int, hidden_size: int):
        super().__init__()
        if kind not in ("gru", "lstm"):
            raise ValueError(f"unknown rnn_type {kind!r}; known: gru, lstm")
        self.kind, self.hidden_size = kind, hidden_size
        self.cell = nn.GRUCell(input_size, hidden_size) if kind == "gru" else nn.LSTMCell(input_size, hidden_size)
        self.state_size = hidden_size if kind == "gru" else 2 * hidden_size
        self.out_features = hidden_size

    def forward(self, x: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.kind == "gru":
            h = self.cell(x, state)
            return h, h
        h, c = self.cell(x, tuple(state.chunk(2, dim=-1)))
        return h, torch.cat((h, c), dim=-1)
