"""Glossaries: terms a translation must use. Where a source term occurs in a sentence, its target
term is a constraint of that sentence's beam search (decoding.ConstraintBanks).

A glossary is a list of (source term, target term) pairs, several words allowed on either side:
read from a TSV file (`read_glossary`: UTF-8 with or without a byte-order mark, one pair a line,
source TAB target, blank lines skipped) or given as pairs (a request's `glossary`), checked alike
(`check_pairs`): two non-empty sides of at most MAX_TERM_CHARS characters, at most `max_terms`
pairs, a source term given twice only with the same target. Each error is one line naming the row.

Case and matching (`Glossary.terms_in`):
- a source term occurs where its words appear in order, separated by any whitespace, as whole
  words (no letter, digit or underscore right before or after), in any case ("Cat", "CAT" and
  "cat" all match the term "cat"; Python's Unicode case-insensitive matching);
- where terms overlap, the leftmost wins, and of those starting there the longest;
- the target term is used exactly as written, its case included: write "Roma", not "roma". The
  search will not capitalise it at the start of a sentence, where a lower-case term stays lower case;
- a target term is asked for once per sentence, however often its source term occurs there.

Token ids (`Glossary.constraints`): each target term is one constraint with alternative
spellings, any of which will do (`term_alternatives`). The first is the target tokenizer's
encoding of the term on its own: with this project's Metaspace pre-tokenizer every word starts
with "▁" there as in running text after a space, so these are the ids the model writes for the
term in a sentence, for BPE, Unigram and WordLevel alike. After an elision (dell'acqua) or an
opening bracket or quote with no space, the term's first word has no "▁" and may split otherwise:
the others are the term glued to each of GLUED_AFTER, that character's token included (so that
the end of a longer word, "ancora" for "ora", never counts), where the vocabulary spells them. A
term the vocabulary cannot spell on its own ([UNK], WordLevel's unknown words), or longer than
`max_term_tokens`, is refused when the glossary is built, in one line naming it.
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from nmt.corpora.tokenizer import UNK_ID, encode_texts
from nmt.text_files import TextFileError, read_text

WORD = re.compile(r"\w+")
MAX_TERM_CHARS = 200  # either side of a pair
MAX_TERM_TOKENS = 16  # a target term's tokens: the constrained search compares every phrase prefix each step
GLUED_AFTER = ("'", "’", "(", '"', "«")  # elisions, opening brackets and quotes a term may follow with no space


class GlossaryError(ValueError):
    """A glossary that cannot be used; the message is one line that names the row or term."""


def read_glossary(path: Path, max_terms: int) -> list[tuple[str, str]]:
    """The pairs of the TSV glossary at `path`, checked by `check_pairs`; rows named path:line."""
    try:
        text = read_text(path, f"glossary {path}")
    except TextFileError as error:
        raise GlossaryError(str(error)) from None
    rows, labels = [], []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        columns = line.split("\t")
        if len(columns) != 2:
            raise GlossaryError(f"{path}:{number}: expected 2 tab-separated columns (source term, target term), "
                                f"found {len(columns)}")
        rows.append(columns)
        labels.append(f"{path}:{number}")
    return check_pairs(rows, max_terms, labels)


def config_glossary(config: dict[str, Any]) -> list[tuple[str, str]] | None:
    """The pairs of the config's `glossary` file (read_glossary, at most `glossary_max_terms`), None
    when it names none: what translate.py and evaluate.py read before the model loads."""
    return read_glossary(Path(config["glossary"]), config["glossary_max_terms"]) if config["glossary"] else None


def check_pairs(pairs: Sequence[Any], max_terms: int, labels: Sequence[str] | None = None) -> list[tuple[str, str]]:
    """`pairs` as (source term, target term) pairs, each side with its outer whitespace trimmed.
    Raises GlossaryError naming the row (labels[i], or "glossary entry i" counting from 1)."""
    if len(pairs) > max_terms:
        raise GlossaryError(f"the glossary has {len(pairs)} terms, more than the {max_terms} allowed")
    checked: list[tuple[str, str]] = []
    seen: dict[str, tuple[str, str]] = {}  # source key -> (target, label)
    for index, pair in enumerate(pairs):
        label = labels[index] if labels is not None else f"glossary entry {index + 1}"
        if isinstance(pair, (str, bytes)) or not isinstance(pair, Sequence) or len(pair) != 2 \
                or not all(isinstance(side, str) for side in pair):
            raise GlossaryError(f"{label}: expected a pair of strings [source term, target term]")
        source, target = pair[0].strip(), pair[1].strip()
        for side, term in (("source", source), ("target", target)):
            if not term:
                raise GlossaryError(f"{label}: empty {side} term")
            if len(term) > MAX_TERM_CHARS:
                raise GlossaryError(f"{label}: {side} term longer than {MAX_TERM_CHARS} characters")
        key = source_key(source)
        if key in seen and seen[key][0] != target:
            raise GlossaryError(f"{label}: source term {source!r} already has the target {seen[key][0]!r} "
                                f"({seen[key][1]})")
        if key not in seen:
            seen[key] = (target, label)
            checked.append((source, target))
    return checked


def source_key(term: str) -> str:
    """What two spellings of one source term share: its words, case-folded."""
    return " ".join(term.casefold().split())


@dataclass(frozen=True)
class Glossary:
    """Checked pairs, ready to match sentences and give the target terms' token ids. A sentence is
    searched only for the terms whose words (lower-cased \\w+ runs) it all holds, found through the
    index of each term's first word: a glossary of a thousand terms costs little more than one."""

    pairs: tuple[tuple[str, str], ...]
    target_ids: dict[str, list[list[int]]]  # target term -> its alternative spellings' token ids
    patterns: tuple[re.Pattern, ...]  # each source term's
    words: tuple[frozenset[str], ...]  # each source term's words
    by_first_word: dict[str, tuple[int, ...]]  # the terms each word begins ("": terms without one)

    @classmethod
    def build(cls, pairs: Sequence[tuple[str, str]], tok_tgt: Tokenizer,
              max_term_tokens: int = MAX_TERM_TOKENS) -> "Glossary":
        """A glossary of checked `pairs` (check_pairs) for a model whose target tokenizer is
        `tok_tgt`. Raises GlossaryError naming a target term it cannot spell or that is too long."""
        target_ids = {target: term_alternatives(tok_tgt, target, max_term_tokens) for _, target in pairs}
        patterns = tuple(re.compile(r"(?<!\w)" + r"\s+".join(map(re.escape, source.split())) + r"(?!\w)",
                                    re.IGNORECASE) for source, _ in pairs)
        words = [WORD.findall(source.casefold()) for source, _ in pairs]
        by_first_word: dict[str, list[int]] = {}
        for index, term_words in enumerate(words):
            by_first_word.setdefault(term_words[0] if term_words else "", []).append(index)
        return cls(tuple(pairs), target_ids, patterns, tuple(map(frozenset, words)),
                   {word: tuple(indices) for word, indices in by_first_word.items()})

    def terms_in(self, sentence: str) -> list[tuple[str, str]]:
        """(source text as found, target term) of each term `sentence` holds, in order, each target
        term once. Where matches overlap, the leftmost wins, and of those starting there the
        longest term."""
        present = set(WORD.findall(sentence.casefold()))
        candidates = [i for word in (*present, "") for i in self.by_first_word.get(word, ())
                      if self.words[i] <= present]
        matches = sorted((match.start(), -len(self.pairs[i][0]), match.end(), i)
                         for i in candidates for match in self.patterns[i].finditer(sentence))
        found: dict[str, str] = {}
        end = 0
        for start, _, stop, i in matches:
            if start >= end:
                found.setdefault(self.pairs[i][1], sentence[start:stop])
                end = stop
        return [(source, target) for target, source in found.items()]

    def constraints(self, sentence: str) -> list[list[list[int]]]:
        """The alternative spellings (token ids) of each target term `sentence` needs: one
        sentence's constraints for decoding.beam_search ([] when it holds no source term)."""
        return [self.target_ids[target] for _, target in self.terms_in(sentence)]


def term_ids(tok_tgt: Tokenizer, term: str, max_term_tokens: int = MAX_TERM_TOKENS) -> list[int]:
    """The ids the model writes for `term` in running text (module docstring), as text: a special
    token's string typed in it ([EOS], <2fr>) is ordinary pieces, never that token
    (tokenizer.encode_texts). Raises GlossaryError for a word the vocabulary cannot spell or more
    than `max_term_tokens` tokens."""
    [encoding] = encode_texts(tok_tgt, [term])
    for token_id, (start, end) in zip(encoding.ids, encoding.offsets):
        if token_id == UNK_ID:
            raise GlossaryError(f"the target term {term!r} cannot be spelled by the model's vocabulary: "
                                f"{term[start:end]!r} is unknown to it")
    if not encoding.ids:
        raise GlossaryError(f"the target term {term!r} has no tokens")
    if len(encoding.ids) > max_term_tokens:
        raise GlossaryError(f"the target term {term!r} is {len(encoding.ids)} tokens long, more than the "
                            f"{max_term_tokens} allowed")
    return list(encoding.ids)


def term_alternatives(tok_tgt: Tokenizer, term: str, max_term_tokens: int = MAX_TERM_TOKENS) -> list[list[int]]:
    """The token ids of `term` on its own (`term_ids`), then of each spelling glued to a character
    of GLUED_AFTER (that character's token first) that the vocabulary spells, each once."""
    alternatives = [term_ids(tok_tgt, term, max_term_tokens)]
    for before in GLUED_AFTER:
        [encoding] = encode_texts(tok_tgt, [f"x{before}{term}"])
        glued = [token_id for token_id, (start, _) in zip(encoding.ids, encoding.offsets) if start >= 1]
        if UNK_ID not in glued and len(glued) <= max_term_tokens + 1 and glued not in alternatives:
            alternatives.append(glued)
    return alternatives
