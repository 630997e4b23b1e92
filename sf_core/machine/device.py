"""The device a run trains on: --device as torch names it, with the CPU where CUDA is absent."""

from __future__ import annotations

import logging

import torch

from sf_core.algo.model import has_fast_bfloat16
from sf_core.config import Config

log = logging.getLogger("sf_core")


def training_device(cfg: Config) -> str:
    """--device resolved for training; says at start-up where --mixed_precision would speed this hardware up."""
    device = resolve_device(cfg.device)
    fast, kind = has_fast_bfloat16(device), "GPU" if device.startswith("cuda") else "CPU"
    if not cfg.mixed_precision and fast:
        log.info("this %s computes bfloat16 in hardware: --mixed_precision=True trains up to ~2x faster where "
                 "the learner is the bottleneck (docs/performance.md)", kind)
    elif cfg.mixed_precision and not fast:
        log.warning("--mixed_precision=True on a %s without bfloat16 hardware (a GPU before compute capability 8.0, a "
                    "CPU without AMX or AVX512-BF16): bfloat16 is emulated there, slower than float32", kind)
    return device


def resolve_device(requested: str) -> str:
    """--device as torch names it: gpu means cuda; a CUDA device on a machine without one falls back to the CPU."""
    device = "cuda" if requested == "gpu" else requested
    if device.startswith("cuda") and not torch.cuda.is_available():
        log.warning("--device=%s requested but CUDA is not available here: using the CPU", requested)
        return "cpu"
    return device
