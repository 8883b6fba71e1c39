"""Run train.py under torchrun with faults injected on one rank, for tests/test_distributed.py.

    torchrun ... tests/rank_faults.py --nan_rank R --nan_steps 3,7 --weights_out PREFIX [train.py options]
    torchrun ... tests/rank_faults.py --validation_fault raise|sleep [train.py options]
    torchrun ... tests/rank_faults.py --fast_clock_rank R --leap_after_step S [train.py options]

`--nan_rank` makes the training loss's *value* NaN on rank R at the listed micro-batches (1-based),
leaving its gradient as it is: only that rank can see the problem, so the ranks stay in step only if
they decide together. With `--weights_out`, each rank writes its own final weights to
PREFIX.rankN.pt after training, so a test can check that the ranks' weights never drifted apart.

`--fast_clock_rank R` makes train.py's clock on rank R run FAST_CLOCK times as fast as time, so a
plan or a --max_minutes stop of its own would differ from rank 0's. `--leap_after_step S` moves rank
0's clock a million seconds on once step S is taken: the next step is past any --max_minutes.

Each rank prints "rank_faults: rank R validated N of M sources" after decoding its share of a
validation. `--validation_fault` then acts in rank 0's first validation, after printing
"rank_faults: validating" on stderr (rank 1 has decoded its share and waits for rank 0's scores):
`raise` raises a RuntimeError, `sleep` sleeps for two minutes (a stand-in for a long validation,
which a signal handler may interrupt).

    python tests/rank_faults.py --launch SPEC.json

starts the ranks itself, as a launcher without torchrun's agent would (nothing ends a rank but the
rank), from a JSON list of {"env": ..., "argv": [options as above], "log": stderr file}: one
interpreter imports torch and train.py (and torch._dynamo, which the optimizer imports on first
use) once, then forks a process per rank, each running train.py's `main` as the command line
would. On a loaded 2-core machine that saves seconds per rank. It prints "started PID" per rank in
the order given, then "exited PID CODE" as each one ends.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import train  # noqa: E402  (needs the sys.path entry above)


FAST_CLOCK = 20  # how many times as fast as time --fast_clock_rank's clock runs


def run_rank(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nan_rank", type=int, default=-1)
    parser.add_argument("--nan_steps", default="")
    parser.add_argument("--weights_out", default="")
    parser.add_argument("--validation_fault", choices=("raise", "sleep"), default=None)
    parser.add_argument("--fast_clock_rank", type=int, default=-1)
    parser.add_argument("--leap_after_step", type=int, default=0)
    args, train_argv = parser.parse_known_args(argv)
    rank = int(os.environ["RANK"])
    leap, zero = {"s": 0.0}, time.monotonic()
    rate = FAST_CLOCK if rank == args.fast_clock_rank else 1
    train.clock = lambda: zero + rate * (time.monotonic() - zero) + leap["s"]
    if args.leap_after_step and rank == 0:
        real_step = train.Trainer.optimizer_step

        def optimizer_step(trainer, *step_args):
            decided = real_step(trainer, *step_args)
            if trainer.global_step == args.leap_after_step:
                leap["s"] = 1e6
            return decided

        train.Trainer.optimizer_step = optimizer_step
    bad_calls = {int(step) for step in args.nan_steps.split(",") if step}
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
        if args.weights_out:
            torch.save(trainer.raw_model.state_dict(), f"{args.weights_out}.rank{rank}.pt")
        return real_finish(trainer, stop)

    train.Trainer.finish = finish

    real_share = train.validation_share

    def validation_share(model, val_ds, sources, *rest):
        share = real_share(model, val_ds, sources, *rest)
        print(f"rank_faults: rank {rank} validated {len(share['hypotheses'])} of {len(sources)} sources",
              file=sys.stderr, flush=True)
        if rank == 0 and args.validation_fault:
            print("rank_faults: validating", file=sys.stderr, flush=True)
            if args.validation_fault == "raise":
                raise RuntimeError("planted fault in validation")
            time.sleep(120)
        return share

    train.validation_share = validation_share
    return train.main(train_argv)


def fork_rank(spec: dict) -> int:
    """A child process running one rank (its stderr in spec["log"]); its pid."""
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        os.environ.update(spec["env"])
        os.dup2(os.open(spec["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 2)
        os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
        code = run_rank(spec["argv"])
    except SystemExit as exit:
        code = exit.code if isinstance(exit.code, int) else 1
    except BaseException:  # noqa: BLE001  (reported as the interpreter would)
        traceback.print_exc()
    finally:
        sys.stderr.flush()
        os._exit(code)


def launch(spec_path: str) -> int:
    import torch._dynamo  # noqa: F401  (imported once here instead of in every rank)
    specs = json.loads(Path(spec_path).read_text())
    for spec in specs:
        print(f"started {fork_rank(spec)}", flush=True)
    for _ in specs:
        pid, status = os.wait()
        print(f"exited {pid} {os.waitstatus_to_exitcode(status)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(launch(sys.argv[2]) if sys.argv[1:2] == ["--launch"] else run_rank(sys.argv[1:]))
