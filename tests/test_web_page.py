"""The web page at / in a real browser (Playwright driving Debian's Chromium): a text of two
paragraphs (three sentences, a blank line between) typed and translated shows the translation with
the same paragraphs, the checkpoint's name and the heatmap of the server's attention weights for
the first sentence; the words a glossary gave are marked; a rejected input shows the server's own
message; in HTML mode the translated HTML and where each inline tag went. Skips where the browser or
the playwright package is missing."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from justhtml import Element, JustHTML

from benchmarks.loadtest import ServerProcess
from nmt.inference.documents import element_text, html_nodes
from nmt.inference.translator import DecodingOptions, TorchTranslator

CHROMIUM = Path("/usr/bin/chromium")
if not CHROMIUM.exists():
    pytest.skip(f"no browser: {CHROMIUM} is missing (apt-get install chromium)", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")

# Without the background-networking flags Chromium keeps trying to reach Google's services.
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SENTENCE = "The old man sees the black cat."
OTHERS = ["The dog eats.", "The cat reads."]
TEXT = f"{SENTENCE} {OTHERS[0]}\n\n{OTHERS[1]}"


@pytest.fixture(scope="module")
def checkpoint(trained_run) -> Path:
    return trained_run.latest()[0]


@pytest.fixture(scope="module")
def server(checkpoint: Path) -> ServerProcess:
    with ServerProcess(["--checkpoint", str(checkpoint), "--serve_max_chars", "80"]) as process:
        yield process


@pytest.fixture(scope="module")
def page(server: ServerProcess):
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1000, "height": 900})
        page.goto(f"http://127.0.0.1:{server.port}/")
        yield page
        browser.close()


def translate(page, text: str) -> None:
    page.fill("#source", text)
    page.click("#translate")
    page.wait_for_selector("#translate:not([disabled])")


def test_translation_and_heatmap(page, checkpoint: Path) -> None:
    translator = TorchTranslator.load(checkpoint, checkpoint.parent, torch.device("cpu"))
    first, second, third = translator.translate_best([SENTENCE, *OTHERS], DecodingOptions())
    attention = translator.cross_attention(SENTENCE)

    sync_api.expect(page.locator("#model")).to_have_text(f"{checkpoint.name} · pytorch")
    translate(page, TEXT)
    shown = page.locator("#translation")
    assert shown.text_content() == f"{first} {second}\n\n{third}"
    assert shown.evaluate("element => getComputedStyle(element).whiteSpace") == "pre-wrap"  # lines shown as lines
    assert page.locator("#error").is_hidden() and page.locator("#pieces").is_hidden()

    heatmap = page.locator("#heatmap")
    sync_api.expect(heatmap.locator("th.source-token")).to_have_text(attention.source_tokens)
    sync_api.expect(heatmap.locator("th.output-token")).to_have_text(attention.output_tokens)
    rows = heatmap.locator("tbody tr")
    assert rows.count() == len(attention.output_tokens)
    titles = [cell.get_attribute("title") for cell in heatmap.locator("td").all()]
    assert titles == [f"{out} → {src}: {weight:.3f}" for out, row in zip(attention.output_tokens, attention.weights)
                      for src, weight in zip(attention.source_tokens, row)]
    # Darker is less: the cell of a row's largest weight is the brightest of that row.
    first = rows.nth(0).locator("td")
    brightness = [sum(map(int, color[4:-1].split(","))) for color in
                  first.evaluate_all("cells => cells.map(cell => getComputedStyle(cell).backgroundColor)")]
    assert brightness.index(max(brightness)) == attention.weights[0].index(max(attention.weights[0]))


def test_rejected_input_shows_the_server_message(page) -> None:
    translate(page, "a" * 81)
    sync_api.expect(page.locator("#error")).to_have_text(
        "The server refused this: 'text' is 81 characters long; the limit is 80 (serve_max_chars)")
    assert page.locator("#result").is_hidden() and page.locator("#attention").is_hidden()
    translate(page, " \n  ")
    sync_api.expect(page.locator("#error")).to_have_text("The server refused this: 'text' is empty")


def test_html_mode_shows_where_inline_tags_went(page, checkpoint: Path) -> None:
    """Format HTML: the text goes through LibreTranslate's API as format html, the translation comes
    back as HTML (shown as text), and a table says which words each inline tag covers in the source
    and in the translation; no heatmap."""
    translator = TorchTranslator.load(checkpoint, checkpoint.parent, torch.device("cpu"))
    source = '<p>The old man sees the <b class="k">black</b> cat.</p>'
    expected, _ = translator.translate_document(source, "html", DecodingOptions(), True)
    bold = next(node for node in html_nodes(JustHTML(expected, sanitize=False).root)
                if isinstance(node, Element) and node.name == "b")
    page.select_option("#format", "html")
    try:
        translate(page, source)
        sync_api.expect(page.locator("#translation")).to_have_text(expected)
        sync_api.expect(page.locator("#tags")).to_be_visible()
        rows = page.locator("#tag-table tbody tr")
        sync_api.expect(rows).to_have_count(1)
        assert [cell.text_content() for cell in rows.nth(0).locator("td").all()] == [
            '<b class="k">', "black", element_text(bold)]
        assert page.locator("#attention").is_hidden() and page.locator("#error").is_hidden()
    finally:
        page.select_option("#format", "text")


def test_the_words_a_glossary_gave_are_marked(page) -> None:
    """A glossary typed in its box goes with the request; the term the server places is marked in
    the translation, its source term in the tooltip; the other words are not."""
    page.fill("#glossary", "dog = pesce")
    translate(page, OTHERS[0])
    mark = page.locator("#translation mark.term")
    sync_api.expect(mark).to_have_text("pesce")
    assert mark.get_attribute("title") == "glossary: dog → pesce"
    assert "pesce" in page.locator("#translation").text_content().rstrip(".").split()
    page.fill("#glossary", "")
    translate(page, OTHERS[0])
    assert page.locator("#translation mark").count() == 0
