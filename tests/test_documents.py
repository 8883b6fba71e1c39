"""documents.py with fake translators: the format from the name or the override, plain text with its
line endings, SubRip numbers and timings unchanged (cues with and without blank lines and numbers)
and sentences across cues, Markdown's structure, code, URLs, link targets, references, front matter
and table pipes untouched; a byte-order mark and CRLF kept in every format; each sentence's span in
the document's text; HTML's blocks translated and its markup, comments, script, style, code and
pre as they were, in the same tag tree. The CommonMark examples: test_commonmark.py; any document:
test_document_properties.py; inline tags placed by attention: test_inline_tags.py."""
from __future__ import annotations

from typing import Any

import pytest
from justhtml import Comment, Element, JustHTML

from nmt.inference.documents import DocumentError, document_format, element_text, plan_document, translate_document


def bracketed(pieces: list[str]) -> list[str]:
    return [f"[{piece}]" for piece in pieces]


def upper(pieces: list[str]) -> list[str]:
    return [piece.upper() for piece in pieces]


def test_the_format_comes_from_the_name_and_the_override_wins() -> None:
    assert [document_format(name) for name in ("a.txt", "b.SRT", "c.md", "d.markdown", "e.html", "f.HTM")] == [
        "text", "srt", "markdown", "markdown", "html", "html"]
    assert document_format("notes.md", "text") == "text"
    with pytest.raises(DocumentError, match="unknown document format 'docx'"):
        document_format("a.txt", "docx")
    with pytest.raises(DocumentError, match="cannot tell the format of report.pdf"):
        document_format("report.pdf")
    with pytest.raises(DocumentError, match="unknown document format"):
        plan_document("x", "pdf", "en")


def test_plain_text_keeps_line_endings_blank_lines_and_the_byte_order_mark() -> None:
    text = "\ufeffHello there.  Bye.\r\n\r\n   \n\tSee https://x.org now.\n"
    assert translate_document(text, "text", bracketed, "en") == (
        "\ufeff[Hello there.]  [Bye.]\r\n\r\n   \n\t[See] https://x.org [now.]\n")
    assert translate_document("", "text", bracketed, "en") == ""


SRT = """1
00:00:01,000 --> 00:00:03,000
<i>Hello there.</i> The meeting

2
00:00:03,500 --> 00:00:05,000
starts at noon today.
- Who says?

3
00:00:06,000 --> 00:00:08,000 X1:10 X2:20
- I do. See www.example.com
- Thanks...

4
00:00:08,000 --> 00:00:09,000
...for nothing.
"""


def test_srt_numbers_and_timings_are_unchanged_and_only_text_is_translated() -> None:
    out = translate_document(SRT, "srt", bracketed, "en")
    source_lines, out_lines = SRT.split("\n"), out.split("\n")
    assert len(out_lines) == len(source_lines)
    for before, after in zip(source_lines, out_lines):
        if not before or before[0].isdigit():
            assert after == before  # numbers, timings (with their coordinates), blank lines
    assert out_lines[7] == "- [Who says?]"
    assert out_lines[11] == "- [I do.] [See] www.example.com"
    assert out_lines[2].startswith("<i>[Hello there.]</i> ")


def test_srt_sentence_across_cues_is_translated_whole_and_distributed_over_the_cues() -> None:
    plan = plan_document(SRT, "srt", "en")
    assert "The meeting starts at noon today." in plan.sources
    out = plan.assemble(upper(plan.sources)).split("\n")
    assert out[2] == "<i>HELLO THERE.</i> THE MEETING" and out[6] == "starts at noon today.".upper()
    # Cut in proportion to the non-space characters on each line: "The meeting" : "starts at noon today."
    # is 10 : 18, and "uno due tre" : "quattro cinque" 9 : 13 is the nearest cut to that.
    out = translate_document(SRT, "srt", lambda p: ["uno due tre quattro cinque" if "meeting" in x else x for x in p],
                             "en").split("\n")
    assert (out[2], out[6]) == ("<i>Hello there.</i> uno due tre", "quattro cinque")


def test_srt_a_speakers_dash_starts_a_sentence() -> None:
    plan = plan_document("1\n00:00:01,000 --> 00:00:02,000\n- Where are you going\n- Home\n", "srt", "en")
    assert plan.sources == ["Where are you going", "Home"]


@pytest.mark.parametrize("text, message", [
    ("1\nHello\n", "line 2: expected a timing line"),
    ("Hello\n", "line 1: expected a cue number"),
    ("1\n\n", "line 2: a cue number without its timing line"),
    ("1\n", "ends with a cue number"),
])
def test_a_file_that_is_not_srt_is_one_clear_error(text: str, message: str) -> None:
    with pytest.raises(DocumentError, match=message):
        plan_document(text, "srt", "en")


MARKDOWN = """# Title with `code` #

Intro paragraph that runs
across two lines. Read [the guide](http://x.org/a_b "T") now.

> Quoted text here.
> - List item in a quote
>   with more text.

1. First item, see <https://auto.link> or mail jo@x.org.

       indented code in a list

```python
print("Hello. There")
```

    indented code block

| Name | Description |
|------|:-----------:|
| foo  | A **bold** thing. |

<div>
Raw html block.
</div>

[ref]: http://example.com "Title"

Setext heading
==============

* * *
Text with ![a cat](img/cat.png) and <span class="x">inline html</span>, &amp; *emphasis*.
Hard break  
here.
"""

EXPECTED = """# [Title with `code`] #

[Intro paragraph that runs
across two lines.] [Read [the guide](http://x.org/a_b "T") now.]

> [Quoted text here.]
> - [List item in a quote
>   with more text.]

1. [First item, see] <https://auto.link> [or mail] jo@x.org.

       indented code in a list

```python
print("Hello. There")
```

    indented code block

| [Name] | [Description] |
|------|:-----------:|
| [foo]  | [A **bold** thing.] |

<div>
Raw html block.
</div>

[ref]: http://example.com "Title"

[Setext heading]
==============

* * *
[Text with ![a cat](img/cat.png) and] <span class="x">[inline html]</span>, &amp; [*emphasis*.]
[Hard break  
here.]
"""


def test_markdown_keeps_its_structure_code_urls_and_targets_and_translates_the_text() -> None:
    assert translate_document(MARKDOWN, "markdown", bracketed, "en") == EXPECTED


@pytest.mark.parametrize("fmt, text", [("markdown", MARKDOWN), ("srt", SRT)])
def test_an_unchanged_translation_gives_the_document_back_byte_for_byte(fmt: str, text: str) -> None:
    assert translate_document(text, fmt, lambda pieces: pieces, "en") == text


def test_a_markdown_paragraph_is_one_flow_and_keeps_its_line_prefixes() -> None:
    plan = plan_document("> The meeting starts\n> at noon. Bye.\n", "markdown", "en")
    assert plan.sources == ["The meeting starts at noon.", "Bye."]
    assert plan.assemble(upper(plan.sources)) == "> THE MEETING STARTS\n> AT NOON. BYE.\n"


def test_a_markdown_hard_break_stays_on_its_line_whatever_the_translation_does() -> None:
    def lose_backslashes(pieces: list[str]) -> list[str]:
        return [piece.replace("\\", "").upper() for piece in pieces]

    text = "Hard break  \nhere\\\nand there.\n"
    assert translate_document(text, "markdown", lose_backslashes, "en") == "HARD BREAK  \nHERE\\\nAND THERE.\n"


@pytest.mark.parametrize("fmt, text, sentences, translations", [
    ("text", "\ufeffHello there.  Bye.\r\n\r\n\tSee https://x.org now.\n",
     ["Hello there.", "Bye.", "See https://x.org now."], ["HELLO THERE.", "BYE.", "SEE https://x.org NOW."]),
    ("markdown", "# Title\n\n> The meeting starts\n> at noon. Bye.\n", ["Title", "The meeting starts\n> at noon.", "Bye."],
     ["TITLE", "THE MEETING STARTS AT NOON.", "BYE."])])
def test_sentence_spans_index_the_documents_text(fmt: str, text: str, sentences: list[str],
                                                 translations: list[str]) -> None:
    """Past a byte-order mark, CRLF endings, blank lines and a paragraph's line prefixes; a sentence
    across lines spans the prefix between them."""
    plan = plan_document(text, fmt, "en")
    found = plan.sentences(upper(plan.sources))
    assert [text[s.span.start:s.span.end] for s in found] == sentences
    assert [s.translation for s in found] == translations


# ---------------------------------------------------------------------------------------- SubRip

NO_BLANK_LINE = ("1\n00:00:01,000 --> 00:00:02,000\nHello.\n"
                 "2\n00:00:03,000 --> 00:00:04,000\nGood morning, my friend.\n\n"
                 "3\n00:00:05,000 --> 00:00:06,000\nBye.\n")


def test_srt_a_cue_right_after_the_text_of_the_one_before_keeps_its_number_and_timing() -> None:
    """The issue's nob.srt: cue 2 follows cue 1's text with no blank line between."""
    plan = plan_document(NO_BLANK_LINE, "srt", "en")
    assert plan.sources == ["Hello.", "Good morning, my friend.", "Bye."]
    assert plan.assemble(upper(plan.sources)) == NO_BLANK_LINE.replace("Hello.", "HELLO.").replace(
        "Good morning, my friend.", "GOOD MORNING, MY FRIEND.").replace("Bye.", "BYE.")


def test_srt_a_timing_line_starts_a_cue_without_a_number_and_a_blank_line_does_not_end_one() -> None:
    """As the srt library reads cues (a blank line inside a cue's text is text's), and a timing line
    with neither a number nor a blank line before it is a cue of its own, not text."""
    text = ("00:00:01,000 --> 00:00:02,000\nHello\n\nthere.\n00:00:03.000 --> 00:00:04.000 X1:1\nCount 42.\n\n"
            "  7  \n00:00:05,000 --> 00:00:06,000\nBye.\n")
    plan = plan_document(text, "srt", "en")
    assert plan.sources == ["Hello there.", "Count 42.", "Bye."]
    assert plan.assemble(upper(plan.sources)) == text.replace("Hello", "HELLO").replace("there.", "THERE.").replace(
        "Count", "COUNT").replace("Bye.", "BYE.")


def test_srt_text_before_the_first_cue_is_refused_naming_its_line() -> None:
    with pytest.raises(DocumentError, match=r"^not a SubRip file: line 2: expected a cue number or a timing line, "
                                            r"found 'Hello'$"):
        plan_document("\nHello\n1\n00:00:01,000 --> 00:00:02,000\nBye.\n", "srt", "en")


# -------------------------------------------------------------------------------------- Markdown

@pytest.mark.parametrize("text, expected", [
    ("Read [the manual](<docs/user guide.pdf>) first.\n", "[Read [the manual](<docs/user guide.pdf>) first.]\n"),
    ('See [the site](\n  http://x.org/a_b  "The (Title)"\n) and ![a cat](cat.png \'A cat\') now.\n',
     '[See] [[the site]](\n  http://x.org/a_b  "The (Title)"\n) [and ![a cat](cat.png \'A cat\') now.]\n'),
    ("Mail <jo@x.org> or see <https://x.org/a_b> and <x:y z> now.\n",
     "[Mail] <jo@x.org> [or see] <https://x.org/a_b> [and <x:y z> now.]\n"),
    ("[Full text][Doc], [Doc][] and [Doc] go there.\n\n[doc]: <a b> (Title)\n",
     "[[Full text][Doc],] [Doc][] [and] [Doc] [go there.]\n\n[doc]: <a b> (Title)\n"),
    ("Use `a\nb` and <span\nclass=\"x\">here</span> &copy; \\*.\n",
     "[Use] `a\nb` [and] <span\nclass=\"x\">[here]</span> &copy; \\*.\n"),
])
def test_markdown_links_autolinks_references_code_and_html_are_kept(text: str, expected: str) -> None:
    """Link destinations (<with spaces> too) and titles, autolinks, a reference's label (a link whose
    text is its label keeps it: translated, it would not find its definition), code spans over two
    lines, inline HTML, entities and escapes as they were; link texts and image descriptions translated.
    `<x:y z>` is no autolink (a one-letter scheme, a space), so it is text."""
    assert translate_document(text, "markdown", bracketed, "en") == expected


def test_markdown_front_matter_html_blocks_and_code_blocks_are_copied() -> None:
    text = ("---\ntitle: A title\ntags: [one, two]\n---\n\nThe text.\n\n<div>\nRaw html.\n</div>\n\n"
            "~~~\nA fence.\n~~~\n\n    Indented code.\n")
    assert translate_document(text, "markdown", bracketed, "en") == text.replace("The text.", "[The text.]")
    # without its closing line, a rule and a paragraph: no front matter
    assert translate_document("---\ntitle: A title\n", "markdown", bracketed, "en") == "---\n[title: A title]\n"


def test_markdown_table_cells_are_flows_of_their_own_and_escaped_pipes_are_kept() -> None:
    """In a block quote; a cell past the header's count is no part of the table, and stays as it is."""
    text = "> | A \\| B | Name |\n> |------|:-----:|\n> | sleeps \\| eats | The cat | extra |\n"
    plan = plan_document(text, "markdown", "en")
    assert plan.sources == ["A", "B", "Name", "sleeps", "eats", "The cat"]
    assert plan.assemble(bracketed(plan.sources)) == (
        "> | [A] \\| [B] | [Name] |\n> |------|:-----:|\n> | [sleeps] \\| [eats] | [The cat] | extra |\n")
    text = "| Code | Name |\n|---|---|\n| Run `a \\| b` now | `x` |\n"  # a pipe inside code: still code
    assert translate_document(text, "markdown", bracketed, "en") == (
        "| [Code] | [Name] |\n|---|---|\n| [Run] `a \\| b` [now] | `x` |\n")


@pytest.mark.parametrize("fmt, text, expected", [
    ("text", "\ufeffHello there.\r\nBye.\r\n", "\ufeff[Hello there.]\r\n[Bye.]\r\n"),
    ("srt", "\ufeff1\r\n00:00:01,000 --> 00:00:02,000\r\nHello.\r\n",
     "\ufeff1\r\n00:00:01,000 --> 00:00:02,000\r\n[Hello.]\r\n"),
    ("markdown", "\ufeff# Title\r\n\r\nSome *text*.\r\n", "\ufeff# [Title]\r\n\r\n[Some *text*.]\r\n"),
    ("html", "\ufeff<p>Some\r\n<b>text</b>.</p>\r\n", "\ufeff<p>[Some <b>text</b>.]</p>\r\n"),
])
def test_every_format_keeps_a_byte_order_mark_and_crlf_endings(fmt: str, text: str, expected: str) -> None:
    """As Windows editors save a file: the mark comes back first, each line with its ending, and the
    mark is no part of the first line's text (a Markdown heading is still one)."""
    assert translate_document(text, fmt, bracketed, "en") == expected


@pytest.mark.parametrize("fmt", ["text", "markdown"])
def test_a_piece_given_back_unchanged_keeps_its_own_whitespace(fmt: str) -> None:
    """The translator gets each run of whitespace in a piece as one space; what it leaves as it got it
    comes back with the spaces, tabs and no-break spaces it had."""
    text = "Multiple     spaces,\ta tab and\xa0a no-break space.\n"
    plan = plan_document(text, fmt, "en")
    assert plan.sources == ["Multiple spaces, a tab and a no-break space."]
    assert plan.assemble(plan.sources) == text
    assert plan.assemble(upper(plan.sources)) == "MULTIPLE SPACES, A TAB AND A NO-BREAK SPACE.\n"


def test_markdown_whitespace_markdown_it_trims_or_a_line_starts_with_stays() -> None:
    """A paragraph's first line of no-break spaces (trimmed from its content by markdown-it), and a
    no-break space that starts a line: kept, so the line after it is no heading."""
    text = "\xa0\nSome text\n\xa0# more text.\n"
    plan = plan_document(text, "markdown", "en")
    assert plan.sources == ["Some text # more text."]
    assert plan.assemble(upper(plan.sources)) == "\xa0\nSOME TEXT\n\xa0# MORE TEXT.\n"



# ------------------------------------------------------------------------------------------ HTML

PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>Tom &amp; Jerry</title>
<style>p::after { content: "<b>"; }</style>
<script>if (a < b && c) document.write("<p>Hi.</p>");</script></head>
<body class="main">
<!-- Navigation. Do not translate. -->
<h1 id="top">Welcome <em>home</em>!</h1>
<p>Click <a href="/next?a=1&amp;b=2" title="Next page">here</a> to go on. Then run
<code>ls -l &gt; out</code> &copy; twice.</p>
<pre>  Keep   this.
  <b>Bold</b> too.</pre>
<ul><li>First item<li>Second <span translate="no">Acme Corp</span> item</ul>
<p translate="no">Not this one.</p>
<textarea>Typed text.</textarea>
</body></html>
"""
PAGE_UPPER = PAGE.replace("Tom &amp; Jerry", "TOM &amp; JERRY").replace("Welcome <em>home</em>!", "WELCOME <em>HOME</em>!") \
    .replace(">here</a> to go on. Then run\n<code>", ">HERE</a> TO GO ON. THEN RUN <code>") \
    .replace("&copy; twice.", "&copy; TWICE.").replace("First item", "FIRST ITEM") \
    .replace("Second <span", "SECOND <span").replace("</span> item", "</span> ITEM").replace("Click <a", "CLICK <a")
KEPT_TEXT = {"script", "style", "pre", "code", "textarea"}


def html_structure(text: str) -> list[tuple]:
    """The tag tree of an HTML document as JustHTML parses it: each element's depth, name and
    attributes, each comment, and the text of what must stay as it is (script, style, pre, code,
    textarea, what says translate="no")."""
    found: list[tuple] = []

    def walk(node: Any, depth: int) -> None:
        for child in node.children or []:
            if isinstance(child, Element):
                found.append((depth, child.name, sorted((child.attrs or {}).items())))
                if child.name in KEPT_TEXT or (child.attrs or {}).get("translate") == "no":
                    found.append(("kept", element_text(child)))
                walk(child, depth + 1)
            elif isinstance(child, Comment):
                found.append(("comment", child.data))

    walk(JustHTML(text, sanitize=False).root, 0)
    return found


def test_html_is_read_with_its_blocks_as_flows_and_its_markup_kept() -> None:
    """The title, the heading, the paragraph's two sentences (a link inside one, code and a
    reference inside the other), the list items (one with a translate="no" name inside); nothing of
    the head's style and script, the comment, the pre, the textarea or the translate="no" paragraph."""
    plan = plan_document(PAGE, "html", "en")
    assert plan.sources == ["Tom & Jerry", "Welcome home!", "Click here to go on.", "Then run ls -l > out © twice.",
                            "First item", "Second Acme Corp item"]
    assert translate_document(PAGE, "html", lambda pieces: pieces, "en") == PAGE
    translated = translate_document(PAGE, "html", upper, "en")
    assert translated == PAGE_UPPER
    assert html_structure(translated) == html_structure(PAGE)
    assert html_structure(PAGE.replace("<em>home</em>", "home")) != html_structure(PAGE)  # the check sees a tag


def test_html_translations_are_written_as_html_text() -> None:
    """& < > as references, a character the source wrote as one as the source wrote it."""
    text = "<p>Fish &amp; chips &eacute;t&eacute;.</p>"
    assert translate_document(text, "html", lambda pieces: ["Pesce & patatine <ok> é."], "en") == \
        "<p>Pesce &amp; patatine &lt;ok&gt; &eacute;.</p>"


@pytest.mark.parametrize("text, expected", [
    ("<p><b>It rains.</b> We stay.</p>", "<p><b>IT RAINS.</b> WE STAY.</p>"),  # a sentence's own tags stay out
    ("<p><b>It rains. We</b> stay.</p>", "<p><b>IT RAINS. WE</b> STAY.</p>"),  # across sentences: they cut
    ("<p>Tom<br>and <b>Jerry</b></p>", "<p>TOM<br>AND <b>JERRY</b></p>"),  # a line break cuts
    ("<p>un<b>believ</b>able</p>", "<p>UN<b>BELIEV</b>ABLE</p>"),  # inside a word: cut, never placed
    # tags the parser ignores join the text around them into one node, which stays as it is
    ("<td>Loose</td> <b>cell</b>", "<td>Loose</td> <b>CELL</b>"),
])
def test_html_markup_a_sentence_cannot_keep_inline_cuts_it(text: str, expected: str) -> None:
    assert translate_document(text, "html", upper, "en") == expected


def test_html_text_the_parser_moves_stays_as_it_is() -> None:
    """Text inside a table but outside its cells goes before the table in the tree: the cell's text,
    then out of the source's order, is left untranslated rather than put back in the wrong place."""
    text = "<table><tr><td>cell</td>stray</tr></table>"
    assert plan_document(text, "html", "en").sources == ["stray"]
    assert translate_document(text, "html", upper, "en") == text.replace("stray", "STRAY")


@pytest.mark.parametrize("text, expected", [
    ("<p>Hi <!x> there <?php echo 1 ?> now.</p>", "<p>HI <!x> THERE <?php echo 1 ?> NOW.</p>"),
    ("<p>Hi there<!-- never closed", "<p>HI THERE<!-- never closed"),
    ("<p>Hi there<b class='x", "<p>HI THERE<b class='x"),
])
def test_html_bogus_comments_and_tags_cut_off_by_the_end_stay_as_they_are(text: str, expected: str) -> None:
    """A browser reads these as comments (or drops a tag the end cuts off): none of it reaches the
    model or comes back as text."""
    assert translate_document(text, "html", upper, "en") == expected
    assert html_structure(expected) == html_structure(text)


def test_html_a_tag_that_ends_at_an_apostrophe_keeps_the_sentence_whole() -> None:
    """<b>Tom</b>'s: the tag ends between a letter and a mark, a word's end (un<b>believ</b>able cuts)."""
    text = "<p><b>Tom</b>'s cat sleeps.</p>"
    assert plan_document(text, "html", "en").sources == ["Tom's cat sleeps."]
    assert translate_document(text, "html", upper, "en") == "<p><b>TOM</b>'S CAT SLEEPS.</p>"
