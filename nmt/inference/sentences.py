"""Sentences of real text, and the text's shape put back around their translations.

A model translates sentences; people give it text. This module turns lines of text into the
pieces a translator gets, and puts the translations back where the pieces were:
- `sentence_spans(text, language)`: where each sentence is, as character offsets into `text`, by
  sentencex's rules for the source language (abbreviations, decimals, quotes and ellipses do not
  end a sentence). Whitespace around a sentence is outside its span, so indentation, the spacing
  between sentences and trailing whitespace are copied from the input, never rebuilt.
- URLs and e-mail addresses (or, for documents, any pattern of text that must stay as it is, and
  the spans a document's parser found to be markup) are never translated: a sentence is cut around
  them, the text on either side is translated, and they are put back unchanged. A piece with no
  letter in it (a number, a lone bracket) is kept as it is.
- A piece longer than the model's limit (`count_tokens(piece) > max_tokens`) is cut at the best
  boundary inside it: clause punctuation near its middle, else the whitespace nearest the middle,
  else the middle itself; again until every piece fits. Nothing is truncated.
- A flow is text whose sentences may run across several fragments (the lines of a Markdown
  paragraph, the lines of consecutive subtitle cues): sentences are found in the fragments joined
  by spaces, and a piece's translation that spans fragments is cut back into them in proportion to
  the piece's non-space characters in each (`distribute`). A line of plain text is a flow of one
  fragment.
`plan_lines` / `plan_flows` give a `TextPlan`: `sources` (all pieces, for ONE call of the
translator, which sorts them by length itself), `assemble(translations)`, `split_for_length` (for
a count on stderr) and `sentences(translations)` (each sentence's span in its flow's text, and
its translation, for an API). `translate_lines`
does both for a list of lines: one output line per input line, blank and whitespace-only lines
back as they were.
"""
from __future__ import annotations

import bisect
import itertools
import re
import unicodedata
from dataclasses import dataclass, field
from typing import Callable, NamedTuple, Sequence

from sentencex import get_sentence_boundaries

# A URL ends before punctuation that follows it (the full stop after "see https://x.org."). Both
# patterns start only where a run of their characters starts, so a long word costs linear time.
URL = r"(?<![A-Za-z0-9+.-])(?:[A-Za-z][A-Za-z0-9+.-]*://|www\.)\S*[^\s.,;:!?'\")\]}>]"
EMAIL = r"(?<![\w.+-])[\w.+-]+@[\w-]+(?:\.[\w-]+)+"
URL_OR_EMAIL = re.compile(f"{URL}|{EMAIL}")

# Where a too-long piece is best cut: after clause punctuation followed by whitespace (or after
# CJK punctuation, which no space follows), and around a dash between spaces.
CLAUSE_BREAK = re.compile(r"(?<=[,;:.!?…)\]}\"'”’»])\s+|(?<=[，；：。！？、])|\s+(?=[-–—]\s)")
WHITESPACE = re.compile(r"\s+")
DOUBLE_QUOTE = re.compile(r"[\"“”„«»]")
LETTER = re.compile(r"[^\W\d_]")

CountTokens = Callable[[str], int]
Translate = Callable[[list[str]], list[str]]


class Span(NamedTuple):
    start: int
    end: int


def stripped(text: str, start: int, end: int) -> Span:
    """The span of text[start:end] without the whitespace at its ends."""
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return Span(start, end)


def sentence_spans(text: str, language: str, protected: re.Pattern = URL_OR_EMAIL,
                   shields: list[Span] | None = None) -> list[Span]:
    """The sentences of `text` for `language` (an ISO 639 code; sentencex falls back to related
    languages, then to English rules), as spans without their surrounding whitespace. A boundary
    that would cut a match of `protected` is not one (`shields`: those matches, if already found).

    sentencex never ends a sentence inside a quotation, so a quoted passage of several sentences
    (news' "We agreed. The vote is on Sunday," she said.) would reach the model as one long one:
    it reads the text with its double quotes as spaces (same offsets), and `settle_quotes` gives
    each quote mark to the sentence it opens or closes."""
    shields = [Span(*m.span()) for m in protected.finditer(text)] if shields is None else shields
    spans: list[Span] = []
    for boundary in get_sentence_boundaries(language, DOUBLE_QUOTE.sub(" ", text)):
        span = stripped(text, boundary["start_index"], boundary["end_index"])
        if span.start == span.end:
            continue
        if spans and any(a < spans[-1].end and span.start < b for a, b in shields):
            spans[-1] = Span(spans[-1].start, span.end)
        else:
            spans.append(span)
    return settle_quotes(text, spans)


def settle_quotes(text: str, spans: list[Span]) -> list[Span]:
    """`spans` with each double quote mark at a boundary on its side: one right after a sentence's
    end and before whitespace (or the text's end) closes that sentence; one after whitespace and
    before a word opens the next. A sentence that a closing mark ends and a lower-case word follows
    goes on (She said "Stop." and left.), as sentencex has it where it reads the quotes."""
    settled: list[Span] = []
    for span in spans:
        if not settled:
            settled.append(span)
            continue
        previous = settled[-1]
        while span.start < span.end and DOUBLE_QUOTE.match(text, span.start) and \
                (span.start + 1 == span.end or text[span.start + 1].isspace()):  # a closing mark
            previous, span = Span(previous.start, span.start + 1), stripped(text, span.start + 1, span.end)
        while previous.end - previous.start > 1 and DOUBLE_QUOTE.match(text, previous.end - 1) and \
                text[previous.end - 2].isspace() and span.start == previous.end:  # an opening mark
            previous, span = stripped(text, previous.start, previous.end - 1), Span(previous.end - 1, span.end)
        closed = previous.end - previous.start > 1 and DOUBLE_QUOTE.match(text, previous.end - 1) is not None and \
            not text[previous.end - 2].isspace()
        if closed and span.start < span.end and text[span.start].islower():
            previous, span = Span(previous.start, span.end), Span(span.end, span.end)
        settled[-1] = previous
        if span.start < span.end:
            settled.append(span)
    return settled


def best_cut(text: str) -> Span | None:
    """Where to cut `text` in two (the span of what goes between the parts), or None if it is a
    single character: clause punctuation in its middle half, else whitespace, else the middle."""
    middle = len(text) / 2

    def nearest(spans: list[Span]) -> Span | None:
        inner = [s for s in spans if 0 < s.start and s.end < len(text)]
        return min(inner, key=lambda s: abs((s.start + s.end) / 2 - middle), default=None)

    clause = nearest([Span(*m.span()) for m in CLAUSE_BREAK.finditer(text)
                      if len(text) / 4 <= m.start() <= 3 * len(text) / 4])
    cut = clause or nearest([Span(*m.span()) for m in WHITESPACE.finditer(text)])
    if cut is not None or len(text) < 2:
        return cut
    position = len(text) // 2
    while 1 < position and unicodedata.combining(text[position]):  # keep accents with their letters
        position -= 1
    return Span(position, position)


def fitting_pieces(text: str, start: int, end: int, count_tokens: CountTokens | None,
                   max_tokens: int | None) -> list[Span]:
    """text[start:end] (no whitespace at its ends) as spans of at most `max_tokens` tokens each."""
    if count_tokens is None or max_tokens is None or count_tokens(text[start:end]) <= max_tokens:
        return [Span(start, end)]
    cut = best_cut(text[start:end])
    if cut is None:
        return [Span(start, end)]
    left = stripped(text, start, start + cut.start)
    right = stripped(text, start + cut.end, end)
    return (fitting_pieces(text, left.start, left.end, count_tokens, max_tokens)
            + fitting_pieces(text, right.start, right.end, count_tokens, max_tokens))


def text_pieces(text: str, sentence: Span, shields: list[Span]) -> list[Span]:
    """The parts of a sentence to translate: what lies between the `shields` (spans to keep as they
    are, in order) inside it, without whitespace at its ends, and only parts with a letter in them."""
    pieces, position = [], sentence.start
    for shield in shields[bisect.bisect_left(shields, (sentence.start,)):]:
        if shield.end > sentence.end:
            break
        pieces.append(stripped(text, position, shield.start))
        position = shield.end
    pieces.append(stripped(text, position, sentence.end))
    return [p for p in pieces if LETTER.search(text, p.start, p.end)]


def distribute(translation: str, weights: Sequence[int]) -> list[str]:
    """`translation` cut into len(weights) parts whose non-space characters are in proportion to
    `weights`, at whitespace (or, when it has fewer words than parts, between characters); each
    part gets something while it can. Weights counted the same way on the source give the source's
    own cuts back for an unchanged text."""
    translation = translation.strip()
    if len(weights) == 1:
        return [translation]
    gaps = [Span(*m.span()) for m in WHITESPACE.finditer(translation)]
    if len(gaps) < len(weights) - 1:
        gaps = [Span(i, i) for i in range(1, len(translation))]
    letters = list(itertools.accumulate((not c.isspace() for c in translation), initial=0))
    before = [letters[gap.start] for gap in gaps]  # non-space characters before each gap
    total, running, low, cuts = sum(weights) or 1, 0, 0, []
    for index, weight in enumerate(weights[:-1]):
        running += weight
        high = len(gaps) - (len(weights) - 1 - index)  # leave a gap for each later part
        if high < low:
            break
        ideal = letters[-1] * running / total
        at = min(max(bisect.bisect_left(before, ideal, low, high + 1), low), high)
        if at > low and ideal - before[at - 1] <= before[at] - ideal:
            at -= 1
        cuts.append(gaps[at])
        low = at + 1
    ends = [Span(0, 0)] + cuts + [Span(len(translation), len(translation))]
    parts = [translation[a.end:b.start].strip() for a, b in zip(ends, ends[1:])]
    return parts + [""] * (len(weights) - len(parts))


@dataclass
class Flow:
    """Fragments of text read as one (joined by single spaces into `text`): where each fragment
    lies in `text`, the pieces to translate, and which pieces each sentence holds."""

    text: str
    fragments: list[Span]
    pieces: list[Span] = field(default_factory=list)
    sentences: list[tuple[Span, int, int]] = field(default_factory=list)  # span, its pieces [first, end)

    def source(self, piece: Span) -> str:
        """What the translator gets of a piece: its text, each run of whitespace in it (a line break
        in a flow, a no-break space) one space."""
        return " ".join(self.text[piece.start:piece.end].split())

    def render(self, translations: Sequence[str]) -> list[str]:
        """Each fragment with its pieces replaced by their share of the pieces' translations; a
        piece the translator gave back as it got it is put back as it was, whitespace included."""
        starts = [f.start for f in self.fragments]
        shares: list[list[tuple[Span, str]]] = [[] for _ in self.fragments]
        for piece, translation in zip(self.pieces, translations):
            if translation == self.source(piece):
                translation = self.text[piece.start:piece.end]
            first, end = bisect.bisect_right(starts, piece.start) - 1, bisect.bisect_left(starts, piece.end)
            if end - first == 1:  # the common case: a piece within one fragment
                shares[first].append((piece, translation))
                continue
            touched, weights = [], []
            for i in range(first, end):
                fragment = self.fragments[i]
                letters = sum(not c.isspace() for c in self.text[max(piece.start, fragment.start):
                                                                 min(piece.end, fragment.end)])
                if letters:
                    touched.append(i)
                    weights.append(letters)
            for i, part in zip(touched, distribute(translation, weights)):
                shares[i].append((piece, part))
        return [self.render_fragment(fragment, share) for fragment, share in zip(self.fragments, shares)]

    def render_fragment(self, fragment: Span, shares: list[tuple[Span, str]]) -> str:
        """The fragment with each piece's share in place of the piece's part of it; whitespace at
        that part's ends (a line's indentation, a no-break space) stays."""
        out, position = [], fragment.start
        for piece, part in shares:
            inside = stripped(self.text, max(piece.start, fragment.start), min(piece.end, fragment.end))
            out += [self.text[position:inside.start], part]
            position = inside.end
        out.append(self.text[position:fragment.end])
        return "".join(out)


@dataclass
class Sentence:
    """A sentence of a flow (its span in `Flow.text`) and its translation."""

    flow: int
    span: Span
    translation: str


@dataclass
class TextPlan:
    """What to translate for some flows, and how to put the translations back.
    `split_for_length`: how many sentences were cut because they exceeded the model's limit."""

    flows: list[Flow]
    split_for_length: int = 0

    @property
    def sources(self) -> list[str]:
        """The pieces to translate, in order (Flow.source)."""
        return [flow.source(p) for flow in self.flows for p in flow.pieces]

    def per_flow(self, translations: Sequence[str]) -> list[list[str]]:
        expected = sum(len(flow.pieces) for flow in self.flows)
        if len(translations) != expected:
            raise ValueError(f"{len(translations)} translations for {expected} pieces")
        grouped, position = [], 0
        for flow in self.flows:
            grouped.append([t.strip() for t in translations[position:position + len(flow.pieces)]])
            position += len(flow.pieces)
        return grouped

    def assemble(self, translations: Sequence[str]) -> list[list[str]]:
        """Each flow's fragments, translated, in the input's shape."""
        return [flow.render(found) for flow, found in zip(self.flows, self.per_flow(translations))]

    def sentences(self, translations: Sequence[str]) -> list[Sentence]:
        """Each sentence's span and its translation: its pieces' translations with what lies
        between them (URLs, the space at a fragment's end) copied from the input."""
        found = []
        for index, (flow, pieces) in enumerate(zip(self.flows, self.per_flow(translations))):
            for span, first, end in flow.sentences:
                out, position = [], span.start
                for piece, translation in zip(flow.pieces[first:end], pieces[first:end]):
                    out += [flow.text[position:piece.start], translation]
                    position = piece.end
                out.append(flow.text[position:span.end])
                found.append(Sentence(index, span, " ".join("".join(out).split())))
        return found


def merged(spans: list[Span]) -> list[Span]:
    """`spans` sorted, those that overlap made one (a URL in a link's destination, an escaped pipe
    in a table cell's code)."""
    out: list[Span] = []
    for span in sorted(spans):
        if out and span.start < out[-1].end:
            out[-1] = Span(out[-1].start, max(out[-1].end, span.end))
        else:
            out.append(span)
    return out


def plan_flow(fragments: Sequence[str], kept: Sequence[Sequence[Span]], language: str, split_sentences: bool,
              protected: re.Pattern, count_tokens: CountTokens | None,
              max_tokens: int | None) -> tuple[Flow, int]:
    """One flow's plan, and how many of its sentences were cut for length; `kept`: for each
    fragment, spans of it (offsets into the fragment) to keep as they are."""
    text, spans, position = " ".join(fragments), [], 0
    for fragment in fragments:
        spans.append(Span(position, position + len(fragment)))
        position += len(fragment) + 1
    flow, cut = Flow(text, spans), 0
    whole = stripped(text, 0, len(text))
    shields = merged([Span(*m.span()) for m in protected.finditer(text)] +
                     [Span(fragment.start + a, fragment.start + b) for fragment, found in zip(spans, kept)
                      for a, b in found])
    sentences = sentence_spans(text, language, shields=shields) if split_sentences else [whole]
    for sentence in (s for s in sentences if s.start < s.end):
        first, pieces = len(flow.pieces), text_pieces(text, sentence, shields)
        for piece in pieces:
            flow.pieces += fitting_pieces(text, piece.start, piece.end, count_tokens, max_tokens)
        cut += len(flow.pieces) - first > len(pieces)
        flow.sentences.append((sentence, first, len(flow.pieces)))
    return flow, cut


def plan_flows(flows: Sequence[Sequence[str]], language: str, *, split_sentences: bool = True,
               protected: re.Pattern = URL_OR_EMAIL, kept: Sequence[Sequence[Sequence[Span]]] | None = None,
               count_tokens: CountTokens | None = None, max_tokens: int | None = None) -> TextPlan:
    """The plan for flows, each given as its fragments' texts. Without `split_sentences` a flow is
    one sentence (what is outside its pieces is still kept as it is). `kept`: for each flow, for
    each of its fragments, the spans to keep as they are besides `protected`'s matches (a
    document's markup, found by its parser)."""
    if max_tokens is not None and max_tokens < 1:
        raise ValueError(f"max_tokens must be at least 1, not {max_tokens}")
    plan = TextPlan([])
    for index, fragments in enumerate(flows):
        found = kept[index] if kept is not None else [()] * len(fragments)
        flow, cut = plan_flow(fragments, found, language, split_sentences, protected, count_tokens, max_tokens)
        plan.flows.append(flow)
        plan.split_for_length += cut
    return plan


def plan_lines(lines: Sequence[str], language: str, **options) -> TextPlan:
    """The plan for lines of plain text, each its own flow (a sentence never runs across lines)."""
    return plan_flows([[line] for line in lines], language, **options)


def translate_lines(lines: Sequence[str], translate: Translate, language: str, **options) -> list[str]:
    """The lines translated sentence by sentence, in one call of `translate`, in the lines' shape:
    one output line per input line, blank lines, indentation and spacing as they were. `options`
    are plan_flows' (split_sentences, protected, count_tokens, max_tokens)."""
    plan = plan_lines(lines, language, **options)
    found = translate(plan.sources) if plan.sources else []
    return [fragments[0] for fragments in plan.assemble(found)]
