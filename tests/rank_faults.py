"""Run train.py under torchrun with faults injected on one rank, for tests/test_distributed.py.

    torchrun ... tests/rank_faults.py --nan_rank R --nan_steps 3,7 --weights_out PREFIX [train.py options]

Makes the training loss's *value* NaN on rank R at the listed micro-batches (1-based), leaving its
gradient as it is: only that rank can see the problem, so the ranks stay in step only if they decide
together. After training, each rank writes its own final weights to PREFIX.rankN.pt, so a test can
check that the ranks' weights never drifted apart.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import train  # noqa: E402  (needs the sys.path entry above)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nan_rank", type=int, required=True)
    parser.add_argument("--nan_steps", required=True)
    parser.add_argument("--weights_out", required=True)
    args, train_argv = parser.parse_known_args()
    rank = int(os.environ["RANK"])
    bad_calls = {int(step) for step in args.nan_steps.split(",")}
    real_loss, calls = train.loss_sum, {"n": 0}

    def loss_sum(logits, label, label_smoothing):
        value = real_loss(logits, label, label_smoothing)
        if label_smoothing == 0.0:  # the validation loss
            return value
        calls["n"] += 1
        if rank == args.nan_rank and calls["n"] in bad_calls:
            return value + torch.tensor(float("nan"))  # NaN value, unchanged gradient
        return value

    train.loss_sum = loss_sum
    real_finish = train.Trainer.finish

    def finish(trainer, stop):
        torch.save(trainer.raw_model.state_dict(), f"{args.weights_out}.rank{rank}.pt")
        return real_finish(trainer, stop)

    train.Trainer.finish = finish
    return train.main(train_argv)


if __name__ == "__main__":
    sys.exit(main())
