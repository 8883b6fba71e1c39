"""Token ids of sentence pairs in, batches out (the pairs come from sources.py through store.py).

1. `BilingualDataset` reads rows by index from flat arrays (memory-mapped from the store, store.py),
   so no list of all pairs or ids is ever built, and collates them into padded batches with their
   masks. `CorpusMix` puts several corpora's datasets side by side.
2. `BatchPlan` takes each corpus's share of an epoch by its weight w: round(w x n) of its n pairs,
   floor(w) full copies plus a draw of the fraction seeded with (seed, epoch, corpus number). It
   groups them into token-budget batches of sentences of similar length, in an order that is a
   function of (seed, epoch) alone; each global step takes world_size * accum_steps batches, and
   rank r takes every world_size-th one, so the data order depends on neither the world size nor
   a resume. One corpus of weight 1 is batched exactly as it was before corpora had weights. A mix
   whose epoch would draw more pairs than half the machine's memory can plan is refused first.
3. Length buckets (`BatchPlan(buckets=...)`, for CUDA graphs: nmt/training/cuda_graphs.py): every
   batch padded, both sides, to one of `bucket_lengths(seq_len)`, with budget // length rows (filler
   rows where a batch has fewer), so an epoch has at most one batch shape per bucket. The CPU keeps
   the exact widths above, which pad less.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch
from tokenizers import Tokenizer
from torch.utils.data import Dataset

from nmt.diagnostics import log
from nmt.corpora.sources import DataError
from nmt.corpora.tokenizer import EOS_ID, PAD_ID, SOS_ID, encode_texts


class BilingualDataset(Dataset):
    """Token ids of sentence pairs (without [SOS]/[EOS]) that fit in seq_len, read by index from
    flat arrays: all source ids end to end, all target ids end to end, and `offsets` (2, n + 1)
    where row i is src_ids[offsets[0, i]:offsets[0, i + 1]] and likewise for the target."""

    def __init__(self, src_ids: np.ndarray, tgt_ids: np.ndarray, offsets: np.ndarray) -> None:
        self.src_ids, self.tgt_ids, self.offsets = src_ids, tgt_ids, offsets
        # Source gets [SOS] .. [EOS]; target input gets [SOS] .., labels .. [EOS].
        self.src_lens = np.diff(offsets[0]).astype(np.int64) + 2
        self.tgt_lens = np.diff(offsets[1]).astype(np.int64) + 1

    @classmethod
    def from_pairs(cls, pairs: Sequence[tuple[str, str]], tok_src: Tokenizer, tok_tgt: Tokenizer, seq_len: int,
                   name: str = "pairs") -> "BilingualDataset":
        """Tokenize a small list of pairs in memory (tests, benchmarks); pairs longer than
        seq_len are dropped and counted. Training data goes through store.py instead."""
        src = [e.ids for e in encode_texts(tok_src, [p[0] for p in pairs], ids_only=True)]
        tgt = [e.ids for e in encode_texts(tok_tgt, [p[1] for p in pairs], ids_only=True)]
        keep = [i for i in range(len(pairs)) if fits(len(src[i]), len(tgt[i]), seq_len)]
        if len(keep) < len(pairs):
            log(f"{name}: dropped {len(pairs) - len(keep)} of {len(pairs)} pairs longer than seq_len {seq_len}")
        offsets = np.zeros((2, len(keep) + 1), dtype=np.int64)
        offsets[0, 1:] = np.cumsum([len(src[i]) for i in keep])
        offsets[1, 1:] = np.cumsum([len(tgt[i]) for i in keep])
        flat = [np.array([t for i in keep for t in side[i]], dtype=np.int64) for side in (src, tgt)]
        return cls(flat[0], flat[1], offsets)

    def __len__(self) -> int:
        return len(self.src_lens)

    @property
    def corpus_sizes(self) -> list[int]:
        """The number of rows of each corpus the dataset holds, in order: one corpus here."""
        return [len(self)]

    def __getitem__(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        start, end = self.offsets[:, index], self.offsets[:, index + 1]
        return self.src_ids[start[0]:end[0]], self.tgt_ids[start[1]:end[1]]

    def collate(self, indices: Sequence[int], shape: tuple[int, int] | None = None) -> dict[str, torch.Tensor]:
        """Pad to the longest sentence of the batch, on the right. A `src_mask` (B, 1, 1, S), True on
        real positions, only when some source is padded; no target mask: the decoder is causal when
        given none, which is all training needs (model.py's docstring), and the loss ignores padded
        labels. So attention takes the fused kernels that accept no mask tensor (FlashAttention on
        CUDA) wherever a batch allows it. Lengths are not rounded up to a multiple of 8 for the
        tensor cores, on CUDA either: exact widths trained faster (docs/speed.md).

        `shape` (rows, length): a length bucket's batch (module docstring), both sides padded to
        `length`, always with a src_mask; the rows past the sentences are filler whose source is
        [SOS] [EOS] and whose labels are all padding, so that they add nothing to the loss."""
        # Filled in numpy, then wrapped: a numpy slice assignment costs a fraction of a torch one.
        src_len, tgt_len = int(self.src_lens[indices].max()), int(self.tgt_lens[indices].max())
        rows = len(indices)
        if shape is not None:
            rows, src_len = shape
            tgt_len = src_len
        encoder_input = np.full((rows, src_len), PAD_ID, dtype=np.int64)
        decoder_input = np.full((rows, tgt_len), PAD_ID, dtype=np.int64)
        label = np.full((rows, tgt_len), PAD_ID, dtype=np.int64)
        encoder_input[:, 0] = decoder_input[:len(indices), 0] = SOS_ID
        encoder_input[len(indices):, 1] = EOS_ID
        for row, index in enumerate(indices):
            src, tgt = self[int(index)]
            encoder_input[row, 1:len(src) + 1], encoder_input[row, len(src) + 1] = src, EOS_ID
            decoder_input[row, 1:len(tgt) + 1] = label[row, :len(tgt)] = tgt
            label[row, len(tgt)] = EOS_ID
        batch = {"encoder_input": torch.from_numpy(encoder_input), "decoder_input": torch.from_numpy(decoder_input),
                 "label": torch.from_numpy(label)}
        if shape is not None or bool((self.src_lens[indices] < src_len).any()):
            batch["src_mask"] = (batch["encoder_input"] != PAD_ID)[:, None, None, :]
        return batch


class CorpusMix(BilingualDataset):
    """Several corpora's datasets side by side, batched and collated as one: row k of corpus i is row
    `starts[i] + k`. Each keeps its own (memory-mapped) arrays; only the lengths are concatenated."""

    def __init__(self, parts: Sequence[BilingualDataset]) -> None:
        # Not BilingualDataset.__init__, which takes one corpus's flat arrays: collate needs only the
        # lengths and __getitem__.
        self.parts = list(parts)
        self.starts = np.cumsum([0, *(len(part) for part in self.parts)])
        self.src_lens = np.concatenate([part.src_lens for part in self.parts])
        self.tgt_lens = np.concatenate([part.tgt_lens for part in self.parts])

    @property
    def corpus_sizes(self) -> list[int]:
        return [len(part) for part in self.parts]

    def __getitem__(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        part = int(np.searchsorted(self.starts, index, side="right")) - 1
        return self.parts[part][index - int(self.starts[part])]


def fits(src_tokens: int, tgt_tokens: int, seq_len: int) -> bool:
    """Whether a pair fits the model with its special tokens: [SOS] src [EOS], and [SOS] tgt / tgt [EOS]."""
    return src_tokens + 2 <= seq_len and tgt_tokens + 1 <= seq_len


# ---------------------------------------------------------------------------- batching

# Bytes an epoch's plan takes per pair drawn, at its peak (the rows, their lengths, the sort and the
# batches): 57 measured with tracemalloc for 3M pairs, plus the micro-batch list.
PLAN_BYTES_PER_PAIR = 64


def physical_memory() -> int:
    """This machine's memory in bytes (0 where the system does not say: then nothing is refused)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0

def token_batches(src_lens: np.ndarray, tgt_lens: np.ndarray, batch_tokens: int,
                  rng: np.random.Generator) -> list[np.ndarray]:
    """Sort by length (random among equals), cut into batches whose padded size fits the budget,
    then shuffle the batches. A sentence longer than the budget gets a batch of its own."""
    tie_break = rng.random(len(src_lens))
    longest_side = np.maximum(src_lens, tgt_lens)
    # Target length as a key too: sorting by (longest side, source) alone leaves the shorter
    # target side ragged within a batch, about 12% padding on tatoeba instead of under 9%.
    order = np.lexsort((tie_break, tgt_lens, src_lens, longest_side))
    longest = longest_side[order]  # non-decreasing: a batch's padded length is its last sentence's
    batches: list[np.ndarray] = []
    start = 0
    while start < len(order):
        # Everything after `start` is at least as long, so a batch holds at most budget // longest[start].
        window = longest[start:start + batch_tokens // longest[start] + 1]
        over = window * np.arange(1, len(window) + 1) > batch_tokens
        over[0] = False
        end = start + (int(np.argmax(over)) if over.any() else len(window))
        batches.append(order[start:end])
        start = end
    return [batches[i] for i in rng.permutation(len(batches))]


# Length buckets: from SMALLEST_BUCKET tokens up, each at most BUCKET_RATIO times the one before. At
# 1.1 a sentence is padded by at most 10% of its longer side, and seq_len 128 has 27 buckets, 256 has
# 34: as many CUDA graphs at most, each captured once. MLPerf's NVIDIA Transformer, without graphs,
# spaced its buckets 1.035x apart (about three times as many shapes for a few % less padding).
SMALLEST_BUCKET = 8
BUCKET_RATIO = 1.1


def bucket_lengths(seq_len: int) -> np.ndarray:
    """The padded lengths of bucketed batches, increasing, the last one seq_len."""
    lengths = [min(SMALLEST_BUCKET, seq_len)]
    while lengths[-1] < seq_len:
        lengths.append(min(seq_len, max(lengths[-1] + 1, math.ceil(lengths[-1] * BUCKET_RATIO))))
    return np.array(lengths, dtype=np.int64)


def bucket_of(longest: np.ndarray | int, lengths: np.ndarray) -> np.ndarray:
    """The padded length of the bucket each longest side falls in: the first of `lengths` that holds it."""
    return lengths[np.searchsorted(lengths, longest)]


def bucketed_batches(src_lens: np.ndarray, tgt_lens: np.ndarray, batch_tokens: int, lengths: np.ndarray,
                     rng: np.random.Generator) -> list[np.ndarray]:
    """Batches of whole length buckets: bucket by bucket, from the shortest, rows in a random
    order, cut into batches of batch_tokens // length rows; the rows a bucket leaves over join the
    next one (they fit its longer padding), so only the epoch's last batch may be short. Then the
    batches are shuffled. Every sentence must fit the budget at its bucket's length."""
    padded = bucket_of(np.maximum(src_lens, tgt_lens), lengths)
    order = np.lexsort((rng.random(len(padded)), padded))
    batches: list[np.ndarray] = []
    left = np.zeros(0, dtype=np.int64)
    for length, start, count in zip(*np.unique(padded[order], return_index=True, return_counts=True)):
        rows = batch_tokens // int(length)
        if rows == 0:
            raise ValueError(f"a batch of {batch_tokens} tokens cannot hold one sentence padded to {length}")
        pool = np.concatenate([left, order[start:start + count]])
        full = len(pool) // rows * rows
        batches += np.split(pool[:full], full // rows) if full else []
        left = pool[full:]
    if len(left):
        batches.append(left)
    return [batches[i] for i in rng.permutation(len(batches))]


def padding_waste(batches: Sequence[np.ndarray], src_lens: np.ndarray, tgt_lens: np.ndarray,
                  shape_of: Callable[[np.ndarray], tuple[int, int] | None] | None = None) -> float:
    """Fraction of the padded source and target positions that are padding (`shape_of`: a bucketed
    plan's (rows, length) of each batch, both sides that long)."""
    real = padded = 0
    for batch in batches:
        real += int(src_lens[batch].sum() + tgt_lens[batch].sum())
        shape = shape_of(batch) if shape_of is not None else None
        padded += 2 * shape[0] * shape[1] if shape else len(batch) * int(src_lens[batch].max() + tgt_lens[batch].max())
    return 1.0 - real / padded if padded else 0.0


@dataclass
class BatchPlan:
    """Which rows each epoch takes from each corpus of `dataset` (by `weights`, one per corpus), which
    micro-batches each rank trains on, and how many tokens each step has."""

    dataset: BilingualDataset
    batch_tokens: int
    seed: int
    world_size: int = 1
    rank: int = 0
    accum_steps: int = 1
    weights: Sequence[float] = (1.0,)
    buckets: np.ndarray | None = None  # bucket_lengths(seq_len): batches of length buckets (CUDA graphs)

    def __post_init__(self) -> None:
        if len(self.weights) != len(self.dataset.corpus_sizes):
            raise ValueError(f"{len(self.weights)} weights for {len(self.dataset.corpus_sizes)} corpora")
        self._cached: tuple[int, list[np.ndarray]] | None = None
        self.check_epoch_size(physical_memory())

    def check_epoch_size(self, memory: int) -> None:
        """Refuse, in one DataError line and before anything is allocated, a mix whose epoch would draw
        more pairs than half of `memory` bytes can plan (PLAN_BYTES_PER_PAIR each): weights of up to
        100 on a corpus of millions of pairs would otherwise exhaust the machine's memory."""
        total = sum(self.corpus_pairs())
        if not memory or total * PLAN_BYTES_PER_PAIR <= memory / 2:
            return
        mix = ", ".join(f"{weight:g} x {size:,}" for weight, size in zip(self.weights, self.dataset.corpus_sizes))
        raise DataError(f"the corpora's weights draw {total:,} pairs an epoch ({mix}), whose batch plan would take about "
                        f"{total * PLAN_BYTES_PER_PAIR / 2**30:.1f} GiB of this machine's {memory / 2**30:.1f} GiB: "
                        f"lower the weights in --datasource")

    @property
    def per_step(self) -> int:
        return self.world_size * self.accum_steps

    def corpus_pairs(self) -> list[int]:
        """How many pairs each corpus gives every epoch: round(weight x its pairs)."""
        return [round(weight * size) for weight, size in zip(self.weights, self.dataset.corpus_sizes)]

    def epoch_rows(self, epoch: int) -> np.ndarray:
        """The dataset's rows that epoch `epoch` trains on, corpus by corpus: floor(w) full copies of
        a corpus, then the rest of its round(w x n) drawn without replacement, seeded with (seed,
        epoch, corpus number from 1) so that the mix depends on nothing else."""
        sizes = self.dataset.corpus_sizes
        starts = np.cumsum([0, *sizes])
        rows = []
        for index, (start, size, weight, total) in enumerate(zip(starts, sizes, self.weights, self.corpus_pairs())):
            copies = math.floor(weight)
            rows += [np.arange(start, start + size)] * copies
            if total > copies * size:
                # index + 1: numpy pads a seed with zeros, so [seed, epoch, 0] would replay the stream of
                # [seed, epoch], which orders the batches
                drawn = np.random.default_rng([self.seed, epoch, index + 1]).choice(size, total - copies * size, False)
                rows.append(start + np.sort(drawn))
        return np.concatenate(rows) if rows else np.zeros(0, dtype=np.int64)

    def epoch_batches(self, epoch: int) -> list[np.ndarray]:
        if self._cached is None or self._cached[0] != epoch:
            rows = self.epoch_rows(epoch)
            rng = np.random.default_rng([self.seed, epoch])
            lengths = self.dataset.src_lens[rows], self.dataset.tgt_lens[rows]
            batches = token_batches(*lengths, self.batch_tokens, rng) if self.buckets is None else \
                bucketed_batches(*lengths, self.batch_tokens, self.buckets, rng)
            self._cached = (epoch, [rows[batch] for batch in batches])
        return self._cached[1]

    def shape_of(self, batch: np.ndarray) -> tuple[int, int] | None:
        """A bucketed batch's (rows, length), both sides padded to it; None for exact widths."""
        if self.buckets is None:
            return None
        longest = max(int(self.dataset.src_lens[batch].max()), int(self.dataset.tgt_lens[batch].max()))
        length = int(bucket_of(longest, self.buckets))
        return self.batch_tokens // length, length

    def steps_per_epoch(self, epoch: int, start_batch: int = 0) -> int:
        """Optimizer steps in the epoch from batch `start_batch` on (a trailing partial step is dropped)."""
        return (len(self.epoch_batches(epoch)) - start_batch) // self.per_step

    def micro_batches(self, epoch: int, start_batch: int = 0) -> list[tuple[np.ndarray, int]]:
        """This rank's micro-batches from the epoch's batch `start_batch` on, each with the number of
        target tokens of its whole global step (all ranks, all accumulated micro-batches), which
        normalises the loss so that any split of a step gives the same gradient."""
        batches = self.epoch_batches(epoch)
        plan = []
        for step in range(self.steps_per_epoch(epoch, start_batch)):
            first = start_batch + step * self.per_step
            step_batches = batches[first:first + self.per_step]
            step_tokens = int(sum(self.dataset.tgt_lens[b].sum() for b in step_batches))
            plan.extend((b, step_tokens) for b in step_batches[self.rank::self.world_size])
        return plan


class MicroBatches(Dataset):
    """A DataLoader-ready view of one rank's planned micro-batches (collated in the workers; `shape_of`:
    a bucketed plan's BatchPlan.shape_of)."""

    def __init__(self, dataset: BilingualDataset, plan: list[tuple[np.ndarray, int]],
                 shape_of: Callable[[np.ndarray], tuple[int, int] | None] | None = None) -> None:
        self.dataset = dataset
        self.plan = plan
        self.shape_of = shape_of

    def __len__(self) -> int:
        return len(self.plan)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        indices, step_tokens = self.plan[index]
        batch = self.dataset.collate(indices, self.shape_of(indices) if self.shape_of else None)
        batch["step_tokens"] = torch.tensor(step_tokens)
        batch["num_tokens"] = torch.tensor(int(self.dataset.tgt_lens[indices].sum()))
        return batch
