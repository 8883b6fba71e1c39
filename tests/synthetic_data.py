"""A tiny synthetic English->Italian corpus in Hugging Face Hub layout, written by tests.

The "language" is a word-for-word dictionary, so a small model can learn it in seconds, and
the folder loads with `datasets.load_dataset(folder, "en-it")` exactly like ../shared/data.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

LEXICON = {
    "the": "il", "cat": "gatto", "dog": "cane", "sees": "vede", "eats": "mangia", "big": "grande",
    "small": "piccolo", "house": "casa", "red": "rosso", "bread": "pane", "loves": "ama", "old": "vecchio",
    "man": "uomo", "book": "libro", "reads": "legge", "black": "nero", "white": "bianco", "fish": "pesce",
}


def synthetic_pairs(count: int, seed: int = 0) -> list[tuple[str, str]]:
    """`count` sentence pairs of 2-7 words, the target a word-for-word gloss of the source."""
    rng = random.Random(seed)
    words = sorted(LEXICON)
    pairs = []
    for _ in range(count):
        source = [rng.choice(words) for _ in range(rng.randint(2, 7))]
        target = [LEXICON[w] for w in source]
        pairs.append((" ".join(source).capitalize() + ".", " ".join(target).capitalize() + "."))
    return pairs


def write_hub_dataset(folder: Path, splits: dict[str, list], pair: str = "en-it",
                      languages: tuple[str, str] | None = None) -> Path:
    """Write `splits` (name -> list of (src, tgt) pairs, or of raw row dicts) as JSON lines with a
    README `configs:` header. Raw dicts let tests write malformed rows. `languages` names codes with a
    hyphen (pt-BR), which `pair` cannot."""
    folder = Path(folder)
    src, tgt = languages or pair.split("-")
    pair = f"{src}-{tgt}"
    (folder / pair).mkdir(parents=True, exist_ok=True)
    header = ["---", "configs:", f"- config_name: {pair}", "  data_files:"]
    for name, rows in splits.items():
        header += [f"  - split: {name}", f"    path: {pair}/{name}.jsonl"]
        with open(folder / pair / f"{name}.jsonl", "w", encoding="utf-8") as out:
            for index, row in enumerate(rows):
                if isinstance(row, tuple):
                    row = {"id": str(index), "translation": {src: row[0], tgt: row[1]}}
                out.write((row if isinstance(row, str) else json.dumps(row, ensure_ascii=False)) + "\n")
    (folder / "README.md").write_text("\n".join(header + ["---", "Synthetic test data.", ""]), encoding="utf-8")
    return folder


def tiny_corpus(folder: Path, train: int = 300, validation: int = 30, test: int = 30) -> Path:
    """A train/validation/test corpus from disjoint seeds."""
    return write_hub_dataset(folder, {"train": synthetic_pairs(train, 1), "validation": synthetic_pairs(validation, 2),
                                      "test": synthetic_pairs(test, 3)})


def write_parallel_files(prefix: Path, pairs: list[tuple[str, str]], mode: str = "w") -> Path:
    """PREFIX.en and PREFIX.it, one side of each pair a line; mode "a" appends to them."""
    prefix = Path(prefix)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    for index, lang in enumerate(("en", "it")):
        with open(f"{prefix}.{lang}", mode, encoding="utf-8") as out:
            out.writelines(pair[index] + "\n" for pair in pairs)
    return prefix
