"""Faster CPU routes for the model's matrix products and dropout, and the allocator setting.

model.py calls `linear`, `Linear`, `dropout`, `Dropout` and `relu_dropout` from here. On CPU in fp32
(outside autocast and torch.compile) they take faster routes than torch's defaults; everywhere else
they are exactly F.linear, F.dropout and relu. Results and gradients are those of the stock ops up to
float rounding and the dropout rate's rounding to 1/65536 (tests/test_fast_paths.py). Switch them all
off with `CPU_FAST_PATHS = False` (bench.py measures both ways).

- Matrix products: torch runs fp32 products on MKL, which takes slower code paths on non-Intel CPUs.
  oneDNN (bundled with torch) picks its kernels from the CPU's own features: on the AMD EPYC
  machines measured (bench.py times both) it was faster than torch.mm with AVX-512 and slower with
  AVX2 only. So oneDNN is taken only where torch reports AVX-512, and only for products a gradient
  will flow through (not for decoding: `linear`).
- Dropout: F.dropout's mask comes from ATen's bernoulli_, which costs about four times as much as
  drawing 16 random bits per element.
- The feed-forward block's ReLU and dropout are one step that keeps a single d_ff activation per
  position for backward instead of three, the largest saving of activation memory.
- `keep_freed_memory` is process-wide: only train.py's command line applies it (config key
  `keep_freed_memory`), never an import. `release_freed_memory` hands the heap's free pages back
  (serve.py, once the model is idle).
"""
from __future__ import annotations

import ctypes

import torch
import torch.nn.functional as F
from torch import nn

CPU_FAST_PATHS = True
ONEDNN_AVAILABLE = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
_ONEDNN = ONEDNN_AVAILABLE and torch.backends.cpu.get_cpu_capability().startswith("AVX512")


def _cpu_fast_path(x: torch.Tensor) -> bool:
    return CPU_FAST_PATHS and x.device.type == "cpu" and not torch.compiler.is_compiling()


def _onednn_matmul(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """a @ b.T (+ bias) on oneDNN, for 2-D a and b of any strides."""
    return torch.ops.mkldnn._linear_pointwise(a, b, bias, "none", [], "")


class _OneDNNLinear(torch.autograd.Function):
    """x @ weight.T + bias with all three products (forward, grad of x, grad of weight) on oneDNN."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        rows = x.reshape(-1, x.size(-1)).contiguous()
        ctx.save_for_backward(rows, weight)
        ctx.input_shape, ctx.has_bias = x.shape, bias is not None
        return _onednn_matmul(rows, weight, bias).view(*x.shape[:-1], weight.size(0))

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        rows, weight = ctx.saved_tensors
        grad = grad.reshape(-1, grad.size(-1)).contiguous()
        grad_x = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_x = _onednn_matmul(grad, weight.t()).view(ctx.input_shape)
        if ctx.needs_input_grad[1]:
            # grad.T @ rows; oneDNN is fastest with the larger dimension as its output's columns.
            if grad.size(1) >= rows.size(1):
                grad_weight = _onednn_matmul(rows.t(), grad.t()).t()
            else:
                grad_weight = _onednn_matmul(grad.t(), rows.t())
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_bias = grad.sum(0)
        return grad_x, grad_weight, grad_bias


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear; fp32 on an AVX-512 CPU (outside autocast and torch.compile) runs on oneDNN where a
    gradient will flow, in training. Without one (decoding, under no_grad) it never does: there
    oneDNN was no faster (28.5 against 28.7 sentences/s, mixed greedy and beam-5 batches) and kept
    state for every new input shape, in ideep's cache and oneDNN's primitive cache (1,024 entries
    each, about 250 KiB an entry): a server's memory grew by 36 MB a minute under mixed requests."""
    if _ONEDNN and _cpu_fast_path(x) and x.dtype == weight.dtype == torch.float32 and x.numel() \
            and not torch.is_autocast_enabled("cpu") and torch.is_grad_enabled() \
            and (x.requires_grad or weight.requires_grad):
        return _OneDNNLinear.apply(x, weight, bias)
    return F.linear(x, weight, bias)


class Linear(nn.Linear):
    """nn.Linear (same parameters and state_dict) computed with `linear`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)


class _ScaledMask(torch.autograd.Function):
    """x * keep * scale, keeping only the boolean mask (1 byte per element) for backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, keep: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.save_for_backward(keep)
        ctx.scale = scale
        return (x * keep).mul_(scale)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        keep, = ctx.saved_tensors
        return (grad * keep).mul_(ctx.scale), None, None


class _ReluDropout(torch.autograd.Function):
    """relu(x) * keep * scale, keeping only its output for backward: the gradient passes, times
    scale, exactly where the output is positive. The next layer keeps that output anyway, so the
    feed-forward block stores one d_ff activation per position instead of three."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, keep: torch.Tensor, scale: float) -> torch.Tensor:
        out = torch.relu(x).mul_(keep).mul_(scale)
        ctx.save_for_backward(out)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        out, = ctx.saved_tensors
        # relu's own backward kernel: grad where out > 0, else 0 (an eighth of masked_fill_'s time)
        return torch.ops.aten.threshold_backward(grad, out, 0).mul_(ctx.scale), None, None


def _keep_mask(x: torch.Tensor, p: float) -> tuple[torch.Tensor, float]:
    """Which elements of x dropout keeps, and their scale, from 16 random bits per element."""
    dropped = round(p * 65536)
    # One 64-bit draw gives four 16-bit numbers, uniform on [-32768, 32767].
    draws = torch.randint(-2 ** 63, 2 ** 63 - 1, ((x.numel() + 3) // 4,), dtype=torch.int64, device=x.device)
    bits = draws.view(torch.int16)[:x.numel()].view(x.shape)
    return bits >= dropped - 32768, 65536 / (65536 - dropped)


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """F.dropout; on CPU each element's fate is decided by 16 random bits, so p is rounded to a
    multiple of 1/65536 (0.1 becomes 0.100006) and the kept values are scaled by 1 / (1 - that)."""
    if not training or p == 0.0:
        return x
    if not _cpu_fast_path(x) or p >= 1.0:
        return F.dropout(x, p, True)
    return _ScaledMask.apply(x, *_keep_mask(x, p))


def relu_dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """dropout(relu(x), p, training), on CPU as one step that stores less (see _ReluDropout)."""
    if not training or p == 0.0:
        return torch.relu(x)
    if not _cpu_fast_path(x) or p >= 1.0:
        return F.dropout(torch.relu(x), p, True)
    return _ReluDropout.apply(x, *_keep_mask(x, p))


class Dropout(nn.Dropout):
    """nn.Dropout computed with `dropout`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)


def keep_freed_memory() -> None:
    """Make glibc's malloc keep freed memory for reuse instead of handing it back to the OS.

    By default every block over 32 MB (at base size: feed-forward activations, logits) is mapped
    afresh and page-faulted in on first touch, every training step on CPU: at the paper-base size
    with 4k-token batches that was a quarter of the step's time (bench.py). The cost is that the
    process keeps its peak heap until it exits, so this changes every later allocation of the
    process: train.py applies it from its command line only, after data preparation. Does nothing
    where the C library is not glibc."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt, malloc_trim = libc.mallopt, libc.malloc_trim
    except (OSError, AttributeError):
        return
    malloc_trim(0)  # first hand back what was freed so far (data preparation): it is not what gets reused
    m_trim_threshold, m_mmap_max = -1, -4  # <malloc.h>
    mallopt(m_mmap_max, 0)
    mallopt(m_trim_threshold, 2 ** 31 - 1)


def release_freed_memory() -> None:
    """Hand the free pages of glibc's heap back to the system (malloc_trim): after a burst of large
    batches the heap keeps its high-water mark resident, mostly free. Costs a few milliseconds, and
    the pages' first touch afterwards; serve.py calls it once the model has been idle a while. Does
    nothing where the C library is not glibc."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
