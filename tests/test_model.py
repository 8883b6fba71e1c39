"""model.py: shapes, padding invariance, causality, tied weights, a golden attention check
against PyTorch's own implementation, the mask-free attention forms (equal to the tutorial masks
on real positions, and what a real training run passes to scaled_dot_product_attention), and a
tiny model that actually learns."""
from __future__ import annotations

import contextlib
import io
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.testing import assert_close

import train
from dataset import BilingualDataset
from nmt.training.loss import loss_sum
from synthetic_data import tiny_corpus
from nmt.inference.translator import DecodingOptions, TorchTranslator
from model import (DecoderBlock, EncoderBlock, InputEmbeddings, MultiHeadAttention, PositionalEncoding, Transformer,
                   build_model, build_transformer, causal_mask, set_dropout)
from config import parse_config
from nmt.corpora.tokenizer import PAD_ID

SRC_VOCAB, TGT_VOCAB, SEQ_LEN = 23, 29, 32


def small_model(norm_first: bool = True, **kwargs) -> Transformer:
    torch.manual_seed(0)
    return build_transformer(SRC_VOCAB, TGT_VOCAB, SEQ_LEN, SEQ_LEN, d_model=16, N=2, h=4, dropout=0.0, d_ff=32,
                             norm_first=norm_first, **kwargs).eval()


def padded(rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """A (B, L) batch padded to the longest row, and its (B, 1, 1, L) padding mask."""
    batch = torch.full((len(rows), max(map(len, rows))), PAD_ID)
    for i, row in enumerate(rows):
        batch[i, :len(row)] = torch.tensor(row)
    return batch, (batch != PAD_ID)[:, None, None, :]


def target_mask(tgt: torch.Tensor) -> torch.Tensor:
    return (tgt != PAD_ID)[:, None, None, :] & causal_mask(tgt.size(1))[None]


def test_output_shapes() -> None:
    model = small_model()
    src, src_mask = padded([[2, 5, 6, 7, 3], [2, 8, 3]])
    tgt = torch.tensor([[2, 9, 10, 11], [2, 12, PAD_ID, PAD_ID]])
    memory = model.encode(src, src_mask)
    assert memory.shape == (2, 5, 16)
    hidden = model.decode(memory, src_mask, tgt, target_mask(tgt))
    assert hidden.shape == (2, 4, 16)
    logits = model.project(hidden)
    assert logits.shape == (2, 4, TGT_VOCAB)
    assert_close(model(src, tgt, src_mask, target_mask(tgt)), logits)


def test_build_model_follows_the_config() -> None:
    config = parse_config(["--preset", "tiny", "--num_layers", "2"])
    model = build_model(config, 40, 50)
    assert len(model.encoder.layers) == len(model.decoder.layers) == 2
    assert model.src_embed.embedding.weight.shape == (40, config["d_model"])
    assert model.projection_layer.proj.out_features == 50
    assert model.src_pos.pe.shape == (config["seq_len"], config["d_model"])


@pytest.mark.parametrize("norm_first", [True, False])
def test_padding_never_changes_the_real_tokens(norm_first: bool) -> None:
    model = small_model(norm_first)
    short_src, long_src = [2, 5, 6, 3], [2, 7, 8, 9, 10, 11, 12, 3]
    short_tgt, long_tgt = [2, 13, 14], [2, 15, 16, 17, 18, 19]
    src_alone, src_alone_mask = padded([short_src])
    src_batch, src_batch_mask = padded([short_src, long_src])
    tgt_alone, _ = padded([short_tgt])
    tgt_batch, _ = padded([short_tgt, long_tgt])
    assert src_batch.size(1) > src_alone.size(1) and tgt_batch.size(1) > tgt_alone.size(1)

    memory_alone = model.encode(src_alone, src_alone_mask)
    memory_batch = model.encode(src_batch, src_batch_mask)
    assert_close(memory_batch[0, :len(short_src)], memory_alone[0], atol=1e-5, rtol=1e-5)

    hidden_alone = model.decode(memory_alone, src_alone_mask, tgt_alone, target_mask(tgt_alone))
    hidden_batch = model.decode(memory_batch, src_batch_mask, tgt_batch, target_mask(tgt_batch))
    assert_close(hidden_batch[0, :len(short_tgt)], hidden_alone[0], atol=1e-5, rtol=1e-5)

    # the check has teeth: without the mask the padding does change the output
    unmasked = model.encode(src_batch, None)
    assert not torch.allclose(unmasked[0, :len(short_src)], memory_alone[0], atol=1e-3)


def test_decoder_is_causal() -> None:
    model = small_model()
    src, src_mask = padded([[2, 5, 6, 7, 3]])
    memory = model.encode(src, src_mask)
    tgt = torch.tensor([[2, 9, 10, 11, 12, 13]])
    changed = tgt.clone()
    changed[0, 4] = 20
    mask = target_mask(tgt)
    before = model.decode(memory, src_mask, tgt, mask)
    after = model.decode(memory, src_mask, changed, mask)
    assert_close(after[:, :4], before[:, :4])  # positions before the change cannot see it
    assert not torch.allclose(after[:, 4:], before[:, 4:])
    # and the teacher-forced logits equal step-by-step prefixes
    for length in range(1, tgt.size(1) + 1):
        prefix = tgt[:, :length]
        assert_close(model.decode(memory, src_mask, prefix, target_mask(prefix))[:, -1], before[:, length - 1],
                     atol=1e-5, rtol=1e-5)


def test_tied_embeddings_share_one_matrix() -> None:
    model = build_transformer(30, 30, 16, 16, d_model=16, N=1, h=2, d_ff=32, tie_embeddings=True)
    shared = model.src_embed.embedding.weight
    assert model.tgt_embed.embedding.weight is shared
    assert model.projection_layer.proj.weight is shared
    assert len({p.data_ptr() for p in model.parameters()}) == len(list(model.parameters()))
    untied = build_transformer(30, 30, 16, 16, d_model=16, N=1, h=2, d_ff=32)
    saved = sum(p.numel() for p in untied.parameters()) - sum(p.numel() for p in model.parameters())
    assert saved == 2 * 30 * 16
    with pytest.raises(ValueError, match="30 and 31"):
        build_transformer(30, 31, 16, 16, d_model=16, N=1, h=2, d_ff=32, tie_embeddings=True)


def test_set_dropout_reaches_every_dropout_of_the_model() -> None:
    """A model built with dropout 0 and set to 0.3 draws the very masks of one built with 0.3: no
    dropout (embeddings, attention weights, feed-forward, sublayer outputs) is left at its old rate."""
    src, src_mask = padded([[3, 4, 5, 6, 7], [8, 9, 10]])
    tgt, _ = padded([[1, 11, 12, 13], [1, 14, 15]])

    def trained_output(model: Transformer) -> torch.Tensor:
        torch.manual_seed(1)
        return model.train()(src, tgt, src_mask)

    def built(dropout: float) -> Transformer:
        torch.manual_seed(0)
        return build_transformer(SRC_VOCAB, TGT_VOCAB, SEQ_LEN, SEQ_LEN, d_model=16, N=2, h=4, dropout=dropout,
                                 d_ff=32)

    changed = built(0.0)
    set_dropout(changed, 0.3)
    assert_close(trained_output(changed), trained_output(built(0.3)))
    set_dropout(changed, 0.0)
    assert_close(trained_output(changed), changed.eval()(src, tgt, src_mask))


@pytest.mark.parametrize("masking", ["padding", "causal"])
def test_multi_head_attention_equals_pytorchs(masking: str) -> None:
    torch.manual_seed(1)
    d_model, heads, length = 24, 4, 7
    ours = MultiHeadAttention(d_model, heads, dropout=0.0).eval()
    reference = nn.MultiheadAttention(d_model, heads, dropout=0.0, batch_first=True).eval()
    with torch.no_grad():
        reference.in_proj_weight.copy_(torch.cat([ours.w_q.weight, ours.w_k.weight, ours.w_v.weight]))
        reference.in_proj_bias.copy_(torch.cat([ours.w_q.bias, ours.w_k.bias, ours.w_v.bias]))
        reference.out_proj.weight.copy_(ours.w_o.weight)
        reference.out_proj.bias.copy_(ours.w_o.bias)
    query = torch.randn(3, length, d_model)
    memory = torch.randn(3, length, d_model)
    if masking == "padding":  # cross-attention over a padded source
        lengths = torch.tensor([7, 4, 2])
        keep = torch.arange(length)[None, :] < lengths[:, None]  # (B, S), True = attend
        expected, _ = reference(query, memory, memory, key_padding_mask=~keep)
        actual = ours(query, memory, memory, keep[:, None, None, :])
    else:  # masked self-attention
        keep = causal_mask(length)[0]
        expected, _ = reference(query, query, query, attn_mask=~keep)
        actual = ours(query, query, query, keep[None, None])
    assert_close(actual, expected, atol=1e-5, rtol=1e-5)


def test_embeddings_are_scaled_and_positions_are_sinusoidal() -> None:
    torch.manual_seed(0)
    embed = InputEmbeddings(8, 10)
    tokens = torch.tensor([[1, 4]])
    assert_close(embed(tokens), embed.embedding.weight[tokens] * math.sqrt(8))
    positions = PositionalEncoding(8, 50, dropout=0.0)
    out = positions(torch.zeros(1, 50, 8))
    for pos in (0, 1, 17, 49):
        for i in range(4):
            angle = pos / 10000 ** (2 * i / 8)
            assert out[0, pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-5)
            assert out[0, pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-5)
    assert_close(positions(torch.zeros(1, 3, 8), offset=17), out[:, 17:20])
    with pytest.raises(ValueError, match="longer than the model's 50"):
        positions(torch.zeros(1, 51, 8))
    assert "pe" not in positions.state_dict()  # derived from the shape, not stored in checkpoints


def test_no_attention_matrices_are_kept_after_forward() -> None:
    model = small_model()
    src, src_mask = padded([[2, 5, 6, 7, 8, 9, 3]])
    tgt = torch.tensor([[2, 9, 10, 11, 12, 13, 14]])
    model(src, tgt, src_mask, target_mask(tgt))
    for name, module in model.named_modules():
        for attribute, value in vars(module).items():
            if isinstance(value, torch.Tensor) and attribute not in ("_parameters", "_buffers"):
                assert value.dim() < 4, f"{name}.{attribute} keeps a {tuple(value.shape)} tensor"


def test_the_model_learns_a_toy_translation(toy_translator) -> None:
    """1 layer, d_model 32, 600 Adam steps on "one two three." -> "tre due uno." (words mapped and
    order reversed): greedy decoding of unseen sentences must be (nearly) perfect."""
    toy = toy_translator
    assert toy.first_loss > 2.0 and toy.last_loss < 0.1
    seen = set(toy.train_pairs)
    unseen = [p for p in toy.pairs(300, seed=99) if p not in seen][:200]
    assert len(unseen) >= 150
    outputs = toy.translator().translate_best([s for s, _ in unseen], DecodingOptions())
    exact = sum(out == ref for out, (_, ref) in zip(outputs, unseen)) / len(unseen)
    assert exact >= 0.95, f"only {exact:.0%} of unseen sentences translated exactly"


# ---------------------------------------------------------------------------- mask-free attention

def dataset_of(pairs: list[tuple[list[int], list[int]]]) -> BilingualDataset:
    """A BilingualDataset of (source ids, target ids) pairs, as the store would hold them."""
    offsets = np.zeros((2, len(pairs) + 1), dtype=np.int64)
    offsets[0, 1:] = np.cumsum([len(src) for src, _ in pairs])
    offsets[1, 1:] = np.cumsum([len(tgt) for _, tgt in pairs])
    flat = [np.array([i for pair in pairs for i in pair[side]], dtype=np.int64) for side in (0, 1)]
    return BilingualDataset(flat[0], flat[1], offsets)


TRAINING_PAIRS = [([5, 6, 7, 8, 9], [10, 11, 12, 13]), ([8, 9], [14]), ([10, 11, 12], [15, 16, 17, 18, 19, 20]),
                  ([12, 13, 14, 15, 16], [21, 22])]


@pytest.mark.parametrize("rows, padded_source", [([0, 1, 2], True), ([0, 3], False)])
def test_training_batches_equal_the_tutorial_masks_on_real_positions(rows: list[int], padded_source: bool) -> None:
    """collate's batches carry no target mask (causal, no mask tensor) and no source mask when no
    source is padded; on every real position the model computes what the tutorial masks give."""
    model = small_model()
    batch = dataset_of(TRAINING_PAIRS).collate(rows)
    src, tgt = batch["encoder_input"], batch["decoder_input"]
    assert "tgt_mask" not in batch and ("src_mask" in batch) == padded_source
    src_mask = (src != PAD_ID)[:, None, None, :]
    real_src, real_tgt = src != PAD_ID, tgt != PAD_ID
    assert_close(model.encode(src, batch.get("src_mask"))[real_src], model.encode(src, src_mask)[real_src],
                 atol=1e-5, rtol=1e-5)
    assert_close(model(src, tgt, batch.get("src_mask"))[real_tgt],
                 model(src, tgt, src_mask, target_mask(tgt))[real_tgt], atol=1e-5, rtol=1e-5)


def test_an_explicit_target_mask_is_applied_exactly_as_given() -> None:
    """The tutorial API's tgt_mask replaces the causal default; nothing is added to it."""
    model = small_model()
    src, src_mask = padded([[2, 5, 6, 7, 3]])
    tgt = torch.tensor([[2, 9, 10, 11, 12, 13]])
    changed = tgt.clone()
    changed[0, 2] = 20
    hide_2 = causal_mask(6)[None].clone()
    hide_2[..., 3:, 2] = False  # later positions may not see position 2
    for mask in (hide_2, hide_2.int()):  # boolean, or 0/1 as the tutorials build it
        before, after = model(src, tgt, src_mask, mask), model(src, changed, src_mask, mask)
        assert_close(after[:, [0, 1, 3, 4, 5]], before[:, [0, 1, 3, 4, 5]])
        assert not torch.allclose(after[:, 2], before[:, 2])
    causal_before, causal_after = model(src, tgt, src_mask), model(src, changed, src_mask)
    assert not torch.allclose(causal_after[:, 3:], causal_before[:, 3:])  # by default they do see it
    everything = torch.ones(1, 1, 6, 6, dtype=torch.bool)  # not causal: the first position sees the change
    first = [model(src, target, src_mask, everything)[:, 0] for target in (tgt, changed)]
    assert not torch.allclose(*first)


@dataclass
class AttentionCall:
    """One call of scaled_dot_product_attention, and which attention of which block made it."""

    role: str  # "encoder", "decoder self" or "cross"
    cached: bool  # an incremental decoding step (model.KVCache)
    training: bool  # gradients on: a training step, not validation or decoding
    mask: torch.Tensor | None
    is_causal: bool
    plot: bool  # within Translator.cross_attention, whose rerun passes its own causal mask through the tutorial API


def called_from(frame, function: Callable) -> bool:
    while frame is not None:
        if frame.f_code is function.__code__:
            return True
        frame = frame.f_back
    return False


def attention_role(frame) -> tuple[str, bool]:
    """The role of the MultiHeadAttention whose call stack holds `frame`, and whether its decoder
    block runs a cached step."""
    attention = role = None
    while frame is not None:
        owner = frame.f_locals.get("self")
        if attention is None and isinstance(owner, MultiHeadAttention):
            attention = owner
        elif role is None and isinstance(owner, EncoderBlock):
            return "encoder", False
        elif role is None and isinstance(owner, DecoderBlock):
            role = "decoder self" if owner.self_attention is attention else "cross"
        if frame.f_code is DecoderBlock.forward.__code__:
            return role, frame.f_locals["cache"] is not None
        frame = frame.f_back
    raise AssertionError("scaled_dot_product_attention called from outside the model's blocks")


@pytest.fixture
def attention_calls(monkeypatch: pytest.MonkeyPatch) -> list[AttentionCall]:
    """Every call of F.scaled_dot_product_attention, recorded, then made for real."""
    calls: list[AttentionCall] = []
    real = F.scaled_dot_product_attention

    def recorder(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, **kwargs):
        caller = sys._getframe(1)
        calls.append(AttentionCall(*attention_role(caller), torch.is_grad_enabled(), attn_mask, is_causal,
                                   called_from(caller, TorchTranslator.cross_attention)))
        return real(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", recorder)
    return calls


def test_a_training_run_passes_masks_only_where_padding_needs_them(tmp_path: Path,
                                                                  attention_calls: list[AttentionCall]) -> None:
    """train.py for one step, its validation loss and decoding: decoder self-attention over whole
    sequences is causal with no mask tensor, a cached step passes none, and encoder and
    cross-attention pass a mask only where it hides padding."""
    data = tiny_corpus(tmp_path / "data", train=60, validation=4, test=4)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        assert train.main(["--datasource", str(data), "--preset", "tiny", "--max_steps", "1", "--num_epochs", "1",
                           "--model_folder", str(tmp_path / "w"), "--runs_folder", str(tmp_path / "r"),
                           "--store_folder", str(tmp_path / "s")]) == 0
    plotted = [c for c in attention_calls if c.plot and c.role == "decoder self" and not c.cached]
    assert plotted and all(c.mask is not None and not c.is_causal for c in plotted)  # explicit masks are kept
    calls = [c for c in attention_calls if not c.plot]
    whole = [c for c in calls if c.role == "decoder self" and not c.cached]
    assert any(c.training for c in whole) and any(not c.training for c in whole)  # training and validation loss
    assert all(c.mask is None and c.is_causal for c in whole)
    cached = [c for c in calls if c.cached and c.role == "decoder self"]
    assert cached and all(c.mask is None and not c.is_causal for c in cached)
    for call in calls:
        if call.role != "decoder self":
            assert not call.is_causal and (call.mask is None or not bool(call.mask.all())), call

    # an unpadded training batch: no call carries a mask
    attention_calls.clear()
    model = small_model().train()
    batch = dataset_of(TRAINING_PAIRS).collate([0, 3])
    logits = model(batch["encoder_input"], batch["decoder_input"], batch.get("src_mask"))
    loss_sum(logits, batch["label"], 0.1).backward()
    assert {c.role for c in attention_calls} == {"encoder", "decoder self", "cross"}
    assert all(c.mask is None for c in attention_calls)
