"""The numeric precision of a run: one rule, asked by train.py and benchmarks/bench.py, decided nowhere else.

- `amp_dtype`: `--amp auto` is bf16 on CUDA GPUs that have it natively (compute capability 8.0 and
  up: A100, H100, RTX 30xx/40xx), fp16 with a GradScaler on older CUDA GPUs (V100 sm_70, T4 sm_75:
  their bf16 is emulated and slow, which `torch.cuda.is_bf16_supported()` counts as support), bf16
  on CPUs with bf16 instructions (AVX-512 BF16 or AMX: AMD Zen 4, Intel Sapphire Rapids and later,
  where the cpu preset's step is faster than in fp32: docs/speed.md), and off on
  other CPUs, where bf16 is emulated and slower than fp32, and on Apple's MPS (fp32 is the path
  tested there). `--amp fp16`/`bf16` ask for autocast on any device, where both run for real.
- `grad_scaler`: the loss scaler, enabled for fp16 only (bf16 has fp32's exponent range).
- `load_scaler_state`: a checkpoint's scaler state, across a change of `--amp` in either direction.
- `allow_tf32`: fp32 matrix products on the tensor cores of CUDA GPUs that have TF32 (8.0 and up).
- `inference_dtype`: what the PyTorch engine decodes in: bf16 on CUDA GPUs that have it natively,
  fp16 on older ones, fp32 elsewhere, CPUs with bf16 included (translator.py; the log-probabilities
  stay fp32; the CPU's decoding steps are small, and its fp32 path is the one measured).
"""
from __future__ import annotations

import contextlib
from typing import Any

import torch

# The first loss scale of an fp16 run (torch's default); the scaler halves it at each overflow.
INITIAL_SCALE = 2.0 ** 16


def native_bf16_and_tf32(device: torch.device) -> bool:
    """Whether a CUDA device has bf16 and TF32 in its tensor cores (compute capability >= 8.0)."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 0)


def native_bf16_cpu() -> bool:
    """Whether this CPU multiplies bf16 in hardware (AVX-512 BF16 or AMX tiles), as ATen's cpuinfo
    reports it; oneDNN emulates bf16 elsewhere, at a loss against fp32."""
    return torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()


def amp_dtype(config: dict[str, Any], device: torch.device) -> torch.dtype | None:
    """The autocast dtype of the `amp` config value on `device`; None for fp32."""
    choice = config["amp"]
    if choice == "auto":
        if device.type == "cpu":
            return torch.bfloat16 if native_bf16_cpu() else None
        if device.type != "cuda":
            return None
        return torch.bfloat16 if native_bf16_and_tf32(device) else torch.float16
    return {"off": None, "bf16": torch.bfloat16, "fp16": torch.float16}[choice]


def inference_dtype(device: torch.device) -> torch.dtype | None:
    """The autocast dtype of decoding on `device`; None for fp32 (any CPU, MPS)."""
    if device.type != "cuda":
        return None
    return amp_dtype({"amp": "auto"}, device)


def autocast_context(device: torch.device, dtype: torch.dtype | None,
                     cache: bool = True) -> contextlib.AbstractContextManager:
    """Autocast to `dtype` on `device`, or nothing for fp32. `cache` False for work captured as CUDA
    graphs (nmt/training/cuda_graphs.py), as torch's CUDA graph notes ask: no cast weight is kept
    from one graph's capture for another's."""
    return torch.autocast(device.type, dtype=dtype, cache_enabled=cache) if dtype else contextlib.nullcontext()


def grad_scaler(device: torch.device, dtype: torch.dtype | None) -> torch.amp.GradScaler:
    """The loss scaler: on for fp16, a no-op otherwise (its state_dict is then empty)."""
    return torch.amp.GradScaler(device.type, init_scale=INITIAL_SCALE, enabled=dtype == torch.float16)


def load_scaler_state(scaler: torch.amp.GradScaler, state: dict[str, Any]) -> str | None:
    """Load a checkpoint's scaler state; the run may have changed `--amp` since. An fp16 run from a
    checkpoint without a scale (fp32 or bf16) starts a fresh scaler; a saved scale that this run has
    no use for is dropped. Returns a line for the log in those two cases."""
    if scaler.is_enabled() and not state:
        return f"the checkpoint has no fp16 loss scale: starting a fresh one at {INITIAL_SCALE:g}"
    if not scaler.is_enabled() and state:
        return f"dropping the checkpoint's fp16 loss scale ({state['scale']:g}): this run does not use fp16"
    scaler.load_state_dict(state)
    return None


def allow_tf32(device: torch.device) -> bool:
    """Let fp32 matrix products use TF32 on a CUDA GPU that has it; whether it did. The legacy
    switch, not `set_float32_matmul_precision("high")`: that one also moves the CPU's oneDNN products
    to TF32, and torch 2.13's per-backend `fp32_precision` setter makes the process-wide getter
    (which inductor reads) raise. Convolutions (cuDNN) use TF32 by default; the model has none."""
    if not native_bf16_and_tf32(device):
        return False
    torch.backends.cuda.matmul.allow_tf32 = True
    return True
