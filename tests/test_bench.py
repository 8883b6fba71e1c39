"""benchmarks/bench.py: the FLOP count it reports by (model.train_flops) agrees with torch's counter,
its baselines compute what they claim, and a --quick run reports every figure."""
from __future__ import annotations

import contextlib
import io
import json
import math

import numpy as np
import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.testing import assert_close
from torch.utils.flop_counter import FlopCounterMode

from nmt import cpu_kernels
from benchmarks import bench
from config import PRESETS, get_config
from model import MultiHeadAttention, build_model, causal_mask, train_flops
from nmt.corpora.tokenizer import PAD_ID


@pytest.fixture
def tiny_config() -> dict:
    config = get_config()
    config.update(PRESETS["tiny"])
    config.update({"d_model": 16, "num_layers": 2, "num_heads": 2, "d_ff": 24, "dropout": 0.0})
    return config


@pytest.fixture
def stock_kernels():
    """Run with F.linear / F.dropout, which torch's FLOP counter understands."""
    cpu_kernels.CPU_FAST_PATHS = False
    yield
    cpu_kernels.CPU_FAST_PATHS = True


def padded_batch(lengths: list[tuple[int, int]], vocab: int, seed: int = 0) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    src_len, tgt_len = max(s for s, _ in lengths), max(t for _, t in lengths)
    src = torch.full((len(lengths), src_len), PAD_ID)
    tgt = torch.full((len(lengths), tgt_len), PAD_ID)
    for row, (s, t) in enumerate(lengths):
        src[row, :s] = torch.randint(4, vocab, (s,), generator=generator)
        tgt[row, :t] = torch.randint(4, vocab, (t,), generator=generator)
    return {"src": src, "tgt": tgt, "src_mask": (src != PAD_ID)[:, None, None, :],
            "tgt_mask": (tgt != PAD_ID)[:, None, None, :] & causal_mask(tgt_len)[None]}


def test_train_flops_hand_count() -> None:
    config = {"d_model": 4, "d_ff": 8, "num_layers": 1}
    # batch 2, S 3, T 5, V 10: encoder 456, decoder 1216, projection 200 multiply-adds per sentence
    assert train_flops(2, 3, 5, config, 10) == 3 * 2 * 2 * (456 + 1216 + 200)


def test_train_flops_equals_torch_flop_counter(tiny_config: dict, stock_kernels: None) -> None:
    torch.manual_seed(0)
    net = build_model(tiny_config, 30, 40).train()
    batch = padded_batch([(5, 7), (3, 2), (6, 4)], 30)
    # The math backend runs attention as batched matmuls, which the counter sees.
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        logits = net(batch["src"], batch["tgt"], batch["src_mask"], batch["tgt_mask"])
        logits.sum().backward()
    expected = train_flops(3, 6, 7, tiny_config, 40)
    assert counter.get_total_flops() == expected


def test_real_flops_count_each_sentence_at_its_own_lengths() -> None:
    config = {"d_model": 4, "d_ff": 8, "num_layers": 1}
    batch = padded_batch([(3, 5), (2, 1)], 10)
    batch = {"encoder_input": batch["src"], "decoder_input": batch["tgt"]}
    assert bench.real_flops(batch, config, 10) == train_flops(1, 3, 5, config, 10) + \
        train_flops(1, 2, 1, config, 10)
    assert bench.real_flops(batch, config, 10) < train_flops(2, 3, 5, config, 10)


def test_tutorial_attention_is_the_project_attention() -> None:
    torch.manual_seed(1)
    ours = MultiHeadAttention(16, 4, dropout=0.0).eval()
    tutorial = bench.TutorialAttention(16, 4, dropout=0.0).eval()
    with torch.no_grad():
        for name in ("w_q", "w_k", "w_v", "w_o"):
            getattr(tutorial, name).weight.copy_(getattr(ours, name).weight)
            getattr(ours, name).bias.zero_()
    x, memory = torch.randn(2, 5, 16), torch.randn(2, 6, 16)
    keep = torch.tensor([[True] * 6, [True] * 3 + [False] * 3])[:, None, None, :]
    assert_close(tutorial(x, memory, memory, keep.int()), ours(x, memory, memory, keep), atol=1e-5, rtol=1e-5)
    assert_close(tutorial(x, x, x, causal_mask(5)[None].int()), ours(x, x, x, causal_mask(5)[None]),
                 atol=1e-5, rtol=1e-5)


def test_tutorial_layer_norm_formula() -> None:
    x = torch.tensor([[1.0, 2.0, 3.0, 6.0]])
    norm = bench.TutorialLayerNorm(4)
    expected = (x - 3.0) / (math.sqrt(14 / 3) + 1e-6)  # unbiased std, eps outside the root
    assert_close(norm(x), expected)


def test_torch_transformer_honours_the_project_masks(tiny_config: dict) -> None:
    torch.manual_seed(2)
    net = bench.TorchTransformer(30, 40, tiny_config).eval()
    batch = padded_batch([(6, 5), (2, 3)], 30, seed=3)
    src, tgt = batch["src"][1:, :2], batch["tgt"][1:, :3]  # the second pair without its padding
    changed = batch["tgt"].clone()
    changed[0, 4] = 7 if changed[0, 4] != 7 else 8  # a future token must not change earlier outputs
    with torch.no_grad():
        both = net(batch["src"], batch["tgt"], batch["src_mask"])
        alone = net(src, tgt)
        later = net(batch["src"], changed, batch["src_mask"])
    assert_close(both[1, :3], alone[0], atol=1e-5, rtol=1e-5)  # padding is invisible
    assert_close(later[0, :4], both[0, :4], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(later[0, 4], both[0, 4])


def test_synthetic_lengths_resemble_opus_books() -> None:
    pairs = bench.synthetic_pairs(20000, 0, (8000, 10000))
    lengths = np.array([len(src.split()) for src, _ in pairs])
    assert 27 <= lengths.mean() <= 33
    assert 0.002 <= (lengths > 100).mean() <= 0.03
    assert pairs == bench.synthetic_pairs(20000, 0, (8000, 10000))[:len(pairs)]  # seeded


@pytest.fixture(scope="module")
def quick_run() -> tuple[str, dict]:
    """One `--quick` run on CPU (the two tests below share it): what it printed, and the result
    its table was made from."""
    results = []
    real_table = bench.table

    def table(result: dict) -> str:
        results.append(result)
        return real_table(result)

    out = io.StringIO()
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(out):
        patch.setattr(bench, "table", table)
        assert bench.main(["--quick", "--device", "cpu"]) == 0
    [result] = results
    return out.getvalue(), result


def test_quick_run_reports_every_figure(quick_run: tuple[str, dict]) -> None:
    result = json.loads(json.dumps(quick_run[1]))  # what --json prints
    assert cpu_kernels.CPU_FAST_PATHS  # the ablation switched it back on
    # Where --amp auto trains in bf16 (not the quick run's tiny preset), an fp32 row stands beside it.
    fp32_beside = {"project, fp32"} if result["training"]["project"]["dtype"] == "bfloat16" else set()
    assert set(result["training"]) == {"project", "project, stock PyTorch kernels", "torch.nn.Transformer",
                                       "tutorial"} | fp32_beside
    assert (result["peak_gflops"]["bfloat16"] is not None) == bench.native_bf16(torch.device("cpu"))
    for row in result["training"].values():
        assert row["tokens_per_s"] > 0 and row["flops_per_s"] > 0 and row["peak_memory_bytes"] > 0
        assert 0 < row["real_flops_per_s"] <= row["flops_per_s"]
    assert result["training"]["project"]["parameters"] == result["training"]["torch.nn.Transformer"]["parameters"]
    assert 0 <= result["data"]["padding_waste"] < 1
    greedy = result["decoding"]["greedy"]
    assert [(row["tokens"], row["cache"]) for row in greedy] == [(2, True), (2, False), (4, True), (4, False),
                                                                  (6, True), (6, False)]
    assert all(row["identical"] for row in greedy if row["cache"])
    assert result["decoding"]["single_sentence"]["output_tokens"] > 0
    assert len(result["targets"]) == 7
    assert result["ratios"]["vs_tutorial"] > 0 and result["peak_gflops"]["float32"] > 0
    translation = result["translation"]["rows"]
    assert [row["engine"] for row in translation] == ["pytorch", "ctranslate2 int8"]  # ctranslate2 is a requirement
    assert all(row["sentences_per_s"] > 0 and row["sentences"] == 6 for row in translation)
    resume = result["resume"]
    assert resume["killed_after"] in ("ckpt_00000010.pt", "ckpt_00000020.pt") and resume["steps"] == 30
    assert resume["bit_identical"] and resume["max_abs_difference"] == 0.0


def test_quick_table(quick_run: tuple[str, dict]) -> None:
    out = quick_run[0]
    assert "QUICK" in out and "torch.nn.Transformer" in out and "targets:" in out
    assert "translation, beam 5" in out and "bit-identical to an unbroken run" in out


def test_missing_datasource_is_one_line(tmp_path, capsys: pytest.CaptureFixture) -> None:
    assert bench.main(["--quick", "--datasource", str(tmp_path / "missing")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("bench.py: error:") and "missing" in err[-1]
