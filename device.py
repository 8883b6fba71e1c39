"""Which device a program runs on: one rule for train.py, translate.py, evaluate.py, serve.py and bench.py.

`--device auto` takes CUDA when there is a GPU, else Apple's MPS, else the CPU. Asking for a device
that is not there is refused with one line (ConfigError, which the programs print and exit 2 on),
never a silent fall back to the CPU.
"""
from __future__ import annotations

import torch

from config import ConfigError


def pick_device(choice: str, local_rank: int = 0) -> torch.device:
    """The torch.device for the `device` config value; under torchrun, CUDA device `local_rank`."""
    if choice == "auto":
        if torch.cuda.is_available():
            choice = "cuda"
        elif torch.backends.mps.is_available():
            choice = "mps"
        else:
            choice = "cpu"
    if choice == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError("--device cuda: CUDA is not available (use --device cpu or auto)")
        return torch.device("cuda", local_rank)
    if choice == "mps":
        if not torch.backends.mps.is_available():
            raise ConfigError("--device mps: MPS is not available (use --device cpu or auto)")
        return torch.device("mps")
    if choice != "cpu":
        raise ConfigError(f"--device must be one of auto, cpu, cuda, mps, got {choice!r}")
    return torch.device("cpu")
