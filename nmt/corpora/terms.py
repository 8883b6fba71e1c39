"""Terms from the training pairs, and the inline annotation that teaches a model to use them.

Word alignment (`dice_table`, `WordList`): the Dice coefficient 2 c(s, t) / (c(s) + c(t)) of each
source word and target word (case-folded \\w+ runs, counted once per pair) seen together in at
least MIN_PAIRS training pairs, kept at DICE or more. A target word renders the source word that
is its best by Dice (competitive linking, Melamed 2000: "il" renders "the", not "cat"); each source
word keeps its RENDERINGS best renderings. Chosen over an aligner from the registries (eflomal
builds C and aligns every word of every pair) because annotation needs only a few confident
one-to-one links per pair, and the same counts give the renderings a glossary forbids where its
term goes (glossary.py): seconds within the store build, no model. The word list of a run is
stored with its model (RENDERINGS_FILE beside the checkpoints).

Annotation (Dinu et al. 2019, "Training Neural Machine Translation To Apply Terminology
Constraints", their append form, with inline tags the tokenizers reserve, config.TERM_TAGS): a
source term is followed by its target term, `<term> cat <term_as> gatto <term_end> sleeps.`.
Training (`WordList.annotation`) annotates 1 to MAX_TERMS links of a pair: a source word that
occurs once there, and a rendering of it that occurs once in the target. For SUBSTITUTE_SHARE of
them the target word is replaced, in the annotation and in the target, by another rendering drawn
at random (cased as the word it replaces): the source word does not give it, so the model learns
to write what the annotation says where the source term stands, as a renamed name or a house term
asks. A glossary's matches are annotated by the same function at inference (`annotated_ids`).
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
from tokenizers import Tokenizer

from nmt.atomic_files import atomic_write_bytes
from nmt.corpora.tokenizer import encode_texts

WORD = re.compile(r"\w+")
MIN_PAIRS = 3  # pairs a source and a target word share, at least, to be linked
DICE = 0.3  # their Dice coefficient, at least
RENDERINGS = 5  # target words kept per source word
MAX_TERMS = 2  # terms annotated in one training source, at most
SUBSTITUTE_SHARE = 0.5  # of the terms annotated in training: target word replaced by another
RENDERINGS_FILE = "term_renderings.json"  # beside a run's checkpoints

Span = tuple[int, int, str]  # a source term's start and end in its sentence, and its target term


def words(text: str) -> list[str]:
    """The case-folded words of `text`."""
    return WORD.findall(text.casefold())


def dice_table(pairs: Iterable[tuple[str, str]]) -> dict[str, dict[str, float]]:
    """source word -> {target word: Dice} of the word pairs seen together in MIN_PAIRS pairs or more
    at DICE or more, each word counted once per sentence pair."""
    source_ids: dict[str, int] = {}
    target_ids: dict[str, int] = {}
    keys, source_seen, target_seen = [], [], []
    for source, target in pairs:
        s = np.fromiter({source_ids.setdefault(w, len(source_ids)) for w in words(source)}, dtype=np.int64)
        t = np.fromiter({target_ids.setdefault(w, len(target_ids)) for w in words(target)}, dtype=np.int64)
        source_seen.append(s)
        target_seen.append(t)
        keys.append((s[:, None] << 32 | t[None, :]).ravel())
    if not keys:
        return {}
    source_counts = np.bincount(np.concatenate(source_seen), minlength=len(source_ids))
    target_counts = np.bincount(np.concatenate(target_seen), minlength=len(target_ids))
    together, counts = np.unique(np.concatenate(keys), return_counts=True)
    s, t = together >> 32, together & 0xFFFFFFFF
    dice = 2 * counts / (source_counts[s] + target_counts[t])
    linked = (counts >= MIN_PAIRS) & (dice >= DICE)
    source_words, target_words = list(source_ids), list(target_ids)
    table: dict[str, dict[str, float]] = {}
    for i, j, value in zip(s[linked].tolist(), t[linked].tolist(), dice[linked].tolist()):
        table.setdefault(source_words[i], {})[target_words[j]] = value
    return table


def renderings(table: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """source word -> {target word: Dice}: the RENDERINGS best target words of each source word
    among those whose best source word it is (ties: the first source word in sorted order)."""
    best: dict[str, tuple[float, str]] = {}
    for source in sorted(table):
        for target, value in table[source].items():
            if value > best.get(target, (-1.0, ""))[0]:
                best[target] = (value, source)
    kept: dict[str, dict[str, float]] = {}
    for target, (value, source) in best.items():
        kept.setdefault(source, {})[target] = value
    return {source: dict(sorted(found.items(), key=lambda item: (-item[1], item[0]))[:RENDERINGS])
            for source, found in sorted(kept.items())}


def once(text: str) -> dict[str, re.Match]:
    """Each case-folded word that occurs once in `text`, with its match."""
    found: dict[str, list[re.Match]] = {}
    for match in WORD.finditer(text):
        found.setdefault(match.group().casefold(), []).append(match)
    return {word: matches[0] for word, matches in found.items() if len(matches) == 1}


class WordList:
    """A run's renderings (source word -> {target word: Dice}): what training annotates and what a
    glossary forbids where its term goes."""

    def __init__(self, rendered: dict[str, dict[str, float]]) -> None:
        self.renderings = rendered
        # what a substitution draws from: words of letters ("e4" renders "e4" too)
        self.targets = sorted({target for found in rendered.values() for target in found
                               if target.isalpha() and len(target) > 1})

    def links(self, source: str, target: str) -> list[tuple[re.Match, re.Match]]:
        """One-to-one links of a pair, best Dice first: a source word of two characters or more
        occurring once there with a rendering of it occurring once in the target, each word linked
        once (a one-letter word is most often part of another: the d of I'd)."""
        in_source, in_target = once(source), once(target)
        in_source = {word: match for word, match in in_source.items() if len(word) > 1}
        candidates = sorted(((value, word, rendering) for word in in_source
                             for rendering, value in self.renderings.get(word, {}).items() if rendering in in_target),
                            key=lambda item: (-item[0], item[1], item[2]))
        used: set[str] = set()
        linked = []
        for _, word, rendering in candidates:
            if word not in used and rendering not in used:
                used.update((word, rendering))
                linked.append((in_source[word], in_target[rendering]))
        return linked

    def annotation(self, source: str, target: str, rng: np.random.Generator) -> tuple[list[Span], str]:
        """The spans to annotate in a training pair's source and its target as the model learns it
        (module docstring): ([], target) when no word is linked."""
        linked = self.links(source, target)
        if not linked or len(self.targets) < 2:
            return [], target
        count = min(len(linked), int(rng.integers(1, MAX_TERMS + 1)))
        chosen = sorted((linked[i] for i in rng.choice(len(linked), count, replace=False)),
                        key=lambda link: link[1].start())
        spans, rewritten, cursor = [], [], 0
        for source_word, target_word in chosen:
            term = target_word.group()
            if rng.random() < SUBSTITUTE_SHARE:
                other = self.targets[int(rng.integers(len(self.targets)))]
                if other != term.casefold():
                    term = other[:1].upper() + other[1:] if term[:1].isupper() else other
            spans.append((source_word.start(), source_word.end(), term))
            rewritten += [target[cursor:target_word.start()], term]
            cursor = target_word.end()
        return sorted(spans), "".join(rewritten) + target[cursor:]


def annotated_ids(tokenizer: Tokenizer, texts: Sequence[str], spans: Sequence[Sequence[Span]],
                  tags: tuple[int, int, int]) -> list[list[int]]:
    """The token ids of each of `texts` with its `spans` annotated: `<term> source term <term_as>
    target term <term_end>` in place of each source term (`tags`: those three tags' ids). The parts
    between tags are tokenized as text, each on its own (encode_texts): at the spaces around a word
    that is how running text splits too. A part glued to the text before it ("'s" after "Tom") loses
    the bare word mark "▁" its own tokenization starts with, which running text does not have there."""
    layout: list[list[tuple[str, bool] | int]] = []
    for text, marks in zip(texts, spans):
        row: list[tuple[str, bool] | int] = []
        cursor = 0
        for start, end, target in sorted(marks):
            row += [_part(text, cursor, start), tags[0], _part(text, start, end), tags[1], (target, False), tags[2]]
            cursor = end
        layout.append(row + [_part(text, cursor, len(text))])
    parts = [part[0].strip() for row in layout for part in row if isinstance(part, tuple)]
    encoded = iter(encode_texts(tokenizer, parts, ids_only=True))
    bare = tokenizer.token_to_id("▁")
    result = []
    for row in layout:
        ids: list[int] = []
        for part in row:
            if isinstance(part, int):
                ids.append(part)
                continue
            found = next(encoded).ids
            ids += found[1:] if part[1] and found[:1] == [bare] else found
        result.append(ids)
    return result


def _part(text: str, start: int, end: int) -> tuple[str, bool]:
    """text[start:end], and whether it is glued to what comes before it (no space between them)."""
    return text[start:end], start > 0 and not text[start - 1].isspace() and not text[start:end][:1].isspace()


def save_renderings(folder: Path, rendered: dict[str, dict[str, float]]) -> None:
    """The run's renderings beside its checkpoints (RENDERINGS_FILE), for its glossaries."""
    atomic_write_bytes(Path(folder) / RENDERINGS_FILE, json.dumps(rendered, ensure_ascii=False).encode("utf-8"))


def read_renderings(folder: Path) -> dict[str, dict[str, float]] | None:
    """The renderings stored beside a run's checkpoints; None when there are none or they cannot be
    read as such (a glossary then forbids only the source term's copy)."""
    try:
        data: Any = json.loads((Path(folder) / RENDERINGS_FILE).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not isinstance(data, dict) or not all(isinstance(found, dict) for found in data.values()):
        return None
    return data
