"""--compile: the graphs compiled over a run's batch shapes are bounded, whatever the shapes.

Counted with torch's own compile counter on the `eager` backend (no code generation, so the test
takes seconds); the graph breaks and recompilations it counts are dynamo's, the same for inductor.
"""
from __future__ import annotations

import torch
from torch._dynamo.testing import CompileCounterWithBackend

from nmt.training.step import compile_for_training
from config import PRESETS, get_config
from nmt.training.loss import loss_sum
from model import build_model

# (sentences, source length, target length): token-budget batches of one run, with a single-sentence
# batch and a padded source (a mask) among them. The first has as many sentences as positions on
# each side, the first with a mask as many sentences as source positions: dynamo ties sizes equal in
# the batch it compiles for unless told not to, and compiles again at the first batch where they differ.
SHAPES = [(12, 12, 12), (10, 10, 11), (5, 20, 19), (16, 7, 9), (1, 15, 14), (3, 31, 30), (2, 9, 40), (1, 6, 5)]
MOST_GRAPHS = 4  # source mask or none x one sentence or more


def test_compiled_graphs_are_bounded_over_a_runs_batch_shapes() -> None:
    torch.manual_seed(0)
    config = {**get_config(), **PRESETS["tiny"]}
    model = build_model(config, 60, 70)
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("eager")
    compiled = compile_for_training(model, backend=counter)
    for index, (sentences, source, target) in enumerate(SHAPES):
        src, tgt = torch.randint(4, 60, (sentences, source)), torch.randint(4, 70, (sentences, target))
        mask = None
        if index % 2:
            src[0, -1] = 1  # the first sentence is padded
            mask = (src != 1)[:, None, None, :]
        loss_sum(compiled(src, tgt, mask), tgt, 0.1).backward()
    assert len(set(SHAPES)) > MOST_GRAPHS
    assert 1 <= counter.frame_count <= MOST_GRAPHS, f"{counter.frame_count} graphs for {len(SHAPES)} shapes"
