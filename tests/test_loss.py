"""loss.py: the chunked label-smoothed loss equals F.cross_entropy in value and gradient, in fp32,
bf16 and fp16 under a GradScaler (where tiny probabilities must survive the cast to fp16); every
device takes it, in chunks of the device's size; `fused=True` is torch's F.cross_entropy."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from nmt.training import loss
from nmt.training.loss import loss_sum
from nmt.corpora.tokenizer import PAD_ID


def reference(logits: torch.Tensor, label: torch.Tensor, smoothing: float) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), label.reshape(-1), ignore_index=PAD_ID,
                           label_smoothing=smoothing, reduction="sum")


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_loss_sum_equals_f_cross_entropy(monkeypatch: pytest.MonkeyPatch, smoothing: float,
                                         dtype: torch.dtype) -> None:
    """Value and gradient of the chunked loss equal F.cross_entropy's, across chunk borders,
    with padding rows ignored and the incoming gradient (here 0.37) applied."""
    monkeypatch.setattr(loss, "LOSS_CHUNK_ELEMENTS", 3 * 11)  # chunks of 3 rows
    torch.manual_seed(0)
    logits = (torch.randn(2, 5, 11) * 3).to(dtype).requires_grad_()
    label = torch.randint(4, 11, (2, 5))
    label[1, 3:] = PAD_ID
    ours = loss_sum(logits, label, smoothing)
    (grad,) = torch.autograd.grad(ours * 0.37, logits)
    expected_loss = reference(logits, label, smoothing)
    (expected,) = torch.autograd.grad(expected_loss * 0.37, logits)
    torch.testing.assert_close(ours, expected_loss)
    torch.testing.assert_close(grad, expected)
    assert grad.dtype == dtype and not grad[1, 3:].any()
    with torch.no_grad():  # validation: no gradient is computed or kept
        torch.testing.assert_close(loss_sum(logits, label, smoothing), expected_loss.detach())


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_fp16_gradient_is_scaled_before_it_is_rounded(smoothing: float) -> None:
    """fp16 logits under a GradScaler, as train.py runs fp16 autocast: one logit per row dominates,
    so the other probabilities are about 2e-9, below fp16's smallest number. Scaled by 2**16 they
    are about 1.3e-4, which fp16 holds. The gradient must equal what autograd gives through
    F.cross_entropy on the float logits under the same scaler, those entries included."""
    torch.manual_seed(0)
    logits = torch.randn(6, 12) * 0.1
    label = torch.randint(4, 12, (6,))
    logits[torch.arange(6), (label + 1) % 12] += 20.0  # a confident, wrong prediction per row
    label[5] = PAD_ID
    logits = logits.half()
    grads = []
    for compute in (lambda x: loss_sum(x, label, smoothing), lambda x: reference(x, label, smoothing)):
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 16)
        leaf = logits.clone().requires_grad_()
        scaler.scale(compute(leaf)).backward()
        grads.append(leaf.grad)
    ours, expected = grads
    assert ours.dtype == torch.float16
    tiny = torch.softmax(logits.float(), dim=-1) < 6e-8
    tiny[5] = False  # the padding row has no gradient at all
    assert tiny.sum() > 20 and (expected[tiny] != 0).all(), "premise: the scaled gradient survives fp16"
    torch.testing.assert_close(ours.float(), expected.float(), rtol=1e-3, atol=1e-7)


def test_the_chunked_form_everywhere_and_torchs_fused_one_when_asked() -> None:
    """`fused=True` (bench_gpu.py's alternative) is torch's own F.cross_entropy, equal in value and
    gradient; every device takes the chunked form otherwise."""
    torch.manual_seed(0)
    logits = torch.randn(3, 4, 9, requires_grad=True)
    label = torch.randint(4, 9, (3, 4))
    label[2, 2:] = PAD_ID
    chunked, fused = loss_sum(logits, label, 0.1), loss_sum(logits, label, 0.1, fused=True)
    assert type(chunked.grad_fn).__name__ == "_SmoothedCrossEntropySumBackward"
    assert "SmoothedCrossEntropySum" not in type(fused.grad_fn).__name__
    torch.testing.assert_close(fused, chunked)
    torch.testing.assert_close(torch.autograd.grad(fused, logits)[0], torch.autograd.grad(chunked, logits)[0])
    meta = loss_sum(logits.detach().to("meta").requires_grad_(), label.to("meta"), 0.1)
    assert type(meta.grad_fn).__name__ == "_SmoothedCrossEntropySumBackward"


def test_chunks_are_larger_off_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CPU's chunks fit its caches; a GPU's (here the meta device's) only bound the memory: a
    few log_softmax calls per batch instead of hundreds."""
    calls = []
    real = torch.log_softmax
    monkeypatch.setattr(torch, "log_softmax",
                        lambda *args, **kwargs: calls.append(args[0].size(0)) or real(*args, **kwargs))
    monkeypatch.setattr(loss, "LOSS_CHUNK_ELEMENTS", 4 * 10)
    monkeypatch.setattr(loss, "LOSS_CHUNK_ELEMENTS_GPU", 16 * 10)
    for device, rows in (("cpu", [4] * 8), ("meta", [16, 16])):
        calls.clear()
        loss_sum(torch.zeros(32, 10, device=device, requires_grad=True), torch.full((32,), 5, device=device), 0.1)
        assert calls == rows, device
