"""The training loss: label-smoothed cross-entropy summed over the non-padding target tokens.

`loss_sum(logits, label, label_smoothing)` equals
`F.cross_entropy(logits.float(), label, ignore_index=PAD_ID, label_smoothing=s, reduction="sum")`
in value and gradient (tests/test_loss.py), but computes the gradient during the forward pass, a few
hundred rows at a time. Over a 10k vocabulary the loss is the step's largest tensor: computed the
usual way, the log-probabilities are kept for backward, which then allocates two more tensors of
their size. Here only the gradient outlives the forward pass and backward scales it in place: about
0.5 GB less peak RSS at the paper-base size with 4k-token batches (bench.py). The caller may free
the logits before backward.

The gradient is stored in the logits' dtype, except for fp16: softmax minus the smoothed target has
entries far below fp16's smallest number (6e-8), which a GradScaler exists to protect by scaling
the loss before anything is rounded to fp16. So for fp16 logits the gradient is kept in fp32 and
rounded to fp16 only in backward, after the scale (grad_output) is applied, as autograd does for
F.cross_entropy. bf16 has fp32's exponent range and needs no scaler, so it is stored as bf16.

On CUDA too the loss is chunked, in larger chunks (LOSS_CHUNK_ELEMENTS_GPU: a few per batch):
`F.cross_entropy` on fp32 logits, as autocast runs it, keeps an fp32 copy of the logits and their
log-probabilities and allocates a third fp32 tensor of their size in backward, about 12 GB at 32k
tokens of a 32k vocabulary; here the step holds its bf16 logits and the bf16 gradient, 4 GB, which
leaves a GPU room for longer batches. Its ~36 bytes of memory traffic per logit are about those of
the fused form (~32), and inside a CUDA graph its few dozen kernels cost no launches
(cuda_graphs.py). `fused=True` takes F.cross_entropy itself: benchmarks/bench_gpu.py times both.

Train normalises the sum by the target tokens of the whole optimizer step (train.py).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from nmt.corpora.tokenizer import PAD_ID

LOSS_CHUNK_ELEMENTS = 2 ** 22  # 16 MB of fp32 log-probabilities at a time: a CPU's caches
LOSS_CHUNK_ELEMENTS_GPU = 2 ** 26  # 256 MB off the CPU (CUDA; the meta device of a rehearsal): they bound memory


class _SmoothedCrossEntropySum(torch.autograd.Function):
    """The summed loss of flat logits (N, V) and labels (N,), its gradient computed in forward."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, label: torch.Tensor, smoothing: float) -> torch.Tensor:
        elements = LOSS_CHUNK_ELEMENTS if logits.device.type == "cpu" else LOSS_CHUNK_ELEMENTS_GPU
        rows = max(1, elements // logits.size(-1))
        total = torch.zeros((), dtype=torch.float32, device=logits.device)
        grad = None
        if ctx.needs_input_grad[0]:
            stored = torch.float32 if logits.dtype == torch.float16 else logits.dtype
            grad = torch.empty(logits.shape, dtype=stored, device=logits.device)
        for start in range(0, logits.size(0), rows):
            # dtype=: on CUDA one kernel reads the bf16 logits and writes fp32 (no fp32 copy first)
            log_probs = torch.log_softmax(logits[start:start + rows], dim=-1, dtype=torch.float32)
            target = label[start:start + rows]
            real = (target != PAD_ID).unsqueeze(1)
            picked = log_probs.gather(1, target.unsqueeze(1))
            # -(1 - s) log p(label) - (s / V) sum_j log p(j), as F.cross_entropy smooths
            loss = -(1 - smoothing) * picked - smoothing / log_probs.size(-1) * log_probs.sum(-1, keepdim=True)
            total += loss.masked_fill(~real, 0.0).sum()
            if grad is not None:
                # d/dlogits = softmax - the smoothed target distribution
                chunk = log_probs.exp_().sub_(smoothing / log_probs.size(-1))
                chunk.scatter_add_(1, target.unsqueeze(1), torch.full_like(picked, smoothing - 1))
                grad[start:start + rows] = chunk.masked_fill_(~real, 0.0)
        ctx.grad, ctx.logits_dtype = grad, logits.dtype
        return total

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        grad, ctx.grad = ctx.grad, None
        if grad is None:
            raise RuntimeError("backward through loss_sum a second time is not supported")
        return grad.mul_(grad_output.to(grad.dtype)).to(ctx.logits_dtype), None, None


def loss_sum(logits: torch.Tensor, label: torch.Tensor, label_smoothing: float,
             fused: bool = False) -> torch.Tensor:
    """Summed label-smoothed cross-entropy over the non-padding target tokens (fp32 softmax) of
    logits (..., V) and labels (...): the chunked form, or torch's `F.cross_entropy` when `fused`
    (module docstring)."""
    logits, label = logits.reshape(-1, logits.size(-1)), label.reshape(-1)
    if fused:
        return F.cross_entropy(logits.float(), label, ignore_index=PAD_ID, label_smoothing=label_smoothing,
                               reduction="sum")
    return _SmoothedCrossEntropySum.apply(logits, label, label_smoothing)
