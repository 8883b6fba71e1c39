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
from typing import Callable, NamedTuple, Sequence, TypeVar

from sentencex import get_sentence_boundaries

from nmt.inference.inline_tags import CLOSE, CUT, OPEN, WHOLE, Alignment, Escape, InlinePiece, Mark, place, read_piece
from nmt.inference.inline_tags import inside_words as inline_inside_words

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


def distribute(translation: str, weights: Sequence[int], unbreakable: Sequence[Span] = ()) -> list[str]:
    """`translation` cut into len(weights) parts whose non-space characters are in proportion to
    `weights`, at whitespace (or, when it has fewer words than parts, between characters), never
    inside an `unbreakable` span (markup placed in it); each part gets something while it can.
    Weights counted the same way on the source give the source's own cuts back for an unchanged
    text."""
    lead = len(translation) - len(translation.lstrip())
    translation = translation.strip()
    if len(weights) == 1:
        return [translation]

    def breakable(gap: Span) -> bool:
        return not any(a - lead < gap.end and gap.start < b - lead for a, b in unbreakable)

    gaps = [gap for gap in (Span(*m.span()) for m in WHITESPACE.finditer(translation)) if breakable(gap)]
    if len(gaps) < len(weights) - 1:
        gaps = [gap for gap in (Span(i, i) for i in range(1, len(translation))) if breakable(Span(gap.start - 1,
                                                                                                   gap.end + 1))]
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
    lies in `text`, the pieces to translate, which pieces each sentence holds, and the inline
    markup of the pieces that keep some (inline_tags.py)."""

    text: str
    fragments: list[Span]
    pieces: list[Span] = field(default_factory=list)
    sentences: list[tuple[Span, int, int]] = field(default_factory=list)  # span, its pieces [first, end)
    inline: dict[int, InlinePiece] = field(default_factory=dict)  # a piece's index -> its prose and tags

    def source(self, index: int) -> str:
        """What the translator gets of piece `index`: its text, each run of whitespace in it (a line
        break in a flow, a no-break space) one space; its prose, for a piece with inline markup."""
        if index in self.inline:
            return self.inline[index].prose
        piece = self.pieces[index]
        return " ".join(self.text[piece.start:piece.end].split())

    def written(self, index: int, translation: str, escape: Escape | None,
                alignment: Alignment | None) -> tuple[str, list[Span]]:
        """What the translation of piece `index` is written as, and the markup in it: its tags placed
        (inline_tags.place), its words through the format's `escape`."""
        if index in self.inline:
            text, markup = place(self.inline[index], translation, alignment, escape)
            return text, [Span(*span) for span in markup]
        return (escape(translation, {}) if escape else translation), []

    def render(self, translations: Sequence[str], escape: Escape | None = None,
               alignments: dict[tuple[int, str], Alignment] | None = None) -> list[str]:
        """Each fragment with its pieces replaced by their share of the pieces' translations; a
        piece the translator gave back as it got it is put back as it was, whitespace and markup
        included. `alignments`: the model's, by (piece index, translation), for placing tags."""
        starts = [f.start for f in self.fragments]
        shares: list[list[tuple[Span, str]]] = [[] for _ in self.fragments]
        for index, (piece, translation) in enumerate(zip(self.pieces, translations)):
            first, end = bisect.bisect_right(starts, piece.start) - 1, bisect.bisect_left(starts, piece.end)
            if translation == self.source(index):
                for i in range(first, end):
                    part = stripped(self.text, max(piece.start, self.fragments[i].start),
                                    min(piece.end, self.fragments[i].end))
                    if part.start < part.end:
                        shares[i].append((piece, self.text[part.start:part.end]))
                continue
            written, markup = self.written(index, translation, escape, (alignments or {}).get((index, translation)))
            if end - first == 1:  # the common case: a piece within one fragment
                shares[first].append((piece, written))
                continue
            touched, weights = [], []
            for i in range(first, end):
                fragment = self.fragments[i]
                letters = sum(not c.isspace() for c in self.text[max(piece.start, fragment.start):
                                                                 min(piece.end, fragment.end)])
                if letters:
                    touched.append(i)
                    weights.append(letters)
            for i, part in zip(touched, distribute(written, weights, markup)):
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
    `split_for_length`: how many sentences were cut because they exceeded the model's limit.
    `escape`: how the format writes a translation's words (None: as they are). `alignments`: the
    model's alignment of a translation with the piece it translates, by (piece index, translation),
    which places the piece's tags (Translator.place_inline fills it; without one, the monotone)."""

    flows: list[Flow]
    split_for_length: int = 0
    escape: Escape | None = None
    alignments: dict[tuple[int, str], Alignment] = field(default_factory=dict)

    @property
    def sources(self) -> list[str]:
        """The pieces to translate, in order (Flow.source)."""
        return [flow.source(index) for flow in self.flows for index in range(len(flow.pieces))]

    @property
    def marked(self) -> dict[int, InlinePiece]:
        """The pieces that hold inline markup, by their index in `sources`."""
        found, offset = {}, 0
        for flow in self.flows:
            found.update({offset + index: piece for index, piece in flow.inline.items()})
            offset += len(flow.pieces)
        return found

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
        rendered, offset = [], 0
        for flow, found in zip(self.flows, self.per_flow(translations)):
            alignments = {(index - offset, text): alignment for (index, text), alignment in self.alignments.items()
                          if offset <= index < offset + len(flow.pieces)} if self.alignments else None
            rendered.append(flow.render(found, self.escape, alignments))
            offset += len(flow.pieces)
        return rendered

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


SpanLike = TypeVar("SpanLike", Span, Mark)


def merged(spans: list[SpanLike]) -> list[SpanLike]:
    """`spans` sorted, those that overlap made one (a URL in a link's destination, an escaped pipe
    in a table cell's code): of their type, with its defaults (a Mark that cuts)."""
    out: list[SpanLike] = []
    for span in sorted(spans):
        if out and span.start < out[-1].end:
            out[-1] = type(span)(out[-1].start, max(out[-1].end, span.end))
        else:
            out.append(span)
    return out


def flow_marks(fragments: Sequence[Span], kept: Sequence[Sequence[Span | Mark]], urls: list[Span]) -> list[Mark]:
    """A flow's markup (`kept`: each fragment's, as offsets into it; a plain span is CUT) as offsets
    into the flow's text, in order. A URL inside a mark is the mark's; markup a URL runs into cuts
    the sentence with the URL."""
    marks = sorted(Mark(fragment.start + m[0], fragment.start + m[1], *m[2:])
                   for fragment, found in zip(fragments, kept) for m in found)
    return [m._replace(role=CUT) if any(u.start < m.end and m.start < u.end and not (m.start <= u.start and
                                                                                     u.end <= m.end)
                                        for u in urls) else m for m in marks]


def settle_marks(text: str, sentences: list[Span], marks: list[Mark]) -> list[Span]:
    """`sentences` with an element's closing tag that starts a sentence given to the sentence its
    opening tag is in, and an opening tag that ends one given to the sentence of its closing tag
    (<b>It rains.</b> We stay.)."""
    opening = {m.pair: m.start for m in marks if m.role == OPEN}
    closing = {m.pair: m.end for m in marks if m.role == CLOSE}
    settled = list(sentences)
    for k in range(1, len(settled)):
        before, after = settled[k - 1], settled[k]
        for mark in marks:
            if mark.role == CLOSE and mark.start == after.start and before.start <= opening.get(mark.pair, -1):
                before, after = Span(before.start, mark.end), stripped(text, mark.end, after.end)
        for mark in reversed(marks):
            if mark.role == OPEN and mark.end == before.end and closing.get(mark.pair, -1) <= after.end and \
                    before.start < mark.start:
                before, after = stripped(text, before.start, mark.start), Span(mark.start, after.end)
        settled[k - 1], settled[k] = before, after
    return [span for span in settled if span.start < span.end]


def sentence_pieces(text: str, sentence: Span, urls: list[Span], marks: list[Mark],
                    demoted: set[int]) -> list[tuple[Span, list[Mark]]]:
    """The pieces of a sentence and the inline markup each keeps: CUT marks, the `demoted` (by
    their start) and URLs cut it, and so do an element's tags that would fall in different pieces
    (or one outside the sentence); a piece's elements that enclose all of it are left outside it."""
    inside = [m for m in marks if sentence.start <= m.start and m.end <= sentence.end]
    pairs: dict[int, list[Mark]] = {}
    for mark in inside:
        if mark.role in (OPEN, CLOSE):
            pairs.setdefault(mark.pair, []).append(mark)
    broken = {pair for pair, found in pairs.items() if len(found) != 2 or any(m.start in demoted for m in found)}
    while True:
        cuts = [Span(m.start, m.end) for m in inside if m.role == CUT or m.start in demoted or
                m.role in (OPEN, CLOSE) and m.pair in broken]
        pieces = text_pieces(text, sentence, merged([u for u in urls if sentence.start <= u.start and
                                                     u.end <= sentence.end] + cuts))
        split = {pair for pair, (a, b) in ((pair, found) for pair, found in pairs.items() if pair not in broken)
                 if not any(p.start <= a.start and b.end <= p.end for p in pieces)}
        if not split:
            break
        broken |= split
    found = []
    for piece in pieces:
        kept = [m for m in inside if piece.start <= m.start and m.end <= piece.end and m.role != CUT and
                m.start not in demoted and not (m.role in (OPEN, CLOSE) and m.pair in broken)]
        while kept and kept[0].role == OPEN and kept[0].start == piece.start and kept[-1].role == CLOSE and \
                kept[-1].pair == kept[0].pair and kept[-1].end == piece.end:
            piece, kept = stripped(text, kept[0].end, kept[-1].start), kept[1:-1]
        found.append((piece, kept))
    return found


def inside_words(text: str, pieces: list[tuple[Span, list[Mark]]], marks: list[Mark]) -> set[int]:
    """The starts of the marks of `pieces` that cannot be placed by words: an element (both its
    tags) or a WHOLE mark that begins or ends inside a word (inline_tags.inside_words)."""
    found = set()
    for piece, kept in pieces:
        if not kept:
            continue
        placed = [m for m in kept if m.role in (OPEN, WHOLE)]  # read_piece's tags, in order
        inline = read_piece(text[piece.start:piece.end],
                            [m._replace(start=m.start - piece.start, end=m.end - piece.start) for m in kept])
        for index in inline_inside_words(inline):
            mark = placed[index]
            found |= {m.start for m in marks if m.start == mark.start or mark.role == OPEN and m.pair == mark.pair and
                      m.role == CLOSE}
    return found


def add_piece(flow: Flow, piece: Span, marks: list[Mark], count_tokens: CountTokens | None,
              max_tokens: int | None) -> bool:
    """Add a piece (with its inline markup) to `flow`; whether it was cut for length. A piece with
    markup over the limit is cut at its markup first, which is then kept where it is."""
    if marks:
        raw, shifted = flow.text[piece.start:piece.end], [m._replace(start=m.start - piece.start,
                                                                      end=m.end - piece.start) for m in marks]
        if not LETTER.search(read_piece(raw, [m._replace(text="") if m.role == WHOLE else m for m in shifted]).prose):
            return False  # nothing to translate but what is kept whole (a table cell of code)
        inline = read_piece(raw, shifted)
        if count_tokens is None or max_tokens is None or count_tokens(inline.prose) <= max_tokens:
            flow.inline[len(flow.pieces)] = inline
            flow.pieces.append(piece)
            return False
        parts = text_pieces(flow.text, piece, merged([Span(m.start, m.end) for m in marks]))
    else:
        parts = [piece]
    count = len(flow.pieces)
    for part in parts:
        flow.pieces += fitting_pieces(flow.text, part.start, part.end, count_tokens, max_tokens)
    return bool(marks) or len(flow.pieces) - count > len(parts)


def plan_flow(fragments: Sequence[str], kept: Sequence[Sequence[Span | Mark]], language: str, split_sentences: bool,
              protected: re.Pattern, count_tokens: CountTokens | None,
              max_tokens: int | None) -> tuple[Flow, int]:
    """One flow's plan, and how many of its sentences were cut for length; `kept`: for each
    fragment, its markup (offsets into the fragment): spans to keep as they are, or inline_tags
    marks."""
    text, spans, position = " ".join(fragments), [], 0
    for fragment in fragments:
        spans.append(Span(position, position + len(fragment)))
        position += len(fragment) + 1
    flow, cut = Flow(text, spans), 0
    whole = stripped(text, 0, len(text))
    found_urls = [Span(*m.span()) for m in protected.finditer(text)]
    marks = flow_marks(spans, kept, found_urls)
    urls = [u for u in found_urls if not any(m.start <= u.start and u.end <= m.end for m in marks)]
    shields = merged(urls + [Span(m.start, m.end) for m in marks])
    sentences = sentence_spans(text, language, shields=shields) if split_sentences else [whole]
    for sentence in settle_marks(text, [s for s in sentences if s.start < s.end], marks):
        first, over, demoted = len(flow.pieces), False, set()
        while True:
            pieces = sentence_pieces(text, sentence, urls, marks, demoted)
            inside = inside_words(text, pieces, marks)
            if inside <= demoted:
                break
            demoted |= inside
        for piece, inline in pieces:
            over |= add_piece(flow, piece, inline, count_tokens, max_tokens)
        cut += over
        flow.sentences.append((sentence, first, len(flow.pieces)))
    return flow, cut


def plan_flows(flows: Sequence[Sequence[str]], language: str, *, split_sentences: bool = True,
               protected: re.Pattern = URL_OR_EMAIL, kept: Sequence[Sequence[Sequence[Span | Mark]]] | None = None,
               count_tokens: CountTokens | None = None, max_tokens: int | None = None,
               escape: Escape | None = None) -> TextPlan:
    """The plan for flows, each given as its fragments' texts. Without `split_sentences` a flow is
    one sentence (what is outside its pieces is still kept as it is). `kept`: for each flow, for
    each of its fragments, the spans to keep as they are besides `protected`'s matches (a
    document's markup, found by its parser; inline_tags marks keep a sentence whole around it).
    `escape`: how the format writes a translation's words (TextPlan.escape)."""
    if max_tokens is not None and max_tokens < 1:
        raise ValueError(f"max_tokens must be at least 1, not {max_tokens}")
    plan = TextPlan([], escape=escape)
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
