"""documents.py, property-based (Hypothesis): any document of each format (plain text, SubRip,
Markdown, HTML), with any line endings, a byte-order mark or none, comes back byte for byte through
a translator that changes nothing; a SubRip file's numbers and timing lines never reach the
translator; an HTML document whose every word is changed parses to the same tag tree, with the same
attributes, comments and kept text."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from nmt.inference.documents import plan_document, translate_document
from test_commonmark import every_word_changed
from test_documents import html_structure

# A few seconds per test; the same examples on every run (CI stays reproducible), and no example
# database written into the work tree.
QUICK = settings(max_examples=150, deadline=None, database=None, derandomize=True)

ENDINGS = st.sampled_from(["\n", "\r\n", "\r"])
BOM = st.sampled_from(["", "\ufeff"])


def unchanged(pieces: list[str]) -> list[str]:
    return list(pieces)


def round_trips(text: str, fmt: str) -> bool:
    return translate_document(text, fmt, unchanged, "en") == text


@QUICK
@given(st.text())
def test_any_plain_text_round_trips(text: str) -> None:
    assert round_trips(text, "text")


# Markdown's syntax, so that generated documents are rich in it; with any other text between.
MARKDOWN_PARTS = ["a", "Word", "é", " ", "  ", "\t", "\xa0", "\n", "\r\n", "\n\n", "*", "**", "_", "~~", "`",
                  "```", "~~~", "[", "]", "(", ")", "<", ">", "!", "#", "# ", "-", "- ", "+ ", "1. ", "2) ",
                  "---", "===", "|", "\\", "&amp;", "&#35;", ":", "/", "http://x.org", "a@b.co", '"', "'",
                  "    ", "<b>", "</b>", "<!--", "-->", "[x]: /u", "[x]", "\0", ". ", "? ", "\\|"]


@QUICK
@given(BOM, st.lists(st.one_of(st.sampled_from(MARKDOWN_PARTS), st.text(max_size=3)), max_size=60).map("".join))
def test_any_markdown_round_trips(bom: str, text: str) -> None:
    assert round_trips(bom + text, "markdown")


TIMESTAMP = st.tuples(st.integers(0, 99), st.integers(0, 59), st.integers(0, 59), st.integers(0, 999),
                      st.sampled_from([",", "."])).map(lambda t: f"{t[0]:02d}:{t[1]:02d}:{t[2]:02d}{t[4]}{t[3]:03d}")
TIMING = st.tuples(TIMESTAMP, TIMESTAMP, st.sampled_from(["", " X1:10 X2:20"])).map(
    lambda t: f"{t[0]} --> {t[1]}{t[2]}")
# what a UTF-8 file can hold (no lone surrogates), on one line
TEXT_LINE = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\r\n"), min_size=1,
                    max_size=30).filter(
    lambda line: line.strip() and "-->" not in line)
CUE = st.tuples(st.one_of(st.none(), st.integers(1, 999)), TIMING, st.lists(TEXT_LINE, max_size=3),
                st.integers(0, 2))


@QUICK
@given(BOM, ENDINGS, st.lists(CUE, max_size=6))
def test_any_subrip_file_round_trips_and_its_numbers_and_timings_stay_out_of_the_pieces(
        bom: str, ending: str, cues: list[tuple[int | None, str, list[str], int]]) -> None:
    lines = []
    for number, timing, text, blank_lines in cues:
        lines += ([str(number)] if number is not None else []) + [timing] + text + [""] * blank_lines
    document = bom + "".join(line + ending for line in lines)
    assert round_trips(document, "srt")
    pieces = plan_document(document, "srt", "en").sources
    assert not any("-->" in piece for piece in pieces)


# HTML's syntax, tag soup included (misnested, unclosed, ignored tags), with any other text between.
HTML_PARTS = ["a", "Word", "é", " ", "\n", "\r\n", ". ", "? ", "<p>", "</p>", "<div>", "</div>", "<b>", "</b>",
              "<i>", "</i>", '<a href="x.html?a=1&amp;b">', "</a>", "<span class='c d'>", "</span>", "<code>",
              "</code>", "<pre>", "</pre>", "<br>", "<img alt=\"A cat\">", "<ul>", "<li>", "<table>", "<tr>", "<td>",
              "</td>", "</table>", "<script>", "</script>", "<style>", "</style>", "<textarea>", "<title>",
              "</title>", "<!-- c -->", "<!--", "-->", "&amp;", "&nbsp;", "&copy", "&#65;", "&bogus;", "<", ">",
              "&", "\0", '<em translate="no">', "</em>", "<!DOCTYPE html>", "<html>", "<body>", "http://x.org/a"]
HTML_DOCUMENT = st.lists(st.one_of(st.sampled_from(HTML_PARTS), st.text(max_size=3)), max_size=50).map("".join)


@QUICK
@given(BOM, HTML_DOCUMENT)
def test_any_html_round_trips(bom: str, text: str) -> None:
    assert round_trips(bom + text, "html")


@QUICK
@given(HTML_DOCUMENT)
def test_any_html_keeps_its_tag_tree_when_every_word_changes(text: str) -> None:
    assert html_structure(translate_document(text, "html", every_word_changed, "en")) == html_structure(text)
