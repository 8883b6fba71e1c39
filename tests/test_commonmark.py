"""documents.py's Markdown against the CommonMark specification's own examples (tests/commonmark:
spec 0.31.2, the version markdown-it-py 4.3.0 implements): every example comes back byte for byte
through a translator that changes nothing, and a translator that changes every word leaves the
HTML that markdown-it-py renders with the same tags and attributes, in the same order, and its
code's text as it was."""
from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path

from markdown_it import MarkdownIt
from mdit_py_plugins.front_matter import front_matter_plugin

from nmt.inference.documents import translate_document

EXAMPLES = json.loads((Path(__file__).parent / "commonmark" / "spec.json").read_text(encoding="utf-8"))
# What documents.py reads, rendered as markdown-it-py renders it.
RENDERER = MarkdownIt("commonmark").enable(["table", "strikethrough"]).use(front_matter_plugin)
WORD = re.compile(r"[^\W\d_]+")

# Examples where a changed word changes the structure for a reason no reader of Markdown can
# avoid: the text itself, translated, reads differently.
STRUCTURE_CHANGES = {
    353: "`*\\xa0a\\xa0*` is text; its no-break spaces reach the translator as spaces (a piece's "
         "whitespace is normalised), and `* ` at a line's start is a list marker",
    609: "`<m:abc>` is text (a URI scheme has 2 to 32 characters); the changed word `MM` is a scheme, "
         "so `<MM:CBACBA>` is an autolink",
}


class Tags(HTMLParser):
    """The tags of an HTML text, each with its attributes (but an image's description, which is
    text to translate), in order, and the text of code, which is not."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple] = []
        self.in_code = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, sorted((name, value) for name, value in attrs if name != "alt")))
        self.in_code += tag == "code"

    def handle_endtag(self, tag: str) -> None:
        self.tags.append(("/" + tag,))
        self.in_code -= tag == "code" and self.in_code > 0

    def handle_data(self, data: str) -> None:
        if self.in_code:
            self.tags.append(("code text", data))


def tag_structure(markdown: str) -> list[tuple]:
    parser = Tags()
    parser.feed(RENDERER.render(markdown))
    parser.close()
    return parser.tags


def every_word_changed(pieces: list[str]) -> list[str]:
    """Each word reversed, its letters' case swapped and doubled: longer, and no word as it was."""
    return [WORD.sub(lambda word: word.group()[::-1].swapcase() * 2, piece) for piece in pieces]


def test_every_example_comes_back_byte_for_byte_through_an_identity_translator() -> None:
    changed = [example["example"] for example in EXAMPLES
               if translate_document(example["markdown"], "markdown", lambda pieces: pieces, "en")
               != example["markdown"]]
    assert len(EXAMPLES) == 652 and changed == []


def test_every_example_keeps_its_html_structure_when_every_word_changes() -> None:
    changed = {}
    for example in EXAMPLES:
        translated = translate_document(example["markdown"], "markdown", every_word_changed, "en")
        if tag_structure(translated) != tag_structure(example["markdown"]):
            changed[example["example"]] = translated
    assert sorted(changed) == sorted(STRUCTURE_CHANGES), {n: changed[n] for n in set(changed) - set(STRUCTURE_CHANGES)}


def test_the_word_changer_reaches_the_prose_of_most_examples() -> None:
    """The structure test means something: most examples have prose that changes, and the
    structure check sees a change of structure."""
    touched = sum(translate_document(e["markdown"], "markdown", every_word_changed, "en") != e["markdown"]
                  for e in EXAMPLES)
    assert touched > 450
    assert tag_structure("*a* b") != tag_structure("a b")

