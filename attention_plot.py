"""Cross-attention of a translation as a heatmap: source tokens across, output tokens down.

The model attends with `scaled_dot_product_attention`, which never returns its weights, so they
are recomputed here for the last decoder layer: the sentence is translated greedily, the decoder
is run once more over [SOS] + translation with a forward hook on that layer's cross-attention to
capture its inputs, and softmax(Q K^T / sqrt(d_k)) is formed from the layer's own w_q and w_k.
The model's code is not touched. Figures are drawn without pyplot (no GUI backend, no global
state), so this works in training processes and headless machines; TensorBoard takes the Figure
through `writer.add_figure`.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from tokenizers import Tokenizer

from decoding import encode_sources, greedy_decode, max_output_tokens
from model import Transformer, causal_mask

if TYPE_CHECKING:
    from matplotlib.figure import Figure


@torch.no_grad()
def cross_attention_weights(model: Transformer, tok_src: Tokenizer, tok_tgt: Tokenizer,
                            sentence: str) -> tuple[list[str], list[str], torch.Tensor]:
    """(source tokens with [SOS]/[EOS], output tokens, weights (heads, outputs, sources)) of the
    last decoder layer's cross-attention while greedily translating `sentence`. Output row t is
    the step that produced output token t, the last one usually [EOS]."""
    device = next(model.parameters()).device
    seq_len = model.src_pos.pe.size(0)
    was_training = model.training
    model.eval()
    try:
        source = encode_sources(tok_src, [sentence], seq_len)[0][0]
        src = torch.tensor([source], device=device)
        src_mask = torch.ones(1, 1, 1, len(source), dtype=torch.bool, device=device)
        # Teacher-forced rerun over [SOS] + translation: its query positions are the decoding steps.
        generated, _ = greedy_decode(model, src, src_mask, max_output_tokens(len(source) - 2, seq_len))[0]
        decoder_input = torch.tensor([[source[0], *generated]], device=device)
        attention = model.decoder.layers[-1].cross_attention
        captured: dict[str, torch.Tensor] = {}

        def capture(module: torch.nn.Module, args: tuple) -> None:
            captured["query"], captured["key"] = args[0], args[1]

        handle = attention.register_forward_pre_hook(capture)
        try:
            memory = model.encode(src, src_mask)
            hidden = model.decode(memory, src_mask, decoder_input, causal_mask(decoder_input.size(1), device)[None])
        finally:
            handle.remove()
        produced = model.project(hidden[0]).argmax(dim=-1).tolist()
        q = attention.split_heads(attention.w_q(captured["query"]))
        k = attention.split_heads(attention.w_k(captured["key"]))
        scores = q @ k.transpose(-2, -1) / math.sqrt(attention.d_k)
        weights = scores.float().softmax(dim=-1)[0].cpu()  # (heads, outputs, sources)
    finally:
        model.train(was_training)
    # The rerun reproduces the greedy tokens; its last step shows what ended the translation.
    output_ids = [*generated, produced[-1]]
    return ([tok_src.id_to_token(i) for i in source], [tok_tgt.id_to_token(i) for i in output_ids], weights)


def attention_figure(model: Transformer, tok_src: Tokenizer, tok_tgt: Tokenizer, sentence: str,
                     per_head: bool = False) -> Figure:
    """A matplotlib Figure of the heatmap (mean over heads, or one panel per head), e.g. for
    `SummaryWriter.add_figure("val/attention", figure, step)`."""
    # Imported here: matplotlib costs ~0.5 s to import, which every train.py and translate.py start
    # would pay for a figure only validation's TensorBoard step and --plot_attention draw.
    from matplotlib.figure import Figure
    sources, outputs, weights = cross_attention_weights(model, tok_src, tok_tgt, sentence)
    panels = [(f"head {h}", weights[h]) for h in range(weights.size(0))] if per_head \
        else [("mean over heads", weights.mean(dim=0))]
    columns = min(len(panels), 4)
    rows = math.ceil(len(panels) / columns)
    cell = 0.32
    width = max(4.0, columns * (1.5 + cell * len(sources)))
    height = max(3.0, rows * (1.5 + cell * len(outputs)))
    figure = Figure(figsize=(width, height), layout="constrained")
    axes = figure.subplots(rows, columns, squeeze=False)
    for ax, (title, matrix) in zip(axes.flat, panels):
        image = ax.imshow(matrix.numpy(), cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
        ax.set_xticks(range(len(sources)), sources, rotation=90, fontsize=8)
        ax.set_yticks(range(len(outputs)), outputs, fontsize=8)
        ax.set_xlabel("source")
        ax.set_ylabel("output")
        ax.set_title(f"last decoder layer, {title}", fontsize=9)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    figure.colorbar(image, ax=axes.ravel().tolist(), shrink=0.8)
    return figure


def save_attention_plot(model: Transformer, tok_src: Tokenizer, tok_tgt: Tokenizer, sentence: str, path: Path,
                        per_head: bool = False) -> Path:
    """Write the heatmap of `sentence` to `path` (PNG unless its suffix names another format)."""
    figure = attention_figure(model, tok_src, tok_tgt, sentence, per_head)
    path = Path(path)
    figure.savefig(path, dpi=120)
    return path
