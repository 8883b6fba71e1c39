"""What a training step runs through besides the model: torch.compile shaped for token-budget
batches (`compile_for_training`), and an out-of-memory error turned into one line that names the
batch and what to change (`out_of_memory_names`).
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch


def compile_for_training(model: torch.nn.Module, backend: str | Any = "inductor") -> torch.nn.Module:
    """torch.compile for token-budget batches, whose every batch has its own sentence count and
    lengths: dynamic shapes from the first batch (`dynamic=True`). torch's default compiles a static
    graph first and recompiles on the next shapes, and past its recompile limit (8) runs the rest
    uncompiled. What stays specialised is whether the batch has a source mask and a batch of one
    sentence: at most four dynamo graphs per run, whatever the first batch (tests/test_compile.py);
    inductor's own guards can add compilations (docs/gpu.md)."""
    return DynamicBatches(torch.compile(model, dynamic=True, backend=backend))


class DynamicBatches(torch.nn.Module):
    """A compiled model that gives every size of its batches a symbol of its own. By default dynamo
    ties sizes that are equal in the batch it compiles for (duck sizing: a source as wide as its
    target, as many sentences as positions), and compiles again at the first batch where they
    differ. The setting is read when a graph is compiled, inside the call."""

    def __init__(self, compiled: torch.nn.Module) -> None:
        super().__init__()
        self.compiled = compiled

    def forward(self, src: torch.Tensor, tgt: torch.Tensor, src_mask: torch.Tensor | None = None) -> torch.Tensor:
        with torch.fx.experimental._config.patch(use_duck_shape=False):
            return self.compiled(src, tgt, src_mask)


class OutOfMemory(RuntimeError):
    """The device ran out of memory in a step; the message names the batch and what to change."""


@contextlib.contextmanager
def out_of_memory_names(batch: dict[str, torch.Tensor], step: int, config: dict[str, Any]) -> Iterator[None]:
    """Turn an out-of-memory error in a step's forward or backward into one line naming the batch.
    The run stops (the last checkpoint intact) rather than skipping the batch, as fairseq can: a
    skipped batch changes what the run trains on, and an exact resume could not repeat it."""
    try:
        yield
    except torch.OutOfMemoryError:
        sentences, source = batch["encoder_input"].shape
        raise OutOfMemory(f"out of device memory at step {step}, on a batch of {sentences} sentences x {source} "
                          f"source and {batch['label'].size(1)} target positions (--batch_tokens "
                          f"{config['batch_tokens']}): lower --batch_tokens, raising --accum_steps to keep the step's "
                          f"size, and resume; the last checkpoint is intact") from None

