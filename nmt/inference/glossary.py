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

What a term replaces (`Glossary.forbidden_words`, the negative constraints of `constraints`): in a
sentence holding a term, each word of the source term as written there, and its renderings by the
model's word list (nmt/corpora/terms.py, stored with the model at training: the target words that
the training pairs link to it, those at FORBID_DICE or more), in lower case and capitalised, are
forbidden to its translation (decoding.ForbiddenWords), but for a word the sentence also holds
outside its terms and for the words of its target terms. Without a word list only the copies are.

Annotation (`matches`): a model trained with term_annotation reads every match of the sentence
annotated inline with its target term, as it learned (terms.annotated_ids; `annotation_tags`).
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer

from nmt.corpora.terms import Span
from config import TERM_TAGS
from nmt.corpora.tokenizer import UNK_ID, encode_texts, tag_id
from nmt.inference.decoding import SentenceConstraints
from nmt.text_files import TextFileError, read_text

WORD = re.compile(r"\w+")
MAX_TERM_CHARS = 200  # either side of a pair
MAX_TERM_TOKENS = 16  # a target term's tokens: the constrained search compares every phrase prefix each step
GLUED_AFTER = ("'", "’", "(", '"', "«")  # elisions, opening brackets and quotes a term may follow with no space
FORBID_DICE = 0.5  # a source term's rendering (the model's word list) that its target term replaces: Dice at least


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


@dataclass(frozen=True, eq=False)  # compared by identity: it holds a tensor
class Glossary:
    """Checked pairs, ready to match sentences and give the target terms' token ids. A sentence is
    searched only for the terms whose words (lower-cased \\w+ runs) it all holds, found through the
    index of each term's first word: a glossary of a thousand terms costs little more than one."""

    pairs: tuple[tuple[str, str], ...]
    target_ids: dict[str, list[list[int]]]  # target term -> its alternative spellings' token ids
    patterns: tuple[re.Pattern, ...]  # each source term's
    words: tuple[frozenset[str], ...]  # each source term's words
    by_first_word: dict[str, tuple[int, ...]]  # the terms each word begins ("": terms without one)
    tok_tgt: Tokenizer
    renderings: dict[str, dict[str, float]]  # the model's word list (terms.read_renderings; {}: none)
    word_starts: torch.Tensor  # which target ids begin a word: decoding.ForbiddenWords
    spellings: dict[str, list[list[int]]] = field(default_factory=dict)  # a forbidden word's, once spelled

    @classmethod
    def build(cls, pairs: Sequence[tuple[str, str]], tok_tgt: Tokenizer, max_term_tokens: int = MAX_TERM_TOKENS,
              renderings: dict[str, dict[str, float]] | None = None) -> "Glossary":
        """A glossary of checked `pairs` (check_pairs) for a model whose target tokenizer is
        `tok_tgt` and whose word list is `renderings` (None: it has none). Raises GlossaryError
        naming a target term it cannot spell or that is too long."""
        target_ids = {target: term_alternatives(tok_tgt, target, max_term_tokens) for _, target in pairs}
        patterns = tuple(re.compile(r"(?<!\w)" + r"\s+".join(map(re.escape, source.split())) + r"(?!\w)",
                                    re.IGNORECASE) for source, _ in pairs)
        words = [WORD.findall(source.casefold()) for source, _ in pairs]
        by_first_word: dict[str, list[int]] = {}
        for index, term_words in enumerate(words):
            by_first_word.setdefault(term_words[0] if term_words else "", []).append(index)
        return cls(tuple(pairs), target_ids, patterns, tuple(map(frozenset, words)),
                   {word: tuple(indices) for word, indices in by_first_word.items()}, tok_tgt, renderings or {},
                   word_starts(tok_tgt))

    def matches(self, sentence: str) -> list[Span]:
        """(start, end, target term) of every source term `sentence` holds, in order. Where matches
        overlap, the leftmost wins, and of those starting there the longest term."""
        present = set(WORD.findall(sentence.casefold()))
        candidates = [i for word in (*present, "") for i in self.by_first_word.get(word, ())
                      if self.words[i] <= present]
        found = sorted((match.start(), -len(self.pairs[i][0]), match.end(), i)
                       for i in candidates for match in self.patterns[i].finditer(sentence))
        spans: list[Span] = []
        end = 0
        for start, _, stop, i in found:
            if start >= end:
                spans.append((start, stop, self.pairs[i][1]))
                end = stop
        return spans

    def terms_in(self, sentence: str) -> list[tuple[str, str]]:
        """(source text as found, target term) of each term `sentence` holds, in order, each target
        term once (`matches`)."""
        found: dict[str, str] = {}
        for start, stop, target in self.matches(sentence):
            found.setdefault(target, sentence[start:stop])
        return [(source, target) for target, source in found.items()]

    def constraints(self, sentence: str) -> SentenceConstraints:
        """The alternative spellings (token ids) of each target term `sentence` needs, with the words
        its translation must not hold (`forbidden_words`, spelled as the terms are): one sentence's
        constraints for decoding.beam_search (empty when it holds no source term)."""
        required = [self.target_ids[target] for _, target in self.terms_in(sentence)]
        return SentenceConstraints(required, [ids for word in self.forbidden_words(sentence)
                                              for ids in self.spelled(word)])

    def forbidden_words(self, sentence: str) -> list[str]:
        """What the terms of `sentence` replace (module docstring): each word of a source term as
        found and its renderings at FORBID_DICE or more, lower-case and capitalised, but for a word
        the sentence also holds outside its terms and for the words of its target terms."""
        spans = self.matches(sentence)
        outside, cursor = [], 0
        for start, stop, _ in spans:
            outside.append(sentence[cursor:start])
            cursor = stop
        outside_words = set(WORD.findall(" ".join([*outside, sentence[cursor:]]).casefold()))
        kept = {word for _, _, target in spans for word in WORD.findall(target.casefold())}
        found: dict[str, None] = {}
        for start, stop, _ in spans:
            for word in WORD.findall(sentence[start:stop]):
                if word.casefold() in outside_words:
                    continue
                rendered = [r for r, dice in self.renderings.get(word.casefold(), {}).items() if dice >= FORBID_DICE]
                for form in (word, *rendered):
                    found.update(dict.fromkeys(f for f in (form, form.lower(), form[:1].upper() + form[1:])
                                               if f.casefold() not in kept))
        return list(found)

    def placed(self, sentence: str, translation: str) -> list[dict[str, Any]]:
        """Each term of `sentence` (terms_in) with the offsets of its target term in `translation`
        (its first occurrence as whole words; None for both where it is not there)."""
        found = []
        for source, target in self.terms_in(sentence):
            at = re.search(r"(?<!\w)" + re.escape(target) + r"(?!\w)", translation)
            found.append({"source": source, "target": target, "start": at.start() if at else None,
                          "end": at.end() if at else None})
        return found

    def spelled(self, word: str) -> list[list[int]]:
        """`word`'s spellings in running text (term_alternatives), none for one the vocabulary cannot spell."""
        if word not in self.spellings:
            try:
                self.spellings[word] = term_alternatives(self.tok_tgt, word)
            except GlossaryError:
                self.spellings[word] = []
        return self.spellings[word]


def annotation_tags(tok_src: Tokenizer, model_config: dict[str, Any], owner: str) -> tuple[int, int, int] | None:
    """The ids of config.TERM_TAGS for a model trained with term_annotation, whose glossaries are
    annotated in its sources; None for one trained without. TokenizerError when its tokenizer lacks them."""
    if not model_config.get("term_annotation", 0):
        return None
    start, target, end = (tag_id(tok_src, tag, owner) for tag in TERM_TAGS)
    return start, target, end


def word_starts(tok_tgt: Tokenizer) -> torch.Tensor:
    """For each id of `tok_tgt`, whether its token begins a word ("▁" first, this project's Metaspace
    mark) or holds no letter or digit (punctuation, split off by the pre-tokenizer): what may not
    follow a forbidden word's spelling where a constraint continues it (decoding.ForbiddenWords)."""
    starts = torch.zeros(tok_tgt.get_vocab_size(), dtype=torch.bool)
    for token, index in tok_tgt.get_vocab().items():
        if index < starts.numel():
            starts[index] = token.startswith("▁") or not any(char.isalnum() for char in token)
    return starts


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
