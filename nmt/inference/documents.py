"""Documents translated in their own shape: plain text, SubRip subtitles (.srt) and Markdown.

Each format is read into flows of fragments (sentences.py): a fragment is the translatable part
of one line, and everything around it (line endings, a byte-order mark, subtitle numbers and
timings, Markdown's markers and indentation) stays in the output byte for byte. Only the
fragments are replaced by their translations.
- Plain text: each line is a flow of its own, as with translate_lines. URLs and e-mail addresses
  are kept as they are.
- SubRip: cue numbers, timing lines and blank lines are copied. A sentence that runs across cues
  is translated whole, as subtitle tools do: a cue's lines continue the flow of the cue before
  unless that cue ended a sentence (., !, ?, ... not an ellipsis, which in subtitles says the
  sentence goes on) or the line starts with a speaker's dash. The translation of a sentence that
  spans several lines (of one cue or of several) is cut back into them at word boundaries, in
  proportion to the sentence's non-space characters on each line, and each line gets at least a
  word while there are words. Dialogue dashes and formatting tags (<i>, {\\an8}) at a line's ends
  stay on that line; tags inside a line are kept in place.
- Markdown (CommonMark with GitHub's tables, parsed by markdown-it-py): only the text of
  paragraphs, headings and table cells is translated; every other line (fenced and indented code,
  HTML blocks, link reference definitions, rules, setext underlines, blank lines) is copied. A
  paragraph is one flow, so its sentences may run across its lines; each line keeps its container
  prefix (>, list markers, indentation) and its hard break. Inside the text, inline code, URLs,
  e-mail addresses, autolinks, HTML tags, entities, escapes, emphasis markers, link and image
  targets and table pipes are kept; link texts and image descriptions are translated.
`document_format(path, override)` picks the format; `plan_document` gives the pieces to translate,
`DocumentPlan.assemble` the document and `DocumentPlan.sentences` each sentence's span in the
document's text with its translation; `translate_document` does both with one translate call.
"""
from __future__ import annotations

import bisect
import itertools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from markdown_it import MarkdownIt

from nmt.inference.sentences import EMAIL, URL, URL_OR_EMAIL, Sentence, Span, TextPlan, Translate, plan_flows

FORMATS = {"text": (".txt", ".text"), "srt": (".srt",), "markdown": (".md", ".markdown")}

LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)?")
BOM = "\ufeff"

SRT_NUMBER = re.compile(r"\s*\d+\s*")
SRT_TIMING = re.compile(r"\s*\d+:\d{1,2}:\d{1,2}[,.]\d{1,3}\s*-->\s*\d+:\d{1,2}:\d{1,2}[,.]\d{1,3}(?:\s.*)?")
SRT_TAG = r"<[^<>\n]+>|\{\\[^{}\n]*\}"
# What stays at a subtitle line's ends: tags, and a speaker's dash before the text.
SRT_LINE = re.compile(rf"^((?:\s|{SRT_TAG})*(?:[-–—]\s*(?:{SRT_TAG}|\s)*)?)(.*?)((?:\s|{SRT_TAG})*)$")
SRT_SPEAKER = re.compile(r"\s*(?:<[^<>\n]+>\s*)*[-–—]")
# A cue that ends one of these ends its sentence; an ellipsis says the sentence goes on.
SRT_SENTENCE_END = re.compile(r"(?<!\.\.)[.!?。！？♪](?:[\"'”’»)\]]|\s)*$")
SRT_PROTECTED = re.compile(f"{SRT_TAG}|{URL}|{EMAIL}")

MARKDOWN_PROTECTED = re.compile("|".join([
    r"(?<!`)(?P<tick>`+)(?!`).*?(?<!`)(?P=tick)(?!`)",  # inline code: a whole run of backticks opens
    r"<[A-Za-z][A-Za-z0-9+.-]*:[^\s<>]*>|<[^\s<>@]+@[^\s<>@]+>",  # autolinks
    r"<!--.{0,2000}?-->|</?[A-Za-z][A-Za-z0-9-]*(?:\s[^<>]*)?/?>",  # HTML (a comment's length bounded)
    r"\[\^[^\]\s]+\]|!?\[",  # footnote references, link and image openers
    r"\]\((?:[^()\s]|\([^()\s]*\))*(?:\s+(?:\"[^\"]*\"|'[^']*'|\([^()]*\)))?\s*\)|\](?:\[[^\]]*\])?",  # targets
    r"\\[!-/:-@\[-`{-~]|&(?:#\d+|#[xX][0-9a-fA-F]+|[A-Za-z][A-Za-z0-9]*);",  # escapes, entities
    r"\*+|~~+|(?<![^\W_])_+|_+(?![^\W_])|(?<!\\)\|",  # emphasis, table pipes
    URL, EMAIL]))


class DocumentError(ValueError):
    """A document that cannot be read as its format, or a format that does not exist; one line."""


def document_format(path: str | Path, override: str = "") -> str:
    """The format of the file at `path`: `override` when given, else from the file's extension."""
    if override:
        if override not in FORMATS:
            raise DocumentError(f"unknown document format {override!r} (known: {', '.join(FORMATS)})")
        return override
    suffix = Path(path).suffix.lower()
    for name, suffixes in FORMATS.items():
        if suffix in suffixes:
            return name
    known = ", ".join(s for suffixes in FORMATS.values() for s in suffixes)
    raise DocumentError(f"cannot tell the format of {path} from its name ({known}): name it so, or give --format")


Place = tuple[int, int, int]  # a fragment's line, and its start and end within that line


@dataclass
class DocumentPlan:
    """A document's lines (with their endings), where its flows' fragments lie, and their plan."""

    lines: list[str]
    places: list[list[Place]]
    text: TextPlan

    @property
    def sources(self) -> list[str]:
        return self.text.sources

    def assemble(self, translations: Sequence[str]) -> str:
        """The document with each fragment replaced by its translation."""
        out = list(self.lines)
        for places, fragments in zip(self.places, self.text.assemble(translations)):
            for (line, start, end), fragment in zip(places, fragments):
                out[line] = out[line][:start] + fragment + out[line][end:]
        return "".join(out)

    def sentences(self, translations: Sequence[str]) -> list[Sentence]:
        """Each sentence (TextPlan.sentences) with its span as offsets into the document's text."""
        line_starts = list(itertools.accumulate(map(len, self.lines), initial=0))

        def offset(flow: int, position: int) -> int:
            fragments = self.text.flows[flow].fragments
            index = bisect.bisect_right([fragment.start for fragment in fragments], position) - 1
            line, start, _ = self.places[flow][index]
            return line_starts[line] + start + position - fragments[index].start

        return [Sentence(s.flow, Span(offset(s.flow, s.span.start), offset(s.flow, s.span.end)), s.translation)
                for s in self.text.sentences(translations)]


def split_lines(text: str) -> list[str]:
    """The lines of `text`, each with its own ending (\\n, \\r\\n or \\r); only those three end a line."""
    return [line for line in LINE.findall(text) if line]


def body(line: str) -> int:
    """Where `line`'s ending starts."""
    return len(line.rstrip("\r\n"))


def text_places(lines: list[str]) -> list[list[Place]]:
    """Plain text: each line its own flow."""
    return [[(index, len(BOM) if index == 0 and line.startswith(BOM) else 0, body(line))]
            for index, line in enumerate(lines)]


def srt_cues(lines: list[str]) -> list[list[int]]:
    """The text lines of each cue of a SubRip file; a line that is out of place is a DocumentError."""
    cues: list[list[int]] = []
    state = "between"
    for index, line in enumerate(lines):
        content = line[:body(line)].lstrip(BOM) if index == 0 else line[:body(line)]
        if state == "text" and content.strip():
            cues[-1].append(index)
        elif not content.strip():
            state = "between" if state == "text" else state
            if state == "number":
                raise DocumentError(f"not a SubRip file: line {index + 1}: a cue number without its timing line")
        elif state == "between" and SRT_NUMBER.fullmatch(content):
            state = "number"
        elif state in ("between", "number") and SRT_TIMING.fullmatch(content):
            state = "text"
            cues.append([])
        else:
            expected = "a timing line (00:00:01,000 --> 00:00:02,500)" if state == "number" else "a cue number"
            raise DocumentError(f"not a SubRip file: line {index + 1}: expected {expected}, found {content[:40]!r}")
    if state == "number":
        raise DocumentError("not a SubRip file: it ends with a cue number without its timing line")
    return cues


def srt_places(lines: list[str]) -> list[list[Place]]:
    """SubRip: flows that continue across cues until a sentence ends or a speaker's dash starts a line."""
    flows: list[list[Place]] = []
    ended = True
    for cue in srt_cues(lines):
        for index in cue:
            line = lines[index][:body(lines[index])]
            if ended or SRT_SPEAKER.match(line):
                flows.append([])
            match = SRT_LINE.match(line)
            flows[-1].append((index, match.start(2), match.end(2)))
            ended = False  # the cue's next line goes on with this one
        ended = not cue or bool(SRT_SENTENCE_END.search(re.sub(SRT_TAG, "", lines[cue[-1]][:body(lines[cue[-1]])])))
    return flows


def markdown_line(line: str, content: str) -> Span | None:
    """Where a line of a block's inline content lies in its source line (after the container's
    markers, before a closing heading sequence and a hard break), or None if it cannot be found."""
    content = content.strip()
    if content.endswith("\\"):  # a hard break stays with the line
        content = content[:-1].rstrip()
    start = line.rfind(content) if content else -1
    return None if start < 0 else Span(start, start + len(content))


def markdown_places(lines: list[str]) -> list[list[Place]]:
    """Markdown: a flow per paragraph and heading, and per table row (one line, pipes kept)."""
    parser = MarkdownIt("commonmark").enable("table").enable("strikethrough")
    flows, table_rows = [], set()
    for token in parser.parse("".join(lines).lstrip(BOM)):
        if token.type == "tr_open" and token.map:
            table_rows.add(token.map[0])
        elif token.type == "inline" and token.map and token.map[0] not in table_rows:
            places = []
            for index, content in zip(range(*token.map), token.content.split("\n")):
                span = markdown_line(lines[index][:body(lines[index])], content)
                if span is not None:
                    places.append((index, span.start, span.end))
            flows.append(places)
    flows += [[(row, 0, body(lines[row]))] for row in sorted(table_rows)]
    return flows


PLACES = {"text": (text_places, URL_OR_EMAIL), "srt": (srt_places, SRT_PROTECTED),
          "markdown": (markdown_places, MARKDOWN_PROTECTED)}


def plan_document(text: str, fmt: str, language: str, **options) -> DocumentPlan:
    """The pieces of a document to translate and how to put it back together; `options` are
    sentences.plan_flows' (split_sentences, count_tokens, max_tokens)."""
    if fmt not in PLACES:
        raise DocumentError(f"unknown document format {fmt!r} (known: {', '.join(FORMATS)})")
    places_of, protected = PLACES[fmt]
    lines = split_lines(text)
    places = places_of(lines)
    plan = plan_flows([[lines[line][start:end] for line, start, end in flow] for flow in places], language,
                      protected=protected, **options)
    return DocumentPlan(lines, places, plan)


def translate_document(text: str, fmt: str, translate: Translate, language: str, **options) -> str:
    """The document translated, in its own shape, with one call of `translate`."""
    plan = plan_document(text, fmt, language, **options)
    return plan.assemble(translate(plan.sources) if plan.sources else [])
