"""The work users run, without its text: token ids with the sentence lengths of news (bench_gpu.py).

`news_lengths.json`, beside this file, is a histogram of (source, target) lengths in tokens, [SOS]
and [EOS] not counted, in cells of CELL x CELL tokens, of WMT newstest2009 English-Italian (2,525
pairs; ../shared/data/newstest2009, an evaluation set: only the lengths are kept, no text). The
two sides were tokenized with this project's BPE (tokenizer.train_tokenizer, bpe, one joint
vocabulary) learned on the set's own two sides at 16,000 entries: the set's 22.8 words a sentence
became 29.8 English and 30.8 Italian tokens (8,000 entries: 34.0 and 35.5). A vocabulary learned on
5,050 sentences splits more words than a 32k one learned on a corpus of millions, so the larger
vocabulary, which splits least, stands in for it. It is derived by

    python -m benchmarks.news_workload ../shared/data/newstest2009

which rewrites the file. `news_dataset` draws pairs from it (uniformly within a cell) and fills them
with ids of a NEWS_VOCAB vocabulary drawn by a Zipf law, as a BilingualDataset.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

if not __package__:  # run as a file: only benchmarks/ is on sys.path, not the project
    sys.exit("news_workload.py: run it from the repository root as: python -m benchmarks.news_workload FOLDER")

from dataset import BilingualDataset, fits  # noqa: E402  (after the check above)

HISTOGRAM = Path(__file__).with_name("news_lengths.json")
CELL = 2  # tokens per histogram cell, each side
NEWS_VOCAB = 32_000  # a joint 32k vocabulary, special tokens included: 500 x 64, the tensor cores' multiple
DERIVED_VOCAB = 16_000  # the BPE the histogram's lengths were tokenized with (module docstring)
ZIPF = 1.1


def derive(folder: Path) -> dict:
    """The histogram of `folder`'s en-it test pairs (a Hub-layout folder: newstest2009's)."""
    from nmt.corpora.tokenizer import encode_texts, train_tokenizer
    rows = [json.loads(line)["translation"] for line in (folder / "en-it" / "test.jsonl").open(encoding="utf-8")]
    english, italian = [row["en"] for row in rows], [row["it"] for row in rows]
    tokenizer = train_tokenizer(english + italian, "bpe", DERIVED_VOCAB, 2)
    lengths = [np.array([len(e.ids) for e in encode_texts(tokenizer, side, ids_only=True)])
               for side in (english, italian)]
    cells, counts = np.unique(np.stack([(side - 1) // CELL for side in lengths], axis=1), axis=0, return_counts=True)
    return {"source": f"{folder.name}, en-it, {len(rows)} pairs, tokenized with a joint BPE of {DERIVED_VOCAB} entries "
                      f"(tokenizer.train_tokenizer) learned on its two sides; lengths without [SOS]/[EOS]",
            "cell_tokens": CELL, "mean_tokens": [round(float(side.mean()), 2) for side in lengths],
            "cells": [[int(s), int(t), int(n)] for (s, t), n in zip(cells, counts)]}


def news_lengths(count: int, seed: int, seq_len: int, max_tokens: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """`count` (source, target) lengths in tokens drawn from the histogram: pairs that fit `seq_len`
    with their special tokens (dataset.fits), and where `max_tokens` is given, whose sides (special
    tokens included) hold at most that many."""
    histogram = json.loads(HISTOGRAM.read_text(encoding="utf-8"))
    cells = np.array(histogram["cells"], dtype=np.int64)
    cell = histogram["cell_tokens"]
    longest = (cells[:, :2] + 1) * cell  # the longest lengths a cell holds
    keep = np.array([fits(int(s), int(t), seq_len) for s, t in longest])
    if max_tokens:
        keep &= (longest[:, 0] + 2 <= max_tokens) & (longest[:, 1] + 1 <= max_tokens)
    cells = cells[keep]
    rng = np.random.default_rng(seed)
    drawn = cells[rng.choice(len(cells), count, p=cells[:, 2] / cells[:, 2].sum())]
    return drawn[:, 0] * cell + 1 + rng.integers(0, cell, count), drawn[:, 1] * cell + 1 + rng.integers(0, cell, count)


def news_dataset(count: int, seed: int, seq_len: int, max_tokens: int = 0, vocab: int = NEWS_VOCAB) -> BilingualDataset:
    """`count` pairs of news lengths (`news_lengths`), their ids drawn from `vocab` entries (the four
    special tokens excluded) by a Zipf law."""
    src_len, tgt_len = news_lengths(count, seed, seq_len, max_tokens)
    rng = np.random.default_rng(seed + 1)
    words = vocab - 4
    weights = 1.0 / np.arange(1, words + 1) ** ZIPF
    ids = 4 + rng.choice(words, int(src_len.sum() + tgt_len.sum()), p=weights / weights.sum())
    offsets = np.zeros((2, count + 1), dtype=np.int64)
    offsets[0, 1:], offsets[1, 1:] = np.cumsum(src_len), np.cumsum(tgt_len)
    return BilingualDataset(ids[:offsets[0, -1]], ids[offsets[0, -1]:], offsets)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="a Hub-layout folder with en-it/test.jsonl (newstest2009's)")
    args = parser.parse_args(argv)
    if not (args.folder / "en-it" / "test.jsonl").is_file():
        print(f"news_workload.py: error: {args.folder / 'en-it' / 'test.jsonl'} does not exist", file=sys.stderr)
        return 1
    histogram = derive(args.folder)
    HISTOGRAM.write_text(json.dumps(histogram, separators=(",", ":")) + "\n", encoding="utf-8")
    print(f"wrote {HISTOGRAM}: {len(histogram['cells'])} cells, mean {histogram['mean_tokens']} tokens")
    return 0


if __name__ == "__main__":
    sys.exit(main())
