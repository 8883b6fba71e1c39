"""Documents translated in their own shape: plain text, SubRip subtitles (.srt) and Markdown.

Each format is read into flows of fragments (sentences.py): a fragment is the translatable part
of one line, and everything around it (line endings, a byte-order mark, subtitle numbers and
timings, Markdown's markers and indentation) stays in the output byte for byte. Only the
fragments' prose is replaced by its translation; what a format's parser calls markup inside a
fragment is kept as it is too.
- Plain text: each line is a flow of its own, as with translate_lines. URLs and e-mail addresses
  are kept as they are.
- SubRip, with the `srt` library's tolerance (its patterns of a cue number and a timestamp): a
  timing line always starts a cue, and so does a number on the line just before one, blank line
  before them or not; a blank line inside a cue does not end it. Numbers, timings and blank lines
  are copied; text before the first cue is refused, naming the line. A sentence that runs across
  cues is translated whole, as subtitle tools do: a cue's lines continue the flow of the cue
  before unless that cue ended a sentence (., !, ?, ... not an ellipsis, which in subtitles says
  the sentence goes on) or the line starts with a speaker's dash. The translation of a sentence
  that spans several lines (of one cue or of several) is cut back into them at word boundaries,
  in proportion to the sentence's non-space characters on each line, and each line gets at least
  a word while there are words. Dialogue dashes and formatting tags (<i>, {\\an8}) at a line's
  ends stay on that line; tags inside a line are kept in place.
- Markdown: CommonMark with GitHub's tables and strikethrough and YAML front matter, read by
  markdown-it-py. Only inline content (of paragraphs, headings and table cells) holds prose; every
  other line (front matter, fenced and indented code, HTML blocks, link reference definitions,
  rules, setext underlines, blank lines) and every container prefix (>, list markers,
  indentation) is copied. A paragraph is one flow whose fragments are its lines (a sentence may
  run across them, and a hard break stays on its line); a heading or a table cell is a flow of
  one fragment. Inside, each child token of markdown-it's inline stream is found in the source
  (`InlineSource`): text tokens are prose, everything else is markup kept byte for byte (code
  spans, autolinks, inline HTML, entities, escapes, emphasis and strikethrough markers, a link's
  `[` and its `](destination "title")` or `][label]`, an escaped pipe in a cell). A link or an
  image whose text is its reference label (`[label]`, `[label][]`) is kept whole: translated, it
  would no longer find its definition. Link texts and image descriptions are prose. Markup
  inside a sentence cuts it into pieces translated apart (sentences.py). It is found token by
  token (an opener, a closer, a whole), which is what a placement of inline markup by the
  model's attention needs: the sentence's prose to the translator whole, each token put back
  around the words it covered.
`document_format(path, override)` picks the format; `plan_document` gives the pieces to translate,
`DocumentPlan.assemble` the document and `DocumentPlan.sentences` each sentence's span in the
document's text with its translation; `translate_document` does both with one translate call.
"""
from __future__ import annotations

import bisect
import collections
import html
import itertools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import srt
from justhtml import Comment, Element, JustHTML, Text
from markdown_it import MarkdownIt
from markdown_it.common.utils import MD_TRIM_CHARS
from markdown_it.rules_block import StateBlock
from markdown_it.rules_block.table import escapedSplit, table
from markdown_it.rules_inline import StateInline, autolink, backtick, image, link
from markdown_it.token import Token
from mdit_py_plugins.front_matter import front_matter_plugin

from nmt.inference.inline_tags import CLOSE, CUT, OPEN, READ, WHOLE, Escape, Mark
from nmt.inference.sentences import (EMAIL, URL, URL_OR_EMAIL, Sentence, Span, TextPlan, Translate, merged,
                                     plan_flows)

FORMATS = {"text": (".txt", ".text"), "srt": (".srt",), "markdown": (".md", ".markdown"),
           "html": (".html", ".htm", ".xhtml")}

LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)?")
BOM = "\ufeff"

SRT_NUMBER = re.compile(rf"\s*{srt.RGX_INDEX}\s*")
SRT_TIMING = re.compile(rf"\s*{srt.RGX_TIMESTAMP} *-[ -] *> *{srt.RGX_TIMESTAMP}.*")
SRT_TIMING_EXAMPLE = "00:00:01,000 --> 00:00:02,500"
SRT_TAG = r"<[^<>\n]+>|\{\\[^{}\n]*\}"
# What stays at a subtitle line's ends: tags, and a speaker's dash before the text.
SRT_LINE = re.compile(rf"^((?:\s|{SRT_TAG})*(?:[-–—]\s*(?:{SRT_TAG}|\s)*)?)(.*?)((?:\s|{SRT_TAG})*)$")
SRT_SPEAKER = re.compile(r"\s*(?:<[^<>\n]+>\s*)*[-–—]")
# A cue that ends one of these ends its sentence; an ellipsis says the sentence goes on.
SRT_SENTENCE_END = re.compile(r"(?<!\.\.)[.!?。！？♪](?:[\"'”’»)\]]|\s)*$")
SRT_PROTECTED = re.compile(f"{SRT_TAG}|{URL}|{EMAIL}")

# Where a line break lies in inline content: the spaces or backslash before it (a hard break), and
# the indentation after it, which markdown-it's newline rule skips.
MARKDOWN_BREAK = re.compile(r"(?:\\| *)\n[ \t]*")


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
Kept = list[list[list[Mark]]]  # for each flow, for each fragment, its markup (offsets into the fragment)


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
        """The document with each fragment replaced by its translation (from a line's end back, as
        one line may hold several fragments: a table row's cells)."""
        out = list(self.lines)
        replacements = sorted(zip(itertools.chain(*self.places), itertools.chain(*self.text.assemble(translations))),
                              reverse=True)
        for (line, start, end), fragment in replacements:
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


def text_places(lines: list[str]) -> tuple[list[list[Place]], Kept | None]:
    """Plain text: each line its own flow."""
    return [[(index, len(BOM) if index == 0 and line.startswith(BOM) else 0, body(line))]
            for index, line in enumerate(lines)], None


# ---------------------------------------------------------------------------------------- SubRip

def srt_cues(lines: list[str]) -> list[list[int]]:
    """The text lines of each cue of a SubRip file; text before the first cue is a DocumentError."""
    contents = [line[:body(line)] for line in lines]
    if contents and contents[0].startswith(BOM):
        contents[0] = contents[0][len(BOM):]
    timing = [SRT_TIMING.fullmatch(content) is not None for content in contents] + [False]
    cues: list[list[int]] = []
    for index, content in enumerate(contents):
        if timing[index]:
            cues.append([])
        elif SRT_NUMBER.fullmatch(content) and timing[index + 1] or not content.strip():
            continue
        elif cues:
            cues[-1].append(index)
        else:
            raise DocumentError(f"not a SubRip file: {before_the_first_cue(contents, index)}")
    return cues


def before_the_first_cue(contents: list[str], index: int) -> str:
    """What is wrong with the line at `index`, a line with text before any cue."""
    if not SRT_NUMBER.fullmatch(contents[index]):
        return f"line {index + 1}: expected a cue number or a timing line, found {contents[index][:40]!r}"
    if index + 1 == len(contents):
        return "it ends with a cue number without its timing line"
    if not contents[index + 1].strip():
        return f"line {index + 2}: a cue number without its timing line"
    return f"line {index + 2}: expected a timing line ({SRT_TIMING_EXAMPLE}), found {contents[index + 1][:40]!r}"


def srt_places(lines: list[str]) -> tuple[list[list[Place]], Kept | None]:
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
    return flows, None


# -------------------------------------------------------------------------------------- Markdown

def table_with_rows(state: StateBlock, start: int, end: int, silent: bool) -> bool:
    """markdown-it's table rule, which also notes in each cell's inline token where its row's text
    starts in the source (past the containers' markers, which leave no other trace) and which
    cell of the row it is."""
    count = len(state.tokens)
    if not table(state, start, end, silent):
        return False
    cell, row = 0, None
    for token in state.tokens[count:]:
        if token.type == "inline":
            cell = cell + 1 if token.map[0] == row else 0
            row = token.map[0]
            token.meta["row"] = (state.bMarks[row] + state.tShift[row], cell)
    return True


def markdown_parser() -> MarkdownIt:
    """CommonMark, GitHub's tables and strikethrough, and front matter. Escapes and entities stay
    tokens of their own (no text_join), so that each child token can be found in the source."""
    parser = MarkdownIt("commonmark").enable(["table", "strikethrough"]).use(front_matter_plugin)
    parser.disable("text_join")
    parser.block.ruler.at("table", table_with_rows, {"alt": ["paragraph", "reference"]})
    return parser


MARKDOWN = markdown_parser()


class InlineSource:
    """Where the child tokens of one inline token lie in its content: the markup spans (kept as
    they are) and the line breaks, as offsets into the content. Text tokens are prose. The extent
    of a link, an image, an autolink and a code span is what markdown-it's own rule makes of the
    source there, run in validation mode."""

    def __init__(self, content: str, env: dict[str, Any]) -> None:
        self.content = content
        self.state = StateInline(content, MARKDOWN, env, [])
        self.markup: list[Mark] = []
        self.breaks: list[Span] = []
        self.pairs = itertools.count()  # an id for each element whose tags are placed by the words
        self.open: list[int] = []  # the ids of the emphasis and strikethrough markers open now

    def rule_end(self, rule: Callable[[StateInline, bool], bool], position: int) -> int:
        """Where the construct that `rule` finds at `position` ends."""
        self.state.pos = position
        if not rule(self.state, True):
            raise LookupError(f"no {rule.__name__} at {position}")
        return self.state.pos

    def expect(self, text: str, position: int) -> int:
        if not self.content.startswith(text, position):
            raise LookupError(f"{text!r} is not at {position}")
        return position + len(text)

    def walk(self, tokens: Sequence[Token], position: int) -> int:
        """Find `tokens` from `position` on; where they end."""
        index = 0
        while index < len(tokens):
            token = tokens[index]
            if token.type == "text":
                position = self.expect(token.content, position)
            elif token.type in ("softbreak", "hardbreak"):
                found = MARKDOWN_BREAK.match(self.content, position)
                if found is None:
                    raise LookupError(f"no line break at {position}")
                self.breaks.append(Span(*found.span()))
                position = found.end()
            elif token.type == "link_open":
                close = closing(tokens, index)
                position = self.link(token, tokens[index + 1:close], position)
                index = close
            elif token.type == "image":
                position = self.link(token, token.children or [], position)
            else:
                end = self.atom_end(token, position)
                self.markup.append(self.atom_mark(token, position, end))
                position = end
            index += 1
        return position

    def atom_mark(self, token: Token, start: int, end: int) -> Mark:
        """The mark of a token that is markup as a whole: an emphasis or strikethrough marker opens or
        closes (placed with the words), a code span is kept whole where its words go, the rest cuts."""
        if token.type.endswith("_open") and token.type != "link_open":
            self.open.append(next(self.pairs))
            return Mark(start, end, OPEN, self.open[-1])
        if token.type.endswith("_close") and self.open:
            return Mark(start, end, CLOSE, self.open.pop())
        if token.type == "code_inline":
            return Mark(start, end, WHOLE, text=token.content)
        return Mark(start, end)

    def atom_end(self, token: Token, position: int) -> int:
        """The end of a token that is markup as a whole."""
        if token.type == "code_inline":
            return self.rule_end(backtick, position)
        if token.type == "html_inline":
            return self.expect(token.content, position)
        return self.expect(token.markup, position)  # escapes, entities, emphasis and strikethrough markers

    def link(self, token: Token, inside: Sequence[Token], position: int) -> int:
        """A link or an image at `position`: its opener and its tail are markup, its text prose,
        unless the text is the label of a shortcut or collapsed reference; where it ends."""
        if token.info == "auto":
            end = self.rule_end(autolink, position)
            self.markup.append(Mark(position, end))
            return end
        is_image = token.type == "image"
        end = self.rule_end(image if is_image else link, position)
        markup, breaks = len(self.markup), len(self.breaks)
        label_end = self.walk(inside, position + (2 if is_image else 1))
        if self.content[label_end:end] in ("]", "][]"):
            del self.markup[markup:], self.breaks[breaks:]
            self.markup.append(Mark(position, end))
        else:
            pair = next(self.pairs)
            self.markup[markup:markup] = [Mark(position, position + (2 if is_image else 1), OPEN, pair)]
            self.markup.append(Mark(label_end, end, CLOSE, pair))
        return end


def closing(tokens: Sequence[Token], index: int) -> int:
    """The index of the link_close that closes the link_open at `index`."""
    depth = 0
    for position in range(index, len(tokens)):
        depth += {"link_open": 1, "link_close": -1}.get(tokens[position].type, 0)
        if depth == 0:
            return position
    raise LookupError("a link that does not close")


@dataclass
class ContentLine:
    """One line of an inline token's content and where it lies in the document: content offsets
    [start, end) of the line, `lead` characters of indentation that are not in the source as they
    are (markdown-it may expand a tab), then the source from (line, column) on; `pipes`: a table
    cell, whose escaped pipes (\\|) lost their backslash in the content."""

    start: int
    end: int
    lead: int
    line: int
    column: int
    pipes: bool = False

    def column_of(self, content: str, position: int) -> int:
        """The source column of the content offset `position` (within this line)."""
        offset = max(position - self.start - self.lead, 0)
        return self.column + offset + (content.count("|", self.start, position) if self.pipes else 0)


def paragraph_lines(token: Token, bodies: list[str]) -> list[ContentLine]:
    """An inline token's content lines (paragraph, heading), each found at the end of its source
    line: markdown-it takes a line's rest after the container's markers, and trims the whole, so
    lines of nothing but whitespace it trims (a no-break space) may be gone at either end."""
    texts = token.content.split("\n")
    for first in range(token.map[0], token.map[1] - len(texts) + 1):
        found, start = [], 0
        for line, text in enumerate(texts, start=first):
            rest = text.lstrip(" \t")
            column = bodies[line].rfind(rest)
            if column < 0:
                break
            found.append(ContentLine(start, start + len(text), len(text) - len(rest), line, column))
            start += len(text) + 1
        else:
            return found
    raise LookupError(f"{token.content[:40]!r} is not on its lines")


def cell_line(token: Token, bodies: list[str], line_starts: list[int]) -> ContentLine:
    """A table cell's content, found in its row as markdown-it's table rule cuts the row."""
    row_start, cell = token.meta["row"]
    line = token.map[0]
    row = bodies[line][row_start - line_starts[line]:]
    position = row_start - line_starts[line] + len(row) - len(row.lstrip(MD_TRIM_CHARS))
    columns = escapedSplit(row.strip(MD_TRIM_CHARS))
    if columns and columns[0] == "":
        columns.pop(0)
        position += 1
    for column in columns[:cell]:
        position += len(column) + column.count("|") + 1  # each | of a cell's text was \|
    text = columns[cell] if cell < len(columns) else ""
    position += len(text) - len(text.lstrip(MD_TRIM_CHARS))
    if text.strip(MD_TRIM_CHARS) != token.content:
        raise LookupError(f"cell {cell} is not {token.content!r}")
    return ContentLine(0, len(token.content), 0, line, position, pipes=True)


def unpaired_cut(marks: list[Mark], broken: set[int] = frozenset()) -> list[Mark]:
    """`marks` with the tags of an element that lacks one of its two (or is `broken`) made CUT."""
    count = collections.Counter(m.pair for m in marks if m.role in (OPEN, CLOSE))
    return [m._replace(role=CUT, pair=-1) if m.role in (OPEN, CLOSE) and (count[m.pair] != 2 or m.pair in broken)
            else m for m in marks]


def inline_flow(token: Token, lines: list[ContentLine], env: dict[str, Any],
                offsets: list[int]) -> tuple[list[Place], list[list[Mark]]]:
    """An inline token's fragments (one per content line, without a line's break) and the markup
    of each, as offsets into it; `offsets`: what comes before each line's text in the document
    (a byte-order mark). A mark that runs across a line's end cuts on both lines."""
    content = token.content
    found = InlineSource(content, env)
    if found.walk(token.children or [], 0) != len(content):
        raise LookupError("the tokens end before the content")
    pipes = [Mark(i, i + 1) for i, c in enumerate(content) if c == "|"] if lines[0].pipes else []
    markup = unpaired_cut(merged(found.markup + pipes))  # in order and apart: each line looks up its own
    markup_starts, markup_ends = [mark.start for mark in markup], [mark.end for mark in markup]
    line_end = {content.index("\n", b.start): b.start for b in found.breaks}  # a line's end before its break
    places, kept, broken = [], [], set()
    for part in lines:
        start = part.start + part.lead
        end = max(line_end.get(part.end, part.end), start)
        first = part.column_of(content, start)
        places.append((part.line, first + offsets[part.line], part.column_of(content, end) + offsets[part.line]))
        on_line = markup[bisect.bisect_right(markup_ends, start):bisect.bisect_left(markup_starts, end)]
        broken |= {m.pair for m in on_line if (m.start < start or m.end > end) and m.role in (OPEN, CLOSE)}
        kept.append([m._replace(start=part.column_of(content, max(m.start, start)) - first,
                                end=part.column_of(content, min(m.end, end)) - first,
                                role=m.role if start <= m.start and m.end <= end else CUT)
                     for m in on_line])
    return places, [unpaired_cut(line, broken) for line in kept]


def markdown_places(lines: list[str]) -> tuple[list[list[Place]], Kept | None]:
    """Markdown: a flow per paragraph, heading and table cell, with its markup."""
    text = "".join(lines)
    bom = len(BOM) if text.startswith(BOM) else 0
    source = text[bom:].replace("\0", "\ufffd")  # markdown-it's own replacement, one character for one
    source_lines = split_lines(source)
    bodies = [line[:body(line)] for line in source_lines]
    line_starts = list(itertools.accumulate((len(b) + 1 for b in bodies), initial=0))  # markdown-it's \n ends
    offsets = [bom] + [0] * len(bodies)
    env: dict[str, Any] = {}
    flows, kept = [], []
    for token in MARKDOWN.parse(source, env):
        if token.type != "inline" or not token.content:  # an empty heading, a cell a row lacks
            continue
        try:
            content_lines = [cell_line(token, bodies, line_starts)] if "row" in token.meta else \
                paragraph_lines(token, bodies)
            places, marks = inline_flow(token, content_lines, env, offsets)
        except LookupError as error:
            raise DocumentError(f"line {token.map[0] + 1}: cannot tell the text from the markup ({error})") from None
        flows.append(places)
        kept.append(marks)
    return flows, kept


# ------------------------------------------------------------------------------------------ HTML

# An element's role in a flow of text. INLINE: its tags are placed around the words they covered;
# WHOLE: kept as it is, and put where the words it stood for went (its text reaches the model);
# KEPT: kept as it is where it is, cutting the sentence; BREAK: its tags cut the sentence, its text
# is the sentence's; UNTOUCHED: kept as it is, and it ends the flow; anything else is a block,
# whose text is a flow of its own.
HTML_ROLES = {**dict.fromkeys("a abbr b bdi bdo big cite data del dfn em font i ins label mark q s small span strike "
                              "strong sub sup time tt u".split(), "inline"),
              **dict.fromkeys("code kbd samp var".split(), "whole"),
              **dict.fromkeys("script style svg math textarea select object iframe noscript template canvas video "
                              "audio picture map".split(), "kept"),
              **dict.fromkeys("br wbr img input embed area ruby rt rp output progress meter".split(), "break"),
              **dict.fromkeys("pre listing xmp plaintext noembed noframes".split(), "untouched")}
CHARACTER_REFERENCE = re.compile(r"&(?:#[xX][0-9a-fA-F]+;?|#[0-9]+;?|[A-Za-z][A-Za-z0-9]*;?)")
HTML_ESCAPES = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}
# What a browser reads as a comment or a tag cut off by the end, and JustHTML, when it tracks where
# nodes lie, as text (<!x>, <?php ?>, an unclosed <!--, a<b at the end): kept as it is, cutting.
BOGUS_MARKUP = re.compile(r"<!--.*|<[A-Za-z!?/][^>]*>?", re.DOTALL)


def html_text(text: str, entities: dict[str, str]) -> str:
    """A translation's words as HTML text: & < > as references, and each character the source wrote
    as a reference written as it was."""
    return "".join(entities.get(char) or HTML_ESCAPES.get(char, char) for char in text)


def html_decoded(raw: str) -> str:
    """The text an HTML parser reads from `raw`, text of an element's content."""
    return html.unescape(raw.replace("\r\n", "\n").replace("\r", "\n"))


def tag_spans(element: Element) -> tuple[Span | None, Span | None]:
    """Where the element's start and end tags lie in the source (None: implied, or made by the
    parser). JustHTML records them with track_node_locations, in these fields of its elements."""
    start, end = (element._start_tag_start, element._start_tag_end), (element._end_tag_start, element._end_tag_end)
    return (Span(*start) if None not in start else None), (Span(*end) if None not in end else None)


def html_nodes(node: Any) -> Iterator[Any]:
    """`node` and everything under it, a template's content included."""
    stack = [node]
    while stack:
        node = stack.pop()
        yield node
        stack += reversed([*(node.children or []), *([node.template_content] if getattr(node, "template_content", None)
                                                      else [])])


def element_text(element: Element) -> str:
    return "".join(node.data for node in html_nodes(element) if isinstance(node, Text))


def html_role(element: Element) -> str:
    """The element's role (HTML_ROLES); an element that says translate="no" (or class notranslate)
    is kept whole, or untouched when it is a block; foreign content (SVG, MathML) is kept."""
    if element.namespace not in (None, "html"):
        return "kept"
    role = HTML_ROLES.get(element.name, "block")
    attributes = element.attrs or {}
    if (attributes.get("translate") or "").strip().lower() == "no" or "notranslate" in (attributes.get("class") or
                                                                                      "").split():
        return "untouched" if role == "block" else "whole"
    return role


class HtmlReader:
    """An HTML document's flows of text, found in JustHTML's tree (an HTML5 parser that records where
    each node lies in the source): the text of each block (a paragraph, a heading, a list item, a
    cell, a title) with the markup inside it as marks (inline_tags.Mark), in the source's order.
    Text the parser put elsewhere than it stands (misnested tables), or that does not read as the
    parser read it, stays as it is."""

    def __init__(self, source: str) -> None:
        self.source = source
        root = JustHTML(source, sanitize=False, track_node_locations=True).root
        bounds = set()
        for node in html_nodes(root):
            bounds.add(node.origin_offset if not isinstance(node, Element) else None)
            if isinstance(node, Element):
                bounds.update(point for span in tag_spans(node) if span for point in span)
        self.bounds = sorted(point for point in bounds if point is not None) + [len(source)]
        self.flows: list[tuple[Span, list[Mark]]] = []
        self.texts: list[Span] = []
        self.marks: list[Mark] = []
        self.last = 0  # where the last item of any flow ends: items before it are the parser's moves
        self.pairs = itertools.count()
        self.walk(root)
        self.end_flow()

    def next_bound(self, position: int) -> int:
        return self.bounds[bisect.bisect_right(self.bounds, position)]

    def add(self, span: Span, mark: Mark | None = None) -> bool:
        """Add a text node's span or a mark to the flow, if it lies after what the flows hold."""
        if span.start < self.last or span.start >= span.end:
            return False
        if mark is None:
            self.texts.append(span)
            self.marks += [Mark(m.start(), m.end(), READ, text=html.unescape(m.group()))
                           for m in CHARACTER_REFERENCE.finditer(self.source, span.start, span.end)
                           if html.unescape(m.group()) != m.group()]
        else:
            self.marks.append(mark)
        self.last = span.end
        return True

    def end_flow(self) -> None:
        """The flow so far, from its first item to its last, what lies between that no mark covers
        marked as CUT."""
        if self.texts:
            # the tags before the first text and after the last are the flow's too (<p><b>Hi</b></p>)
            extent = Span(min([self.texts[0].start, *(m.start for m in self.marks)]),
                          max([self.texts[-1].end, *(m.end for m in self.marks)]))
            marks = self.marks
            covered = sorted([*self.texts, *(Span(m.start, m.end) for m in marks if m.role != READ)])
            position, gaps = extent.start, []
            for span in covered:
                if span.start > position:
                    gaps.append(Mark(position, span.start))
                position = max(position, span.end)
            self.flows.append((extent, unpaired_cut(sorted(marks + gaps))))
        self.texts, self.marks = [], []

    def text(self, span: Span) -> None:
        """A text node's span, its bogus markup (BOGUS_MARKUP) marked as cutting."""
        position = span.start
        for bogus in BOGUS_MARKUP.finditer(self.source, span.start, span.end):
            if bogus.start() > position:
                self.add(Span(position, bogus.start()))
            self.add(Span(*bogus.span()), Mark(*bogus.span()))
            position = bogus.end()
        if position < span.end:
            self.add(Span(position, span.end))

    def walk(self, node: Any) -> None:
        for child in node.children or []:
            if isinstance(child, Text):
                start = child.origin_offset
                span = Span(start, self.next_bound(start)) if start is not None else None
                if span is None or html_decoded(self.source[span.start:span.end]) != child.data:
                    self.end_flow()
                else:
                    self.text(span)
            elif isinstance(child, Comment) and child.origin_offset is not None:
                start = child.origin_offset
                self.add(Span(start, self.next_bound(start)), Mark(start, self.next_bound(start)))
            elif isinstance(child, Element):
                self.element(child)

    def element(self, element: Element) -> None:
        role, (start, end) = html_role(element), tag_spans(element)
        if role in ("block", "untouched") or role in ("whole", "kept") and not (start and end):
            self.end_flow()
            if role == "block":
                self.walk(element)
                self.end_flow()
        elif role in ("whole", "kept"):
            whole = Span(start.start, end.end)
            self.add(whole, Mark(*whole, WHOLE, text=element_text(element)) if role == "whole" else Mark(*whole))
        else:
            pair = next(self.pairs) if role == "inline" and start and end else -1
            if start:
                self.add(start, Mark(*start, OPEN if pair >= 0 else CUT, pair))
            self.walk(element)
            if end:
                self.add(end, Mark(*end, CLOSE if pair >= 0 else CUT, pair))


def html_places(lines: list[str]) -> tuple[list[list[Place]], Kept | None]:
    """HTML: a flow per block of text, one fragment each (`lines`: the whole document, one line)."""
    text = lines[0] if lines else ""
    bom = len(BOM) if text.startswith(BOM) else 0
    reader = HtmlReader(text[bom:])
    return ([[(0, bom + extent.start, bom + extent.end)] for extent, _ in reader.flows],
            [[[m._replace(start=m.start - extent.start, end=m.end - extent.start) for m in marks]]
             for extent, marks in reader.flows])


@dataclass(frozen=True)
class Reader:
    """How a format is read: its flows and markup (`places`, given the document's lines, or the
    whole document as one line unless `by_line`), what else it keeps (`protected`), and how its text
    is written (`escape`; None: as it is)."""

    places: Callable[[list[str]], tuple[list[list[Place]], Kept | None]]
    protected: re.Pattern
    escape: Escape | None = None
    by_line: bool = True


READERS = {"text": Reader(text_places, URL_OR_EMAIL), "srt": Reader(srt_places, SRT_PROTECTED),
           "markdown": Reader(markdown_places, URL_OR_EMAIL),
           "html": Reader(html_places, URL_OR_EMAIL, html_text, by_line=False)}


def plan_document(text: str, fmt: str, language: str, **options) -> DocumentPlan:
    """The pieces of a document to translate and how to put it back together; `options` are
    sentences.plan_flows' (split_sentences, count_tokens, max_tokens)."""
    if fmt not in READERS:
        raise DocumentError(f"unknown document format {fmt!r} (known: {', '.join(FORMATS)})")
    reader = READERS[fmt]
    lines = split_lines(text) if reader.by_line else [text]
    places, kept = reader.places(lines)
    plan = plan_flows([[lines[line][start:end] for line, start, end in flow] for flow in places], language,
                      protected=reader.protected, kept=kept, escape=reader.escape, **options)
    return DocumentPlan(lines, places, plan)


def translate_document(text: str, fmt: str, translate: Translate, language: str, **options) -> str:
    """The document translated, in its own shape, with one call of `translate`."""
    plan = plan_document(text, fmt, language, **options)
    return plan.assemble(translate(plan.sources) if plan.sources else [])
