"""cpu_kernels.py: the CPU fast paths (oneDNN linear, 16-bit dropout masks, fused ReLU + dropout) compute
what F.linear, F.dropout and relu do, forward and backward."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from nmt import cpu_kernels
from config import PRESETS, get_config
from model import build_model, causal_mask
from nmt.corpora.tokenizer import PAD_ID


@pytest.fixture
def fast_paths():
    """Yields a setter for cpu_kernels.CPU_FAST_PATHS and always switches them back on."""
    yield lambda on: setattr(cpu_kernels, "CPU_FAST_PATHS", on)
    cpu_kernels.CPU_FAST_PATHS = True


def small_batch() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    src = torch.randint(4, 30, (2, 5), generator=generator)
    tgt = torch.randint(4, 40, (2, 7), generator=generator)
    src[1, 3:] = PAD_ID
    tgt[1, 2:] = PAD_ID
    return {"src": src, "tgt": tgt, "src_mask": (src != PAD_ID)[:, None, None, :],
            "tgt_mask": (tgt != PAD_ID)[:, None, None, :] & causal_mask(7)[None]}


@pytest.mark.parametrize("shape", [(3, 5, 12), (7, 40)])
@pytest.mark.parametrize("out_features", [8, 64])
def test_fast_linear_equals_f_linear(shape: tuple[int, ...], out_features: int, fast_paths,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    if not cpu_kernels.ONEDNN_AVAILABLE:
        pytest.skip("this torch build has no oneDNN linear")
    monkeypatch.setattr(cpu_kernels, "_ONEDNN", True)  # the oneDNN path even where the CPU would not take it
    torch.manual_seed(4)
    weight = torch.randn(out_features, shape[-1], requires_grad=True)
    bias = torch.randn(out_features, requires_grad=True)
    x = torch.randn(*shape[:-1], shape[-1] + 3)[..., 3:].requires_grad_()  # not contiguous
    results = []
    for fast in (True, False):
        fast_paths(fast)
        out = cpu_kernels.linear(x, weight, bias)
        grads = torch.autograd.grad((out * torch.arange(out.numel()).view_as(out).sin()).sum(), (x, weight, bias))
        results.append((out, *grads))
    for fast, stock in zip(*results):
        assert_close(fast, stock, atol=1e-5, rtol=1e-5)


def test_onednn_is_taken_only_where_a_gradient_flows(monkeypatch: pytest.MonkeyPatch) -> None:
    """Decoding (no_grad, or nothing that requires a gradient) takes F.linear: oneDNN keeps state
    for every input shape it sees (its caches grew a server by 36 MB a minute), and there was no
    faster. Training takes oneDNN."""
    monkeypatch.setattr(cpu_kernels, "_ONEDNN", True)
    taken = []
    monkeypatch.setattr(cpu_kernels._OneDNNLinear, "apply", lambda *args: taken.append(args) or F.linear(*args))
    weight, x = torch.randn(8, 4, requires_grad=True), torch.randn(3, 4)
    with torch.no_grad():
        cpu_kernels.linear(x, weight)
    cpu_kernels.linear(x, weight.detach())
    assert taken == []
    cpu_kernels.linear(x, weight)
    assert len(taken) == 1


def test_onednn_is_taken_only_on_avx512() -> None:
    avx512 = torch.backends.cpu.get_cpu_capability().startswith("AVX512")
    assert cpu_kernels._ONEDNN == (cpu_kernels.ONEDNN_AVAILABLE and avx512)


def test_fast_dropout_rate_scale_and_gradient() -> None:
    torch.manual_seed(5)
    x = torch.randn(200, 500, requires_grad=True)
    torch.manual_seed(6)
    out = cpu_kernels.dropout(x, 0.1, training=True)
    kept = out != 0
    dropped_share = 1 - kept.float().mean().item()
    assert abs(dropped_share - 0.1) < 0.005
    scale = 65536 / (65536 - 6554)  # p = 0.1 rounded to 6554 / 65536
    assert_close(out[kept], x[kept] * scale)
    (grad,) = torch.autograd.grad(out.sum(), x)
    assert_close(grad, kept.float() * scale)
    torch.manual_seed(6)
    assert torch.equal(cpu_kernels.dropout(x, 0.1, training=True), out)  # follows torch's seed
    assert cpu_kernels.dropout(x, 0.1, training=False) is x


def test_fused_relu_dropout_equals_relu_then_dropout() -> None:
    x = torch.randn(300, 400, requires_grad=True)
    weights = torch.randn(300, 400)  # a gradient that differs per element
    results = []
    for function in (lambda v: cpu_kernels.relu_dropout(v, 0.1, True),
                     lambda v: cpu_kernels.dropout(torch.relu(v), 0.1, True)):
        torch.manual_seed(7)  # the same random draws give the same mask
        out = function(x)
        results.append((out, *torch.autograd.grad((out * weights).sum(), x)))
    assert_close(results[0], results[1], atol=0, rtol=0)
    dropped_share = (results[0][0][x > 0] == 0).float().mean().item()  # of the values relu passes
    assert abs(dropped_share - 0.1) < 0.01
    assert torch.equal(cpu_kernels.relu_dropout(x, 0.1, False), torch.relu(x))


def test_stock_relu_dropout_off_the_fast_path(fast_paths) -> None:
    fast_paths(False)
    torch.manual_seed(8)
    x = torch.randn(50, 60)
    torch.manual_seed(9)
    ours = cpu_kernels.relu_dropout(x, 0.3, True)
    torch.manual_seed(9)
    assert torch.equal(ours, torch.nn.functional.dropout(torch.relu(x), 0.3, True))


def test_fast_paths_change_no_output_or_gradient(fast_paths) -> None:
    torch.manual_seed(6)
    config = get_config()
    config.update({**PRESETS["tiny"], "d_model": 16, "num_layers": 2, "num_heads": 2, "d_ff": 24, "dropout": 0.0})
    net = build_model(config, 30, 40).train()
    batch = small_batch()
    results = []
    for fast in (True, False):
        fast_paths(fast)
        net.zero_grad()
        logits = net(batch["src"], batch["tgt"], batch["src_mask"], batch["tgt_mask"])
        (logits * torch.linspace(-1, 1, logits.size(-1))).sum().backward()
        results.append((logits.detach(), *(p.grad.clone() for p in net.parameters())))
    assert_close(results[0], results[1], atol=1e-5, rtol=1e-4)

