"""documents.py with fake translators: the format from the name or the override, plain text with its
line endings, SubRip numbers and timings unchanged and sentences across cues, Markdown's structure,
code, URLs and link targets untouched; each sentence's span in the document's text."""
from __future__ import annotations

import pytest

from nmt.inference.documents import DocumentError, document_format, plan_document, translate_document


def bracketed(pieces: list[str]) -> list[str]:
    return [f"[{piece}]" for piece in pieces]


def upper(pieces: list[str]) -> list[str]:
    return [piece.upper() for piece in pieces]


def test_the_format_comes_from_the_name_and_the_override_wins() -> None:
    assert [document_format(name) for name in ("a.txt", "b.SRT", "c.md", "d.markdown")] == [
        "text", "srt", "markdown", "markdown"]
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

EXPECTED = """# [Title with] `code` #

[Intro paragraph that runs
across two lines.] [Read] [[the guide]](http://x.org/a_b "T") [now.]

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
| [foo]  | [A] **[bold]** [thing.] |

<div>
Raw html block.
</div>

[ref]: http://example.com "Title"

[Setext heading]
==============

* * *
[Text with] ![[a cat]](img/cat.png) [and] <span class="x">[inline html]</span>, &amp; *[emphasis]*.
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
