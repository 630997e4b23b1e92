"""Reads the records of an offline W&B run (`run-<id>.wandb`), as `wandb sync` would upload them.

The file is a LevelDB-style log: a 7-byte header (":W&B", magic, version), then 32 KiB blocks of
chunks (crc32, length, type: 1 full, 2 first, 3 middle, 4 last), each record a wandb `Record` protobuf.
"""

from __future__ import annotations

import glob
import os
import struct
from typing import Iterator

from wandb.proto import wandb_internal_pb2

BLOCK = 32768
HEADER = 7


def run_files(experiment_path: str) -> list[str]:
    """The experiment's offline runs' record files, oldest first."""
    return sorted(glob.glob(os.path.join(experiment_path, "wandb", "offline-run-*", "run-*.wandb")))


def records(path: str) -> Iterator[wandb_internal_pb2.Record]:
    with open(path, "rb") as f:
        data = f.read()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    pos, chunks = HEADER, b""
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        _, length, kind = struct.unpack("<IHB", data[pos:pos + HEADER]) if left >= HEADER else (0, 0, 0)
        if kind == 0:  # the rest of a block too short for a chunk header is padding
            pos += left
            continue
        chunks += data[pos + HEADER:pos + HEADER + length]
        pos += HEADER + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(chunks)
            chunks = b""
            yield record


def history(path: str) -> list[dict[str, str]]:
    """Every logged row: {key: JSON value}."""
    return [{item.key or "/".join(item.nested_key): item.value_json for item in r.history.item}
            for r in records(path) if r.WhichOneof("record_type") == "history"]


def run_record(path: str):
    return next(r.run for r in records(path) if r.WhichOneof("record_type") == "run")
