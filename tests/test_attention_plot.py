"""attention_plot.py: a translator's cross-attention drawn as a PNG, per head where the engine gives
heads and as the mean where it does not (CTranslate2), and logged to TensorBoard. (The weights
themselves are tested with the translator, tests/test_translator.py.)"""
from __future__ import annotations

from pathlib import Path

import torch

from nmt.training.attention_plot import attention_figure, save_attention_plot
from nmt.inference.translator import CrossAttention


def attention(heads: int) -> CrossAttention:
    """Made-up weights of `heads` heads: rows of three outputs over four source tokens."""
    weights = torch.rand(heads, 3, 4, generator=torch.Generator().manual_seed(0)).softmax(dim=-1)
    return CrossAttention(["[SOS]", "the", "cat", "[EOS]"], ["il", "gatto", "[EOS]"], weights.mean(dim=0).tolist(),
                          weights.tolist())


def test_the_plot_is_a_png_with_a_panel_per_head_where_there_are_heads(tmp_path: Path) -> None:
    path = save_attention_plot(attention(2), tmp_path / "attention.png")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000
    assert [p.name for p in tmp_path.iterdir()] == ["attention.png"]  # written atomically: no temporary left
    figure = attention_figure(attention(2), per_head=True)
    assert sum(ax.get_visible() for ax in figure.axes) == 2 + 1  # two heads and the colour bar
    mean_only = attention(2)
    mean_only.heads = []  # what CTranslate2 gives
    assert sum(ax.get_visible() for ax in attention_figure(mean_only, per_head=True).axes) == 1 + 1


def test_attention_figure_logs_to_tensorboard(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(tmp_path))
    writer.add_figure("val/attention", attention_figure(attention(1)), 7)
    writer.close()
    events = EventAccumulator(str(tmp_path), size_guidance={"images": 0})
    events.Reload()
    [image] = events.Images("val/attention")
    assert image.step == 7 and image.width > 100 and image.encoded_image_string[:4] == b"\x89PNG"
