"""Which device a program runs on: one rule for train.py, translate.py, evaluate.py, serve.py and bench.py.

`--device auto` takes CUDA when there is a GPU, else Apple's MPS, else the CPU. Asking for a device
that is not there is refused with one line (ConfigError, which the programs print and exit 2 on),
never a silent fall back to the CPU. A machine with an NVIDIA driver whose GPU torch cannot use (a
CPU-only torch build, or a driver older than the CUDA version torch was built for) is named in one
line on stderr, with the likely cause, before `auto` settles on the CPU.

On CUDA, attention runs on FlashAttention and the memory-efficient kernel, never on cuDNN's
(`use_shape_free_attention`): cuDNN builds a plan for every new shape, and this project's shapes are
almost all new (token-budget batches, a longer key at every decoded token).
"""
from __future__ import annotations

import functools
import os
import re
import shutil
import sys
from pathlib import Path

import torch

from config import ConfigError


# Linux's NVIDIA kernel module writes its version here; elsewhere the driver installs nvidia-smi.
NVIDIA_DRIVER_VERSION = Path("/proc/driver/nvidia/version")


def nvidia_driver_present() -> bool:
    """Whether this machine has an NVIDIA driver, that is an NVIDIA GPU."""
    return NVIDIA_DRIVER_VERSION.exists() or shutil.which("nvidia-smi") is not None


def unusable_gpu_reason() -> str | None:
    """Why torch cannot use this machine's NVIDIA GPU; None where it can, or where there is none."""
    if torch.cuda.is_available() or not nvidia_driver_present():
        return None
    if torch.version.cuda is None:
        return (f"this machine has an NVIDIA GPU, but torch {torch.__version__} is a CPU-only build "
                f"(install a CUDA build of torch: see the README)")
    if "CUDA_VISIBLE_DEVICES" in os.environ:
        return (f"this machine has an NVIDIA GPU, but torch {torch.__version__} sees none: "
                f"CUDA_VISIBLE_DEVICES={os.environ['CUDA_VISIBLE_DEVICES']!r} may hide it")
    try:
        found = re.search(r"Kernel Module\s+(\S+)", NVIDIA_DRIVER_VERSION.read_text())
        driver = f"driver {found[1]}" if found else "the NVIDIA driver"
    except OSError:
        driver = "the NVIDIA driver"
    return (f"this machine has an NVIDIA GPU, but torch {torch.__version__} cannot use it: {driver} is likely "
            f"too old for CUDA {torch.version.cuda}, which this torch was built for (update the driver, or "
            f"install a torch build for an older CUDA: see the README)")


@functools.cache
def warn_unusable_gpu() -> None:
    """Say once per process, on stderr, why the GPU is not used, if that is so."""
    if reason := unusable_gpu_reason():
        print(f"warning: {reason}; running on the CPU", file=sys.stderr, flush=True)


def use_shape_free_attention() -> None:
    """Take cuDNN's attention out of `scaled_dot_product_attention`'s choices, for the whole process.
    cuDNN builds and caches an execution plan per (batch, heads, lengths) shape, which takes hundreds
    of milliseconds; FlashAttention and the memory-efficient kernel need no plan, and between them
    take every form model.py asks for (causal, no mask, a source padding mask; dropout)."""
    torch.backends.cuda.enable_cudnn_sdp(False)


def pick_device(choice: str, local_rank: int = 0) -> torch.device:
    """The torch.device for the `device` config value; under torchrun, CUDA device `local_rank`."""
    if choice == "auto":
        if torch.cuda.is_available():
            choice = "cuda"
        elif torch.backends.mps.is_available():
            choice = "mps"
        else:
            warn_unusable_gpu()
            choice = "cpu"
    if choice == "cuda":
        if not torch.cuda.is_available():
            reason = unusable_gpu_reason()
            raise ConfigError("--device cuda: CUDA is not available" + (f": {reason}" if reason else
                                                                         " (use --device cpu or auto)"))
        use_shape_free_attention()
        return torch.device("cuda", local_rank)
    if choice == "mps":
        if not torch.backends.mps.is_available():
            raise ConfigError("--device mps: MPS is not available (use --device cpu or auto)")
        return torch.device("mps")
    if choice != "cpu":
        raise ConfigError(f"--device must be one of auto, cpu, cuda, mps, got {choice!r}")
    return torch.device("cpu")
