"""Sentence pairs in, padded batches of token ids out.

1. `load_splits` reads `datasets.load_dataset(datasource, "src-tgt")` (a Hub id or a local folder
   in Hub layout), skips and counts unusable rows, and carves validation/test out of train with
   the run's seed when the source lacks them (the same seed gives the same split on every run).
2. Tokenizers are trained on the training split only (tokenizer.py).
3. `BilingualDataset` holds token ids; pairs longer than `seq_len` are dropped up front and counted.
4. `BatchPlan` groups sentences of similar length into token-budget batches whose order is a
   function of (seed, epoch) alone; each global step takes world_size * accum_steps of them, and
   rank r takes every world_size-th one, so the data order does not depend on the world size.
"""
from __future__ import annotations

import json
import os
import socket
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence
from urllib.parse import urlparse

import numpy as np
import torch
from tokenizers import Tokenizer
from torch.utils.data import Dataset

from model import causal_mask
from tokenizer import EOS_ID, PAD_ID, SOS_ID

Pair = tuple[str, str]
SPLITS = ("train", "validation", "test")


class DataError(RuntimeError):
    """Data that cannot be loaded; the message says what to do."""


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _hub_reachable(timeout: float = 5.0) -> bool:
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    parsed = urlparse(endpoint)
    try:
        with socket.create_connection((parsed.hostname, parsed.port or 443), timeout=timeout):
            return True
    except OSError:
        return False


def load_dataset_dict(datasource: str, pair: str):
    """The DatasetDict of `pair` from a Hub id or a local folder; DataError with one line on failure."""
    local = os.path.isdir(datasource)
    if not local:
        if datasource.startswith((".", "/", "~")) or datasource.count("/") > 1:
            raise DataError(f"datasource folder {datasource!r} does not exist")
        # The library retries an unreachable Hub for half a minute with a log line per try;
        # one quick probe turns that into one clear message. HF_HUB_OFFLINE=1 uses the local cache.
        if os.environ.get("HF_HUB_OFFLINE", "0") in ("0", "") and not _hub_reachable():
            raise DataError(f"cannot reach the Hugging Face Hub to load {datasource!r}; point --datasource at a "
                            f"local folder in Hub layout, e.g. python train.py --datasource ../shared/data/tatoeba")
    import datasets  # imported here: it is slow to import and only training and evaluation need it
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)  # failures are reported by us, in one line
    datasets.disable_progress_bars()
    try:
        # A local folder is read afresh every time, through a throwaway cache: the library keys its
        # cache by folder name and file layout, so it can serve another folder of the same name or a
        # file's previous contents, and even a forced re-read casts the rows to the stale entry's
        # column types (turning every sentence into a quoted JSON string when the types changed).
        if local:
            with tempfile.TemporaryDirectory(prefix="datasets-") as cache:
                return datasets.load_dataset(datasource, pair, cache_dir=cache, keep_in_memory=True,
                                             verification_mode=datasets.VerificationMode.NO_CHECKS)
        return datasets.load_dataset(datasource, pair)
    except ValueError as error:
        if "BuilderConfig" in str(error) or "not found" in str(error).lower():
            available = str(error).split("Available:")[-1].strip() if "Available:" in str(error) else "?"
            raise DataError(f"{datasource!r} has no {pair} language pair (available: {available})") from None
        raise DataError(f"cannot load {datasource!r} ({pair}): {error}") from None
    except datasets.exceptions.DatasetGenerationError as error:
        detail = _first_bad_json_line(datasource) or str(error.__cause__ or error).strip().splitlines()[0]
        raise DataError(f"cannot read {datasource!r} ({pair}): {detail}") from None
    except (ConnectionError, OSError, datasets.exceptions.DatasetNotFoundError) as error:
        first_line = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise DataError(f"cannot load {datasource!r} ({pair}): {first_line}; for a local folder in Hub layout "
                        f"use --datasource PATH") from None


def _first_bad_json_line(folder: str) -> str | None:
    """Name the first line of a local JSON-lines file that is not valid JSON."""
    if not os.path.isdir(folder):
        return None
    for path in sorted(Path(folder).rglob("*.jsonl")):
        with open(path, encoding="utf-8", errors="replace") as lines:
            for number, line in enumerate(lines, start=1):
                if line.strip():
                    try:
                        json.loads(line)
                    except json.JSONDecodeError as error:
                        return f"{path}:{number} is not valid JSON ({error.msg})"
    return None


def rows_to_pairs(rows: Sequence[Any], lang_src: str, lang_tgt: str, split: str) -> list[Pair]:
    """Keep rows with two non-empty strings; skipped rows are counted by reason and reported."""
    pairs: list[Pair] = []
    skipped: dict[str, int] = {}
    for row in rows:
        translation = row.get("translation") if isinstance(row, dict) else None
        if not isinstance(translation, dict):
            reason = "no translation field"
        else:
            src, tgt = translation.get(lang_src), translation.get(lang_tgt)
            if src is None or tgt is None:
                reason = "missing side"
            elif not isinstance(src, str) or not isinstance(tgt, str):
                reason = "non-text side"
            elif not src.strip() or not tgt.strip():
                reason = "empty side"
            else:
                pairs.append((src.strip(), tgt.strip()))
                continue
        skipped[reason] = skipped.get(reason, 0) + 1
    if skipped:
        detail = ", ".join(f"{count} {reason}" for reason, count in sorted(skipped.items()))
        log(f"{split}: skipped {sum(skipped.values())} of {len(rows)} rows ({detail})")
    return pairs


def split_indices(n: int, val_fraction: float, test_fraction: float, seed: int) -> dict[str, np.ndarray]:
    """A deterministic train/validation/test partition of range(n)."""
    order = np.random.default_rng(seed).permutation(n)
    n_test, n_val = round(n * test_fraction), round(n * val_fraction)
    return {"test": np.sort(order[:n_test]), "validation": np.sort(order[n_test:n_test + n_val]),
            "train": np.sort(order[n_test + n_val:])}


def load_splits(config: dict[str, Any]) -> dict[str, list[Pair]]:
    """Train, validation and test pairs of the configured source and language pair."""
    src, tgt = config["lang_src"], config["lang_tgt"]
    dataset_dict = load_dataset_dict(config["datasource"], f"{src}-{tgt}")
    if "train" not in dataset_dict:
        raise DataError(f"{config['datasource']!r} has no train split (found: {', '.join(dataset_dict)})")
    splits = {name: rows_to_pairs(dataset_dict[name].to_list(), src, tgt, name)
              for name in SPLITS if name in dataset_dict}
    missing = [name for name in ("validation", "test") if name not in splits]
    if missing:
        train = splits["train"]
        fractions = {"validation": config["val_fraction"], "test": config["test_fraction"]}
        for name in ("validation", "test"):
            if name not in missing:
                fractions[name] = 0.0
        parts = split_indices(len(train), fractions["validation"], fractions["test"], config["seed"])
        for name in ["train"] + missing:
            splits[name] = [train[i] for i in parts[name]]
        log(f"split the train split with seed {config['seed']} into "
            + ", ".join(f"{name} {len(splits[name])}" for name in ["train"] + missing))
    if not splits["train"]:
        raise DataError(f"{config['datasource']!r} has no usable {src}-{tgt} training pairs")
    return splits


class BilingualDataset(Dataset):
    """Token ids of sentence pairs that fit in `seq_len` with their special tokens."""

    def __init__(self, pairs: Sequence[Pair], tok_src: Tokenizer, tok_tgt: Tokenizer, seq_len: int,
                 name: str = "train") -> None:
        src_ids = [e.ids for e in tok_src.encode_batch([p[0] for p in pairs], add_special_tokens=False)]
        tgt_ids = [e.ids for e in tok_tgt.encode_batch([p[1] for p in pairs], add_special_tokens=False)]
        # Source gets [SOS] .. [EOS]; target input gets [SOS] .., labels .. [EOS].
        keep = [i for i in range(len(pairs)) if len(src_ids[i]) + 2 <= seq_len and len(tgt_ids[i]) + 1 <= seq_len]
        dropped = len(pairs) - len(keep)
        if dropped:
            log(f"{name}: dropped {dropped} of {len(pairs)} pairs longer than seq_len {seq_len}")
        self.pairs = [pairs[i] for i in keep]
        self.src_ids = [src_ids[i] for i in keep]
        self.tgt_ids = [tgt_ids[i] for i in keep]
        self.src_lens = np.array([len(s) + 2 for s in self.src_ids], dtype=np.int64)
        self.tgt_lens = np.array([len(t) + 1 for t in self.tgt_ids], dtype=np.int64)

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, index: int) -> tuple[list[int], list[int]]:
        return self.src_ids[index], self.tgt_ids[index]

    def collate(self, indices: Sequence[int]) -> dict[str, torch.Tensor]:
        """Pad to the longest sentence of the batch; masks are True where attention is allowed."""
        src_len = int(self.src_lens[indices].max())
        tgt_len = int(self.tgt_lens[indices].max())
        encoder_input = torch.full((len(indices), src_len), PAD_ID, dtype=torch.long)
        decoder_input = torch.full((len(indices), tgt_len), PAD_ID, dtype=torch.long)
        label = torch.full((len(indices), tgt_len), PAD_ID, dtype=torch.long)
        for row, index in enumerate(indices):
            src, tgt = self.src_ids[index], self.tgt_ids[index]
            encoder_input[row, :len(src) + 2] = torch.tensor([SOS_ID, *src, EOS_ID])
            decoder_input[row, :len(tgt) + 1] = torch.tensor([SOS_ID, *tgt])
            label[row, :len(tgt) + 1] = torch.tensor([*tgt, EOS_ID])
        return {
            "encoder_input": encoder_input,
            "decoder_input": decoder_input,
            "label": label,
            "src_mask": (encoder_input != PAD_ID)[:, None, None, :],  # (B, 1, 1, S)
            "tgt_mask": (decoder_input != PAD_ID)[:, None, None, :] & causal_mask(tgt_len)[None],  # (B, 1, T, T)
        }


def token_batches(src_lens: np.ndarray, tgt_lens: np.ndarray, batch_tokens: int,
                  rng: np.random.Generator) -> list[np.ndarray]:
    """Sort by length (random among equals), cut into batches whose padded size fits the budget,
    then shuffle the batches. A sentence longer than the budget gets a batch of its own."""
    tie_break = rng.random(len(src_lens))
    # Target length as a key too: sorting by (longest side, source) alone leaves the shorter
    # target side ragged within a batch, about 12% padding on tatoeba instead of under 9%.
    order = np.lexsort((tie_break, tgt_lens, src_lens, np.maximum(src_lens, tgt_lens)))
    batches: list[np.ndarray] = []
    start, longest = 0, 0
    for position, index in enumerate(order):
        length = max(src_lens[index], tgt_lens[index])
        if position > start and max(longest, length) * (position - start + 1) > batch_tokens:
            batches.append(order[start:position])
            start, longest = position, 0
        longest = max(longest, length)
    if start < len(order):
        batches.append(order[start:])
    return [batches[i] for i in rng.permutation(len(batches))]


def padding_waste(batches: Sequence[np.ndarray], src_lens: np.ndarray, tgt_lens: np.ndarray) -> float:
    """Fraction of the padded source and target positions that are padding."""
    real = padded = 0
    for batch in batches:
        real += int(src_lens[batch].sum() + tgt_lens[batch].sum())
        padded += len(batch) * int(src_lens[batch].max() + tgt_lens[batch].max())
    return 1.0 - real / padded if padded else 0.0


@dataclass
class BatchPlan:
    """Which micro-batches each rank trains on in one epoch, and how many tokens each step has."""

    dataset: BilingualDataset
    batch_tokens: int
    seed: int
    world_size: int = 1
    rank: int = 0
    accum_steps: int = 1

    def epoch_batches(self, epoch: int) -> list[np.ndarray]:
        rng = np.random.default_rng([self.seed, epoch])
        return token_batches(self.dataset.src_lens, self.dataset.tgt_lens, self.batch_tokens, rng)

    def steps_per_epoch(self, epoch: int) -> int:
        return len(self.epoch_batches(epoch)) // (self.world_size * self.accum_steps)

    def micro_batches(self, epoch: int, start_step: int = 0) -> list[tuple[np.ndarray, int]]:
        """This rank's micro-batches from optimizer step `start_step` on, each with the number of
        target tokens of its whole global step (all ranks, all accumulated micro-batches), which
        normalises the loss so that any split of a step gives the same gradient."""
        batches = self.epoch_batches(epoch)
        per_step = self.world_size * self.accum_steps
        plan = []
        for step in range(start_step, len(batches) // per_step):
            step_batches = batches[step * per_step:(step + 1) * per_step]
            step_tokens = int(sum(self.dataset.tgt_lens[b].sum() for b in step_batches))
            plan.extend((b, step_tokens) for b in step_batches[self.rank::self.world_size])
        return plan


class MicroBatches(Dataset):
    """A DataLoader-ready view of one rank's planned micro-batches (collated in the workers)."""

    def __init__(self, dataset: BilingualDataset, plan: list[tuple[np.ndarray, int]]) -> None:
        self.dataset = dataset
        self.plan = plan

    def __len__(self) -> int:
        return len(self.plan)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        indices, step_tokens = self.plan[index]
        batch = self.dataset.collate(indices)
        batch["step_tokens"] = torch.tensor(step_tokens)
        batch["num_tokens"] = torch.tensor(int(self.dataset.tgt_lens[indices].sum()))
        return batch
