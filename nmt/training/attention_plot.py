"""Cross-attention of a translation as a heatmap: source tokens across, output tokens down.

The weights come from the translator (`Translator.cross_attention`, either engine); this module only
draws them. Figures are drawn without pyplot (no GUI backend, no global state), so this works in
training processes and headless machines; TensorBoard takes the Figure through `writer.add_figure`.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

from nmt.atomic_files import atomic_write

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from nmt.inference.translator import CrossAttention


def attention_figure(attention: CrossAttention, per_head: bool = False) -> Figure:
    """A matplotlib Figure of the heatmap (mean over heads, or one panel per head where the engine
    gives each head's weights), e.g. for `SummaryWriter.add_figure("val/attention", figure, step)`."""
    # Imported here: matplotlib costs ~0.5 s to import, which every train.py and translate.py start
    # would pay for a figure only validation's TensorBoard step and --plot_attention draw.
    from matplotlib.figure import Figure
    sources, outputs = attention.source_tokens, attention.output_tokens
    panels = [(f"head {h}", weights) for h, weights in enumerate(attention.heads)] if per_head and attention.heads \
        else [("mean over heads", attention.weights)]
    columns = min(len(panels), 4)
    rows = math.ceil(len(panels) / columns)
    cell = 0.32
    width = max(4.0, columns * (1.5 + cell * len(sources)))
    height = max(3.0, rows * (1.5 + cell * len(outputs)))
    figure = Figure(figsize=(width, height), layout="constrained")
    axes = figure.subplots(rows, columns, squeeze=False)
    for ax, (title, matrix) in zip(axes.flat, panels):
        image = ax.imshow(matrix, cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
        ax.set_xticks(range(len(sources)), sources, rotation=90, fontsize=8)
        ax.set_yticks(range(len(outputs)), outputs, fontsize=8)
        ax.set_xlabel("source")
        ax.set_ylabel("output")
        ax.set_title(f"last decoder layer, {title}", fontsize=9)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    figure.colorbar(image, ax=axes.ravel().tolist(), shrink=0.8)
    return figure


def save_attention_plot(attention: CrossAttention, path: Path, per_head: bool = False) -> Path:
    """Write the heatmap to `path`, atomically (PNG unless its suffix names another format)."""
    path = Path(path)
    figure = attention_figure(attention, per_head)
    atomic_write(path, lambda handle: figure.savefig(handle, format=path.suffix[1:].lower() or "png", dpi=120))
    return path
