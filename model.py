"""The encoder-decoder Transformer of "Attention Is All You Need", one small block per idea.

API kept from the tutorials: `build_transformer(...)`, `model.encode(src, src_mask)`,
`model.decode(encoder_output, src_mask, tgt, tgt_mask)`, `model.project(x)` returning logits,
`model(src, tgt, src_mask, tgt_mask)`. Masks are boolean or 0/1 with True/1 = may attend, or None:
- src_mask (B, 1, 1, S) hides source padding from encoder self-attention and cross-attention.
  None means the batch has no padding: both attend unmasked.
- tgt_mask (B, 1, T, T) is applied exactly as given (nothing is added to it). None means causal:
  each target position sees itself and every earlier one. Over a whole sequence that is
  `is_causal=True` with no mask tensor; in a cached step (`cache=KVCache`) the one new position
  sees itself and every cached one, with no mask. Causal alone is all training needs: padding is on
  the right, so a real position never sees it, and the loss ignores padded positions.
  dataset.py's batches hold no tgt_mask, and a src_mask only when the batch has padding.

The blocks map one to one to the paper: InputEmbeddings (3.4), PositionalEncoding (3.5),
MultiHeadAttention (3.2.2), FeedForwardBlock (3.3), ResidualConnection (5.4, with pre-norm as an
option), EncoderBlock and DecoderBlock (3.1), ProjectionLayer (the pre-softmax linear map, 3.4).

Attention runs through `scaled_dot_product_attention`. In inference, and in training where a fused
kernel applies (CUDA), the B x h x Lq x Lk attention weights exist only inside the call. Training
with attention dropout on CPU takes SDPA's math path, which keeps those weights for backward: one
such tensor per attention layer, the largest activation at long lengths. The mask-free forms
above are what CUDA's fastest kernel needs: FlashAttention takes no mask tensor (is_causal only), so
causal self-attention and unpadded batches run on it. A padded batch's src_mask stays the broadcast
(B, 1, 1, S) boolean, which the memory-efficient kernel takes under any autocast dtype (SDPA turns
it into an additive B x S mask per call; no (B, h, Lq, Lk) copy is made). cuDNN's kernel, which
builds a plan per shape, is off on CUDA (device.py).

`decode(..., cache=KVCache)` decodes incrementally: self-attention keys/values are appended per
step and cross-attention keys/values are computed once per sentence.

`train_flops` counts the matrix-product FLOPs of a training step at this architecture's shapes
(benchmarks/bench.py's fraction of peak, train.py's CPU epoch estimate).

The matrix products and dropout go through cpu_kernels.py, which takes faster routes on CPU and is
exactly torch's ops elsewhere; self-attention computes Q, K and V with one matrix product over the
concatenated w_q, w_k, w_v (cross-attention: K and V over w_k, w_v).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from nmt.cpu_kernels import Dropout, Linear, linear, relu_dropout


class InputEmbeddings(nn.Module):
    """Token embeddings scaled by sqrt(d_model) (paper, section 3.4)."""

    def __init__(self, d_model: int, vocab_size: int) -> None:
        super().__init__()
        self.d_model = d_model
        self.embedding = nn.Embedding(vocab_size, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.embedding(x) * math.sqrt(self.d_model)


class PositionalEncoding(nn.Module):
    """Fixed sinusoidal positions (section 3.5), added to the embeddings, then dropout."""

    def __init__(self, d_model: int, max_len: int, dropout: float) -> None:
        super().__init__()
        self.dropout = Dropout(dropout)
        position = torch.arange(max_len, dtype=torch.float32).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model))
        pe = torch.zeros(max_len, d_model)
        pe[:, 0::2] = torch.sin(position * div_term)
        pe[:, 1::2] = torch.cos(position * div_term)
        # Not persistent: it is a function of the shape, so checkpoints need not carry it.
        self.register_buffer("pe", pe, persistent=False)

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        length = x.size(1)
        if offset + length > self.pe.size(0):
            raise ValueError(f"sequence of {offset + length} positions is longer than the model's "
                             f"{self.pe.size(0)} (seq_len)")
        return self.dropout(x + self.pe[offset:offset + length].to(x.dtype))


class MultiHeadAttention(nn.Module):
    """h parallel scaled dot-product attentions over d_model/h-dimensional projections (3.2.2)."""

    def __init__(self, d_model: int, h: int, dropout: float) -> None:
        super().__init__()
        assert d_model % h == 0, "d_model must be divisible by h"
        self.h = h
        self.d_k = d_model // h
        self.w_q = Linear(d_model, d_model)
        self.w_k = Linear(d_model, d_model)
        self.w_v = Linear(d_model, d_model)
        self.w_o = Linear(d_model, d_model)
        self.dropout_p = dropout  # on the attention weights, inside scaled_dot_product_attention

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        """(B, L, d_model) -> (B, h, L, d_k)."""
        return x.view(x.size(0), x.size(1), self.h, self.d_k).transpose(1, 2)

    def project_split(self, x: torch.Tensor, *layers: nn.Linear) -> list[torch.Tensor]:
        """x (B, L, d_model) through each of `layers`, as one matrix product over their stacked
        weights, each result split into heads."""
        out = linear(x, torch.cat([layer.weight for layer in layers]), torch.cat([layer.bias for layer in layers]))
        return [self.split_heads(part) for part in out.chunk(len(layers), dim=-1)]

    def keys_values(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of x (B, L, d_model), split into heads, from one matrix product."""
        key, value = self.project_split(x, self.w_k, self.w_v)
        return key, value

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                  is_causal: bool = False) -> torch.Tensor:
        """softmax(Q K^T / sqrt(d_k)) V of split heads (B, h, L, d_k), heads merged and projected by w_o;
        `is_causal` (with no mask) lets query i see keys 0..i only."""
        if mask is not None and mask.dtype != torch.bool:
            mask = mask.bool()
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal,
                                             dropout_p=self.dropout_p if self.training else 0.0)
        out = out.transpose(1, 2).reshape(out.size(0), -1, self.h * self.d_k)
        return self.w_o(out)

    def attend(self, x: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               mask: torch.Tensor | None) -> torch.Tensor:
        """Queries from x (B, Lq, d_model), projected here by w_q, attending over keys and values
        already projected and split into heads."""
        return self.attention(self.split_heads(self.w_q(x)), key, value, mask)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                mask: torch.Tensor | None, is_causal: bool = False) -> torch.Tensor:
        """The paper's MultiHead(Q, K, V) on unprojected inputs (B, L, d_model); `is_causal` only for
        self-attention."""
        if q is k and k is v:  # self-attention: Q, K and V in one matrix product
            return self.attention(*self.project_split(q, self.w_q, self.w_k, self.w_v), mask, is_causal)
        if k is v:  # cross-attention: K and V in one
            return self.attend(q, *self.keys_values(k), mask)
        return self.attend(q, self.split_heads(self.w_k(k)), self.split_heads(self.w_v(v)), mask)


class FeedForwardBlock(nn.Module):
    """Position-wise FFN(x) = max(0, x W1 + b1) W2 + b2 (3.3)."""

    def __init__(self, d_model: int, d_ff: int, dropout: float) -> None:
        super().__init__()
        self.linear_1 = Linear(d_model, d_ff)
        self.dropout_p = dropout
        self.linear_2 = Linear(d_ff, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_2(relu_dropout(self.linear_1(x), self.dropout_p, self.training))


class ResidualConnection(nn.Module):
    """x + Dropout(Sublayer(LayerNorm(x))) when pre-norm, LayerNorm(x + Dropout(Sublayer(x))) when post-norm."""

    def __init__(self, d_model: int, dropout: float, norm_first: bool) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.dropout = Dropout(dropout)
        self.norm_first = norm_first

    def forward(self, x: torch.Tensor, sublayer) -> torch.Tensor:
        if self.norm_first:
            return x + self.dropout(sublayer(self.norm(x)))
        return self.norm(x + self.dropout(sublayer(x)))


class EncoderBlock(nn.Module):
    """Self-attention, then feed-forward, each in a residual connection."""

    def __init__(self, d_model: int, h: int, d_ff: int, dropout: float, norm_first: bool) -> None:
        super().__init__()
        self.self_attention = MultiHeadAttention(d_model, h, dropout)
        self.feed_forward = FeedForwardBlock(d_model, d_ff, dropout)
        self.residual = nn.ModuleList([ResidualConnection(d_model, dropout, norm_first) for _ in range(2)])

    def forward(self, x: torch.Tensor, src_mask: torch.Tensor | None) -> torch.Tensor:
        x = self.residual[0](x, lambda y: self.self_attention(y, y, y, src_mask))
        return self.residual[1](x, self.feed_forward)


class KVCache:
    """Per-layer keys and values for incremental decoding of a batch of sentences.

    Self-attention entries have one row per decoded hypothesis and grow by one position per step.
    Cross-attention entries have one row per sentence: computed from the encoder output on the first
    step and reused. A sentence may have several consecutive hypothesis rows (the beams of beam
    search, or samples); they share their sentence's cross-attention entry, which is never copied
    when beams are reordered. `reorder_hypotheses` keeps or reorders hypothesis rows;
    `keep_sentences` drops finished sentences' cross-attention entries.
    """

    def __init__(self, num_layers: int) -> None:
        self.self_kv: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * num_layers
        self.cross_kv: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * num_layers
        self.length = 0  # positions already decoded

    @staticmethod
    def _pick(entries: list, index: torch.Tensor) -> list:
        return [None if e is None else (e[0].index_select(0, index), e[1].index_select(0, index)) for e in entries]

    def reorder_hypotheses(self, index: torch.Tensor) -> None:
        self.self_kv = self._pick(self.self_kv, index)

    def keep_sentences(self, index: torch.Tensor) -> None:
        self.cross_kv = self._pick(self.cross_kv, index)


class DecoderBlock(nn.Module):
    """Masked self-attention, cross-attention over the encoder output, then feed-forward."""

    def __init__(self, d_model: int, h: int, d_ff: int, dropout: float, norm_first: bool) -> None:
        super().__init__()
        self.self_attention = MultiHeadAttention(d_model, h, dropout)
        self.cross_attention = MultiHeadAttention(d_model, h, dropout)
        self.feed_forward = FeedForwardBlock(d_model, d_ff, dropout)
        self.residual = nn.ModuleList([ResidualConnection(d_model, dropout, norm_first) for _ in range(3)])

    def forward(self, x: torch.Tensor, encoder_output: torch.Tensor, src_mask: torch.Tensor | None,
                tgt_mask: torch.Tensor | None, cache: KVCache | None = None, layer: int = 0) -> torch.Tensor:
        if cache is None:
            causal = tgt_mask is None  # see the module docstring: None means causal, without a mask tensor
            x = self.residual[0](x, lambda y: self.self_attention(y, y, y, tgt_mask, causal))
            x = self.residual[1](x, lambda y: self.cross_attention(y, encoder_output, encoder_output, src_mask))
            return self.residual[2](x, self.feed_forward)

        def cached_self_attention(y: torch.Tensor) -> torch.Tensor:
            attention = self.self_attention
            # One position per step: two small products cost less than concatenating their weights.
            k, v = attention.split_heads(attention.w_k(y)), attention.split_heads(attention.w_v(y))
            past = cache.self_kv[layer]
            if past is not None:
                k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
            cache.self_kv[layer] = (k, v)
            # No mask when tgt_mask is None: the one new position may see every cached one.
            # (is_causal would be wrong here: SDPA aligns it to the top left, query 0 to key 0.)
            return self.self_attention.attend(y, k, v, tgt_mask)

        def cached_cross_attention(y: torch.Tensor) -> torch.Tensor:
            if cache.cross_kv[layer] is None:
                cache.cross_kv[layer] = self.cross_attention.keys_values(encoder_output)
            k, v = cache.cross_kv[layer]
            # A sentence's hypotheses all query the same keys: stacked along the query axis they
            # attend in one call, without a copy of the keys per hypothesis.
            sentences = k.size(0)
            queries = y.reshape(sentences, -1, y.size(-1))
            return self.cross_attention.attend(queries, k, v, src_mask).reshape(y.shape)

        x = self.residual[0](x, cached_self_attention)
        x = self.residual[1](x, cached_cross_attention)
        return self.residual[2](x, self.feed_forward)


class Encoder(nn.Module):
    def __init__(self, layers: nn.ModuleList, d_model: int, norm_first: bool) -> None:
        super().__init__()
        self.layers = layers
        # Pre-norm leaves the residual stream unnormalised, so it needs a final LayerNorm.
        self.norm = nn.LayerNorm(d_model) if norm_first else nn.Identity()

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x, mask)
        return self.norm(x)


class Decoder(nn.Module):
    def __init__(self, layers: nn.ModuleList, d_model: int, norm_first: bool) -> None:
        super().__init__()
        self.layers = layers
        self.norm = nn.LayerNorm(d_model) if norm_first else nn.Identity()

    def forward(self, x: torch.Tensor, encoder_output: torch.Tensor, src_mask: torch.Tensor | None,
                tgt_mask: torch.Tensor | None, cache: KVCache | None = None) -> torch.Tensor:
        for index, layer in enumerate(self.layers):
            x = layer(x, encoder_output, src_mask, tgt_mask, cache, index)
        return self.norm(x)


class ProjectionLayer(nn.Module):
    """Linear map from d_model to the target vocabulary; returns logits (softmax lives in the loss)."""

    def __init__(self, d_model: int, vocab_size: int) -> None:
        super().__init__()
        self.proj = Linear(d_model, vocab_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)


class Transformer(nn.Module):
    def __init__(self, encoder: Encoder, decoder: Decoder, src_embed: InputEmbeddings, tgt_embed: InputEmbeddings,
                 src_pos: PositionalEncoding, tgt_pos: PositionalEncoding, projection_layer: ProjectionLayer) -> None:
        super().__init__()
        self.encoder = encoder
        self.decoder = decoder
        self.src_embed = src_embed
        self.tgt_embed = tgt_embed
        self.src_pos = src_pos
        self.tgt_pos = tgt_pos
        self.projection_layer = projection_layer

    def encode(self, src: torch.Tensor, src_mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.encoder(self.src_pos(self.src_embed(src)), src_mask)

    def decode(self, encoder_output: torch.Tensor, src_mask: torch.Tensor | None, tgt: torch.Tensor,
               tgt_mask: torch.Tensor | None = None, cache: KVCache | None = None) -> torch.Tensor:
        """Decoder states for `tgt`; `tgt_mask` None is causal (module docstring). With a cache,
        `tgt` is the one newest position of each hypothesis (B * n, 1), n consecutive rows per
        sentence of `encoder_output` (B, S, d_model) and `src_mask` (B, 1, 1, S), and with
        `tgt_mask` None that position sees itself and every cached one."""
        offset = 0 if cache is None else cache.length
        x = self.decoder(self.tgt_pos(self.tgt_embed(tgt), offset), encoder_output, src_mask, tgt_mask, cache)
        if cache is not None:
            cache.length += tgt.size(1)
        return x

    def project(self, x: torch.Tensor) -> torch.Tensor:
        return self.projection_layer(x)

    def new_cache(self) -> KVCache:
        return KVCache(len(self.decoder.layers))

    def forward(self, src: torch.Tensor, tgt: torch.Tensor, src_mask: torch.Tensor | None = None,
                tgt_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Teacher-forced logits (B, T, V); masks as in the module docstring (None, None: no padding
        in the source, causal target). DDP and torch.compile wrap this method."""
        return self.project(self.decode(self.encode(src, src_mask), src_mask, tgt, tgt_mask))


def build_transformer(src_vocab_size: int, tgt_vocab_size: int, src_seq_len: int, tgt_seq_len: int,
                      d_model: int = 512, N: int = 6, h: int = 8, dropout: float = 0.1, d_ff: int = 2048,
                      norm_first: bool = True, tie_embeddings: bool = False) -> Transformer:
    """The tutorials' constructor; `norm_first` and `tie_embeddings` are additions with safe defaults."""
    if tie_embeddings and src_vocab_size != tgt_vocab_size:
        raise ValueError(f"tied embeddings need one shared vocabulary, got sizes {src_vocab_size} and {tgt_vocab_size}")
    src_embed = InputEmbeddings(d_model, src_vocab_size)
    tgt_embed = InputEmbeddings(d_model, tgt_vocab_size)
    encoder = Encoder(nn.ModuleList([EncoderBlock(d_model, h, d_ff, dropout, norm_first) for _ in range(N)]),
                      d_model, norm_first)
    decoder = Decoder(nn.ModuleList([DecoderBlock(d_model, h, d_ff, dropout, norm_first) for _ in range(N)]),
                      d_model, norm_first)
    projection = ProjectionLayer(d_model, tgt_vocab_size)
    model = Transformer(encoder, decoder, src_embed, tgt_embed,
                        PositionalEncoding(d_model, src_seq_len, dropout),
                        PositionalEncoding(d_model, tgt_seq_len, dropout), projection)
    for p in model.parameters():
        if p.dim() > 1:
            nn.init.xavier_uniform_(p)
    if tie_embeddings:
        # One matrix for source embedding, target embedding and output projection (section 3.4).
        nn.init.normal_(src_embed.embedding.weight, mean=0.0, std=d_model ** -0.5)
        tgt_embed.embedding.weight = src_embed.embedding.weight
        projection.proj.weight = src_embed.embedding.weight
    return model


def build_model(config: dict, src_vocab_size: int, tgt_vocab_size: int) -> Transformer:
    """`build_transformer` with the sizes of a config dict (see config.py)."""
    return build_transformer(src_vocab_size, tgt_vocab_size, config["seq_len"], config["seq_len"],
                             d_model=config["d_model"], N=config["num_layers"], h=config["num_heads"],
                             dropout=config["dropout"], d_ff=config["d_ff"], norm_first=config["norm_first"],
                             tie_embeddings=config["tie_embeddings"])


def set_dropout(model: nn.Module, p: float) -> None:
    """Every dropout of `model` to `p`: on embeddings, attention weights, the feed-forward's hidden
    layer and sublayer outputs (a run planned to its clock scales its dropout to its length)."""
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = p
        elif isinstance(module, (MultiHeadAttention, FeedForwardBlock)):
            module.dropout_p = p


def train_flops(batch: int, src_len: int, tgt_len: int, config: dict, tgt_vocab: int) -> int:
    """FLOPs of one training step on a batch padded to (src_len, tgt_len): multiply-adds of every
    matrix product at the shapes computed (padding included), x 2 FLOPs, x 3 for forward, input
    gradients and weight gradients. Per sentence, with S = src_len, T = tgt_len, d = d_model:
    encoder layer 4Sd^2 (Q, K, V, output) + 2S^2 d (Q K^T and weights @ V) + 2Sd d_ff (feed-forward);
    decoder layer 4Td^2 + 2T^2 d (masked self-attention, computed in full) + 2Td^2 + 2Sd^2
    (cross-attention: Q and output from the target, K and V from the source) + 2TSd + 2Td d_ff;
    projection T d V_tgt. Embedding lookups, LayerNorm, softmax, dropout and the loss are not
    counted (tests/test_bench.py checks the count against torch's FlopCounterMode)."""
    d, d_ff, layers = config["d_model"], config["d_ff"], config["num_layers"]
    s, t = src_len, tgt_len
    encoder = 4 * s * d * d + 2 * s * s * d + 2 * s * d * d_ff
    decoder = 4 * t * d * d + 2 * t * t * d + 2 * t * d * d + 2 * s * d * d + 2 * t * s * d + 2 * t * d * d_ff
    multiply_adds = layers * (encoder + decoder) + t * d * tgt_vocab
    return 3 * 2 * batch * multiply_adds


def causal_mask(size: int, device: torch.device | None = None) -> torch.Tensor:
    """(1, size, size) boolean mask, True on and below the diagonal."""
    return torch.ones(1, size, size, dtype=torch.bool, device=device).tril()
