"""How much a batch and an optimizer step hold: decided at a run's start (`decide_batches`), each
decision recorded with the run (train.Trainer.decide: config.json and every checkpoint).

1. `--cuda_graphs auto` becomes on where the step can be captured (cuda_graphs.graphs_decision):
   the batches then come in length buckets (dataset.py).
2. `--batch_tokens auto` (the default; a preset's number stays its number): on a GPU, the largest
   budget whose worst batch fits the device (`probe_batch_tokens`); 4,096 on a CPU (the budget the
   CPU figures were measured at, docs/speed.md); a resumed run keeps its checkpoint's, so that it
   resumes on the very batches it left. The worst batch is the one of the longest training pair's
   length (its length bucket's, bucketed): budget // length rows of it, every row that long, the
   source of one row a token shorter so that attention takes a mask as bucketed batches always
   do. Its memory is that of any batch of the budget plus the longest attention. The probe runs
   forward, loss, backward, clipping and AdamW's step on such a batch with a model and optimizer
   of the run's sizes (built once, under a forked RNG: the run's own weights do not depend on
   it), freeing the memory between tries, and searches the rows (the budgets between two
   multiples of the length make the same worst batch) by bisection after trying the cap first:
   the rows that hold the per-rank share of --update_tokens, or MAX_PROBE_TOKENS. A batch fits when its peak memory
   stays under MEMORY_SHARE of what the device had free: the rest is for the allocator's
   fragmentation, the CUDA graphs' pool beside the eager warm-up, DDP's gradient buckets and
   validation's decoding. Every rank probes its own GPU; all take the smallest result.
3. A budget that cannot hold the longest training pair is refused in one line (DataError; the
   probe's OutOfMemory where not even one such pair fits the GPU).
4. `--update_tokens` (25,000): where batches are sized to the device (auto on a GPU) or it is
   given, `accum_steps` becomes the fewest batches, on all ranks, whose budgets reach it. 25,000 is
   the paper's batch (about 25,000 source and 25,000 target tokens), which the default learning
   rate (7e-4, warmup, inverse square root) is the paper's for, and fairseq's practice
   (--max-tokens per GPU times --update-freq): a GPU that holds more takes it in one batch, a
   smaller one accumulates, and the optimization does not depend on the device.
"""
from __future__ import annotations

import gc
import math
from typing import Any, Callable, Protocol

import torch

from config import AUTO, ConfigError
from dataset import BilingualDataset, bucket_lengths, bucket_of
from model import build_model
from nmt.corpora.sources import DataError
from nmt.corpora.tokenizer import EOS_ID, PAD_ID, SOS_ID
from nmt.diagnostics import log
from nmt.precision import amp_dtype, autocast_context
from nmt.training.cuda_graphs import graphs_decision
from nmt.training.loss import loss_sum
from nmt.training.optimizer import build_optimizer
from nmt.training.ranks import RankExchange, Ranks
from nmt.training.step import OutOfMemory

CPU_BATCH_TOKENS = 4096
MEMORY_SHARE = 0.85
MAX_PROBE_TOKENS = 1 << 20  # the probe's cap without --update_tokens
GIB = 2 ** 30


class DeviceMemory(Protocol):
    """What the probe reads of a device's memory (CudaMemory; a stand-in in the tests)."""

    def free(self) -> int: ...

    def reset(self) -> None: ...

    def peak(self) -> int: ...


class CudaMemory:
    """A CUDA device's free memory, and the peak torch allocated since `reset` (which frees what it can)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def free(self) -> int:
        return torch.cuda.mem_get_info(self.device)[0]

    def reset(self) -> None:
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.device)

    def peak(self) -> int:
        return torch.cuda.max_memory_allocated(self.device)


def largest_fitting(fits: Callable[[int], bool], high: int) -> int:
    """The largest n in [1, high] for which `fits` (true up to some n, false above it); 0 when none.
    `high` is tried first: a device that holds the cap needs one try."""
    if high < 1 or fits(high):
        return max(high, 0)
    low = 0  # fits(low) holds (trivially for 0), fits(high) does not
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low


def worst_batch(rows: int, length: int, vocab: tuple[int, int], device: torch.device) -> dict[str, torch.Tensor]:
    """`rows` pairs of `length` tokens on both sides ([SOS] ... [EOS]), the first row's source one
    token shorter (padded, so the batch takes a source mask), random ids of the vocabularies."""
    source = torch.randint(4, vocab[0], (rows, length), device=device)
    target = torch.randint(4, vocab[1], (rows, length + 1), device=device)
    source[:, 0], source[:, -1], target[:, 0], target[:, -1] = SOS_ID, EOS_ID, SOS_ID, EOS_ID
    source[0, -2:] = torch.tensor([EOS_ID, PAD_ID], device=device)
    return {"encoder_input": source, "decoder_input": target[:, :-1], "label": target[:, 1:],
            "src_mask": (source != PAD_ID)[:, None, None, :]}


def probe_batch_tokens(config: dict[str, Any], vocab: tuple[int, int], device: torch.device, length: int,
                       cap: int, memory: DeviceMemory) -> tuple[int, str]:
    """The largest multiple of `length`, up to the first that holds `cap`, whose worst batch (module
    docstring) fits the device, and how it was found; an OutOfMemory line where not one row fits."""
    limit, tries = MEMORY_SHARE * memory.free(), []
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        model = build_model(config, *vocab).to(device).train()
        optimizer = build_optimizer(model, config)
        dtype = amp_dtype(config, device)

        def fits(rows: int) -> bool:
            memory.reset()
            try:
                batch = worst_batch(rows, length, vocab, device)
                with autocast_context(device, dtype):
                    logits = model(batch["encoder_input"], batch["decoder_input"], batch["src_mask"])
                summed = loss_sum(logits, batch["label"], config["label_smoothing"])
                del logits, batch
                summed.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), config["clip_grad"] or float("inf"))
                optimizer.step()
                used = memory.peak()
            except torch.OutOfMemoryError:
                used = math.inf
            optimizer.zero_grad(set_to_none=True)
            tries.append(f"{rows} x {length}: " + ("out of memory" if used == math.inf else f"{used / GIB:.1f} GiB"))
            return used <= limit

        rows = largest_fitting(fits, -(-cap // length))  # enough rows to hold the cap
        del model, optimizer
    memory.reset()
    if rows == 0:
        raise OutOfMemory(f"one training pair of {length} tokens, the longest, does not fit in {limit / GIB:.1f} GiB "
                          f"({MEMORY_SHARE:.0%} of the GPU's free memory) at this model's size: train a smaller "
                          f"model, with a shorter --seq_len, or on a GPU with more memory")
    return rows * length, (f"the probe: the most rows of {length} tokens (the longest batch) whose step fits "
                           f"{limit / GIB:.1f} GiB, {MEMORY_SHARE:.0%} of the GPU's free memory, for {cap} tokens "
                           f"at most; "
                           f"tried {', '.join(tries)}")


def longest_batch_length(train_ds: BilingualDataset, config: dict[str, Any]) -> tuple[int, bool]:
    """The padded length of the longest training pair (its bucket's when bucketed), and whether bucketed."""
    longest = int(max(train_ds.src_lens.max(), train_ds.tgt_lens.max()))
    if config["cuda_graphs"] != "on":
        return longest, False
    return int(bucket_of(longest, bucket_lengths(config["seq_len"]))), True


def auto_batch_tokens(config: dict[str, Any], device: torch.device, exchange: RankExchange, ranks: Ranks,
                      state: dict[str, Any] | None, vocab: tuple[int, int], length: int,
                      memory: DeviceMemory | None) -> tuple[int, str]:
    """`--batch_tokens auto`'s value and why: the checkpoint's on a resume, the CPU's default, or
    the smallest probe of the ranks' GPUs."""
    if state is not None:
        return state["batch_settings"]["batch_tokens"], "the checkpoint resumed (--batch_tokens auto)"
    if device.type != "cuda" and memory is None:
        return CPU_BATCH_TOKENS, f"--batch_tokens auto on a {device.type} device"
    update = config["update_tokens"]
    cap = -(-update // ranks.world_size) if update else MAX_PROBE_TOKENS
    own, why = probe_batch_tokens(config, vocab, device, length, cap, memory or CudaMemory(device))
    found = exchange.gather_to_rank0("batch_tokens", own)
    smallest = exchange.from_rank0(min(found) if found else None)
    return smallest, why if smallest == own else f"the smallest of the ranks' probes (this rank's: {own}, by {why})"


def accumulation(config: dict[str, Any], given: frozenset[str], world_size: int, sized: bool) -> int | None:
    """The accum_steps that --update_tokens asks for, where it applies (module docstring); None elsewhere."""
    if {"update_tokens", "accum_steps"} <= given:
        raise ConfigError("--update_tokens and --accum_steps both set the size of a step: give one of them")
    update = config["update_tokens"]
    if not update or "accum_steps" in given or not (sized or "update_tokens" in given):
        return None
    return max(1, -(-update // (world_size * config["batch_tokens"])))


def decide_batches(config: dict[str, Any], decide: Callable[[dict[str, Any], str], None], given: frozenset[str],
                   device: torch.device, exchange: RankExchange, ranks: Ranks, train_ds: BilingualDataset,
                   state: dict[str, Any] | None, vocab: tuple[int, int], memory: DeviceMemory | None = None) -> None:
    """The run's batch decisions in order (module docstring), each through `decide`, which updates
    `config`; `memory`: a stand-in for the probe's device memory (tests)."""
    if graphs := graphs_decision(config, device, ranks.world_size, amp_dtype(config, device)):
        decide(graphs, "the device: one CUDA process (--cuda_graphs auto)")
    length, bucketed = longest_batch_length(train_ds, config)
    sized = config["batch_tokens"] == AUTO and (device.type == "cuda" or memory is not None)
    if config["batch_tokens"] == AUTO:
        value, why = auto_batch_tokens(config, device, exchange, ranks, state, vocab, length, memory)
        decide({"batch_tokens": value}, why)
        log(f"batch_tokens {value}: {why}")
    if config["batch_tokens"] < length:
        raise DataError(f"--batch_tokens {config['batch_tokens']} cannot hold the longest training pair: "
                        f"{length} tokens{', its length bucket' if bucketed else ''}; give at least {length}, or a "
                        f"shorter --seq_len, which leaves longer pairs out")
    if (steps := accumulation(config, given, ranks.world_size, sized)) is not None and steps != config["accum_steps"]:
        decide({"accum_steps": steps}, f"--update_tokens {config['update_tokens']}")
        log(f"accum_steps {steps}: the fewest batches of {config['batch_tokens']} tokens on {ranks.world_size} "
            f"rank(s) that reach --update_tokens {config['update_tokens']}")
