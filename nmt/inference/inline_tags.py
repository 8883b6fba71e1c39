"""Inline markup inside a sentence, put back around the words of the translation it covered.

A document's reader (documents.py) marks what in a flow's text is markup (`Mark`): an element's
opening and closing tags (`OPEN`, `CLOSE`: HTML's <b>, <a href>, Markdown's ** and a link's [ and
](destination)), markup kept whole that stands for words (`WHOLE`: a <code> element, a code span),
a character reference read as its character (`READ`: &amp;), or anything else (`CUT`: it cuts the
sentence, and stays where it is). sentences.py keeps a sentence whole across the first four:
`read_piece` gives the translator the piece's prose (the tags left out, a WHOLE mark's text and a
READ mark's character in their place, whitespace runs one space) and keeps each tag with the span of
prose it covered (`Tag`).

After translation, `place` writes the tags back around target words. Which words: the model's
cross-attention over the translation, summed by word on both sides (`word_alignment`; without
it, `monotone_alignment`, the words in order). A target word belongs to a tag when it is the
target word that attends most to one of the words the tag covered, or when it stands beside one
that belongs and the source word it attends to most is one the tag covered; the tag then covers
the contiguous run of target words with the best score (+1 a word that belongs, or a punctuation
mark it covered; -0.6 a word that does not, -0.1 a mark: a lone word between two that belong is
taken, two are not), or the single word that attends most to its words when none belongs. Tags
nest as in the source: an element inside another is placed within the other's words, and elements
side by side never share a word. Punctuation at the ends of the covered words stays outside unless the source's
covered text had it there. A WHOLE mark replaces the words it covered. The words of the translation
are written through the format's `escape` (HTML: & < > as entities, and each character the source
piece wrote as a reference written the same way).
"""
from __future__ import annotations

import bisect
import re
import unicodedata
from dataclasses import dataclass, field
from typing import Callable, NamedTuple, Sequence

CUT, OPEN, CLOSE, WHOLE, READ = "cut", "open", "close", "whole", "read"
WORD = re.compile(r"\w+|[^\w\s]")  # a word, or a punctuation mark (or symbol) of its own
ALNUM = re.compile(r"[^\W_]")
# The run's score of a target word that belongs to the tag, of a word that does not, and of a mark
# (punctuation, a symbol) that does not: a run bridges marks more readily than words.
IN_WORD, OUT_WORD, OUT_MARK = 1.0, -0.6, -0.1

Escape = Callable[[str, dict[str, str]], str]


class Mark(NamedTuple):
    """Markup that a reader found in a fragment of a flow (offsets into it): its role, the pair an
    OPEN and its CLOSE share, and for READ and WHOLE what the translator reads in its place."""

    start: int
    end: int
    role: str = CUT
    pair: int = -1
    text: str = ""


class Tag(NamedTuple):
    """Markup of a piece and the span of its prose [start, end) that it covered: an element's
    `opener` and `closer`, or a WHOLE mark (`opener` its text, `closer` ""); `parent`: the index of
    the tag it lies in (-1: none)."""

    opener: str
    closer: str
    start: int
    end: int
    whole: bool = False
    parent: int = -1


@dataclass
class InlinePiece:
    """A piece's prose, as the translator gets it, and its tags; `entities`: each character the
    source wrote as a character reference, and how (&copy;)."""

    prose: str
    tags: list[Tag]
    entities: dict[str, str] = field(default_factory=dict)


@dataclass
class Alignment:
    """weights[t][s]: how much the translation's word t attended to the source's word s (words:
    runs of letters and digits, and each other character but space: WORD), each row summing to 1
    (or 0 for a word with no tokens)."""

    weights: list[list[float]]


class ProseBuilder:
    """The prose of a piece, built as the reader walks it: whitespace runs one space, none at the
    ends."""

    def __init__(self) -> None:
        self.chars: list[str] = []
        self.space = False

    def add(self, text: str) -> None:
        for char in text:
            if char.isspace():
                self.space = bool(self.chars)
            else:
                if self.space:
                    self.chars.append(" ")
                    self.space = False
                self.chars.append(char)

    def __len__(self) -> int:
        return len(self.chars)

    def text(self) -> str:
        return "".join(self.chars)


def read_piece(raw: str, marks: Sequence[Mark]) -> InlinePiece:
    """The prose and tags of a piece whose markup is `marks` (offsets into `raw`, in order, none of
    them CUT; every OPEN's CLOSE among them)."""
    prose, tags, entities = ProseBuilder(), [], {}
    open_tags: dict[int, int] = {}  # pair -> its tag's index
    stack: list[int] = []
    position = 0
    for mark in marks:
        prose.add(raw[position:mark.start])
        written = raw[mark.start:mark.end]
        parent = stack[-1] if stack else -1
        if mark.role == OPEN:
            open_tags[mark.pair] = len(tags)
            tags.append(Tag(written, "", len(prose) + prose.space, -1, parent=parent))
            stack.append(len(tags) - 1)
        elif mark.role == CLOSE:
            index = open_tags.pop(mark.pair)
            stack.remove(index)
            tags[index] = tags[index]._replace(closer=written, end=len(prose))
        elif mark.role == WHOLE:
            start = len(prose) + prose.space
            prose.add(mark.text)
            tags.append(Tag(written, "", start, max(len(prose), start), whole=True, parent=parent))
        else:  # READ
            prose.add(mark.text)
            if len(mark.text) == 1 and not mark.text.isspace():
                entities[mark.text] = written
        position = mark.end
    prose.add(raw[position:])
    text = prose.text()
    return InlinePiece(text, [tag._replace(start=min(tag.start, len(text)), end=max(min(tag.end, len(text)),
                                                                                   min(tag.start, len(text))))
                              for tag in tags], entities)


def inside_words(piece: InlinePiece) -> list[int]:
    """The tags of `piece` that begin or end inside a word (a letter or digit on both sides of the
    tag, as in un<b>believ</b>able): placed by words, they would take the whole word."""
    def splits(position: int) -> bool:
        return 0 < position < len(piece.prose) and bool(ALNUM.match(piece.prose, position - 1)) and \
            bool(ALNUM.match(piece.prose, position))

    return [index for index, tag in enumerate(piece.tags) if splits(tag.start) or splits(tag.end)]


def words(text: str) -> list[tuple[int, int]]:
    return [match.span() for match in WORD.finditer(text)]


def word_of_tokens(text: str, offsets: Sequence[tuple[int, int]]) -> list[int]:
    """The word of `text` each token (character offsets) belongs to: the one its first non-space
    character is in (-1: a token of whitespace alone)."""
    spans = words(text)
    ends = [end for _, end in spans]
    found = []
    for start, end in offsets:
        while start < end and text[start].isspace():
            start += 1
        index = bisect.bisect_right(ends, start)
        found.append(index if start < end and index < len(spans) and spans[index][0] <= start else -1)
    return found


def word_alignment(source: str, source_offsets: Sequence[tuple[int, int]], target: str,
                   target_offsets: Sequence[tuple[int, int]], attention: Sequence[Sequence[float]]) -> Alignment:
    """Token attention (attention[i][j]: target token i to source token j) summed into words: a
    target word's row is the mean of its tokens' rows, each summed over the tokens of each source
    word, then normalised."""
    source_words, target_words = word_of_tokens(source, source_offsets), word_of_tokens(target, target_offsets)
    weights = [[0.0] * len(words(source)) for _ in words(target)]
    for row, word in zip(attention, target_words):
        if word < 0:
            continue
        for weight, source_word in zip(row, source_words):
            if source_word >= 0:
                weights[word][source_word] += weight
    for row in weights:
        total = sum(row)
        if total > 0:
            row[:] = [weight / total for weight in row]
    return Alignment(weights)


def monotone_alignment(source: str, target: str) -> Alignment:
    """The alignment of a translation with the source's words in the same order, each target word of
    letters or digits on the source's such word at the same relative place (punctuation: none):
    what placement falls back on without attention."""
    source_words, target_words = words(source), words(target)
    source_content = [i for i, span in enumerate(source_words) if ALNUM.search(source, *span)]
    target_content = [i for i, span in enumerate(target_words) if ALNUM.search(target, *span)]
    weights = [[0.0] * len(source_words) for _ in target_words]
    for k, t in enumerate(target_content):
        if source_content:
            weights[t][source_content[min(int((k + 0.5) * len(source_content) / len(target_content)),
                                          len(source_content) - 1)]] = 1.0
    return Alignment(weights)


def belonging(weights: Sequence[Sequence[float]], covered: set[int], content: Sequence[bool]) -> list[bool]:
    """For each target word, whether it belongs to a tag that covered the source words `covered`:
    the target word that attends most to one of them does, and so, grown from those, does a target
    word beside one that belongs whose own most attended source word is one of them (the neighbours
    of grow-diag: a word translated by two, "went" -> "è andato", without taking every far word whose
    attention strays onto the covered ones). Only words of the covered ones' kind (`content`: of
    letters or digits, or not) belong: a full stop that attends to the last source word is no
    translation of it."""
    found = [False] * len(weights)
    for source_word in covered:
        column = [row[source_word] if usable else 0.0 for row, usable in zip(weights, content)]
        if any(column):
            found[column.index(max(column))] = True
    tops = [max(range(len(row)), key=row.__getitem__) if any(row) else -1 for row in weights]
    alike = [t for t, usable in enumerate(content) if usable]  # beside: the next word of that kind (l'uomo)
    grown = True
    while grown:
        grown = False
        for k, t in enumerate(alike):
            if not found[t] and tops[t] in covered and (k > 0 and found[alike[k - 1]] or
                                                        k + 1 < len(alike) and found[alike[k + 1]]):
                found[t] = grown = True
    return found


def best_run(scores: Sequence[float], free: Sequence[bool]) -> tuple[int, int] | None:
    """The run [first, end) of consecutive free words whose scores add up most; None when no run
    adds up to more than 0."""
    best, found, total, start = 0.0, None, 0.0, 0
    for index, (score, usable) in enumerate(zip(scores, free)):
        if not usable:
            total, start = 0.0, index + 1
            continue
        if total <= 0:
            total, start = 0.0, index
        total += score
        if total > best:
            best, found = total, (start, index + 1)
    return found


def word_runs(piece: InlinePiece, translation: str, targets: list[tuple[int, int]],
              alignment: Alignment) -> list[tuple[int, int]]:
    """Each tag's run of target words [first, end) (first == end: none, the tag goes before word
    `first`), parents before their children (read_piece lists them so)."""
    sources = words(piece.prose)
    content = [bool(ALNUM.search(translation, *span)) for span in targets]
    runs: list[tuple[int, int]] = []
    taken: dict[int, set[int]] = {}  # a parent's children's words
    for tag in piece.tags:
        low, high = (0, len(targets)) if tag.parent < 0 else runs[tag.parent]
        siblings = taken.setdefault(tag.parent, set())
        free = [low <= t < high and t not in siblings for t in range(len(targets))]
        covered = {i for i, (a, b) in enumerate(sources) if a < tag.end and tag.start < b}
        prose = {i for i in covered if ALNUM.search(piece.prose, *sources[i])}
        marks = {piece.prose[slice(*sources[i])] for i in covered - prose}
        covered = prose or covered
        kind = [found == bool(prose) for found in content]  # words for words, else marks for marks
        run = None
        if covered and any(free):
            found = belonging(alignment.weights, covered, kind)
            # a mark the tag covered belongs where the translation has it (the # of `#`)
            scores = [IN_WORD if found[t] or not content[t] and translation[slice(*targets[t])] in marks else
                      OUT_WORD if content[t] else OUT_MARK for t in range(len(targets))]
            run = best_run(scores, free)
            if run is None:
                usable = [t for t in range(len(targets)) if free[t] and kind[t]] or \
                    [t for t in range(len(targets)) if free[t]]
                best = max(usable, key=lambda t: sum(alignment.weights[t][s] for s in covered))
                run = (best, best + 1)
        if run is None:  # nothing to cover: before the target word of the source word after it
            after = [i for i, (a, _) in enumerate(sources) if a >= tag.start]
            position = high
            if after and alignment.weights:
                column = [alignment.weights[t][after[0]] if low <= t < high else -1.0 for t in range(len(targets))]
                position = column.index(max(column)) if max(column) > 0 else high
            run = (position, position)
        siblings.update(range(*run))
        runs.append(run)
    return runs


def punctuation(char: str) -> bool:
    return unicodedata.category(char).startswith("P")


def trimmed(text: str, start: int, end: int, covered: str) -> tuple[int, int]:
    """[start, end) of `text` without the punctuation at its ends that `covered` (the source's
    covered text) does not have at its own."""
    covered = covered.strip()
    if not (covered and punctuation(covered[-1])):
        while end - 1 > start and punctuation(text[end - 1]):
            end -= 1
    if not (covered and punctuation(covered[0])):
        while start + 1 < end and punctuation(text[start]):
            start += 1
    return start, end


def character_spans(piece: InlinePiece, translation: str, targets: list[tuple[int, int]],
                    runs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Each tag's span of characters of the translation, within its parent's."""
    spans: list[tuple[int, int]] = []
    for tag, (first, end) in zip(piece.tags, runs):
        outer = (0, len(translation)) if tag.parent < 0 else spans[tag.parent]
        if first == end:
            at = targets[first][0] if first < len(targets) else outer[1]
            span = (at, at)
        else:
            span = trimmed(translation, targets[first][0], targets[end - 1][1], piece.prose[tag.start:tag.end])
        spans.append((min(max(span[0], outer[0]), outer[1]), min(max(span[1], outer[0]), outer[1])))
    return spans


def place(piece: InlinePiece, translation: str, alignment: Alignment | None = None,
          escape: Escape | None = None) -> tuple[str, list[tuple[int, int]]]:
    """The translation of `piece` with its tags around the words they covered (module docstring),
    and where the markup lies in it; without `alignment` (or with one of other words) the
    monotone one."""
    targets, sources = words(translation), words(piece.prose)
    if alignment is None or len(alignment.weights) != len(targets) or \
            any(len(row) != len(sources) for row in alignment.weights):
        alignment = monotone_alignment(piece.prose, translation)
    spans = character_spans(piece, translation, targets, word_runs(piece, translation, targets, alignment))
    depth = [0] * len(piece.tags)
    for index, tag in enumerate(piece.tags):
        depth[index] = depth[tag.parent] + 1 if tag.parent >= 0 else 0
    events = []  # (position, closers first, outer openers and inner closers first, text, end of what it replaces)
    for index, (tag, (start, end)) in enumerate(zip(piece.tags, spans)):
        if tag.whole or start == end:
            events.append((start, 1, depth[index], tag.opener + tag.closer, end if tag.whole else start))
        else:
            events += [(start, 1, depth[index], tag.opener, start), (end, 0, -depth[index], tag.closer, end)]
    out, markup, position = [], [], 0
    length = 0
    for at, _, _, text, skip in sorted(events, key=lambda event: event[:3]):
        if at > position:
            segment = translation[position:at]
            written = escape(segment, piece.entities) if escape else segment
            out.append(written)
            length += len(written)
        markup.append((length, length + len(text)))
        out.append(text)
        length += len(text)
        position = max(position, skip, at)
    rest = translation[position:]
    out.append(escape(rest, piece.entities) if escape else rest)
    return "".join(out), markup
