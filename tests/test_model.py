"""model.py: shapes, padding invariance, causality, tied weights, a golden attention check
against PyTorch's own implementation, and a tiny model that actually learns."""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.testing import assert_close

from translator import DecodingOptions
from model import (InputEmbeddings, MultiHeadAttention, PositionalEncoding, Transformer, build_model,
                   build_transformer, causal_mask)
from config import parse_config
from tokenizer import PAD_ID

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
