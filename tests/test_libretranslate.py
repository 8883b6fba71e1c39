"""LibreTranslate's API on serve.py (nmt/serving/libretranslate.py), against a real server on
127.0.0.1 (test_serve.py's: its key required, its limits): libretranslatepy, a client nobody here
wrote, translates, detects and lists the languages, and gets LibreTranslate's errors for a bad key
(403) and a target the model lacks (400); a plain JSON client and a multipart form do the same with
a list q, an auto source (detectedLanguage), alternatives from the n-best list, and get a 400 for
each malformed request; /languages needs no key, /detect does; the requests are counted in /metrics;
format html comes back with its markup, the inline tags placed by the model's attention."""
from __future__ import annotations

import json
import urllib.error
import uuid
from typing import Any

import pytest
from libretranslatepy import LibreTranslateAPI

from benchmarks.loadtest import ServerProcess
from nmt.inference.translator import DecodingOptions, TorchTranslator
from test_serve import KEY, SENTENCES, call, exchange, metric, no_traceback
from test_serve import checkpoint, server, translator  # noqa: F401  (fixtures, shared with test_serve.py)

LANGUAGES = [{"code": "en", "name": "English", "targets": ["it"]}, {"code": "it", "name": "Italian", "targets": []}]


def client(server: ServerProcess, api_key: str | None = KEY) -> LibreTranslateAPI:
    return LibreTranslateAPI(f"http://127.0.0.1:{server.port}", api_key)


def refusal(request: Any) -> tuple[int, dict[str, Any]]:
    """The status and JSON body of the HTTP error a libretranslatepy call raises."""
    with pytest.raises(urllib.error.HTTPError) as raised:
        request()
    return raised.value.code, json.loads(raised.value.read())


def test_libretranslatepy(server: ServerProcess, translator: TorchTranslator) -> None:
    """libretranslatepy posts urlencoded forms, its key as the field api_key (and GETs /languages
    with a form body): a text translated in its shape, a detection, the languages; its bad key gets
    403 and a target the model lacks 400, both as {"error": ...}."""
    lt = client(server)
    first, second = translator.translate_best(SENTENCES[:2], DecodingOptions())
    assert lt.translate(SENTENCES[0], "en", "it") == first
    assert lt.translate(f"{SENTENCES[0]}\n\n{SENTENCES[1]}", "en", "it") == f"{first}\n\n{second}"
    detected = lt.detect("The old man reads a book.")
    assert [d["language"] for d in detected] == ["en", "it"] and detected[0]["confidence"] > 90
    assert sum(d["confidence"] for d in detected) == pytest.approx(100, abs=0.02)
    assert lt.languages() == LANGUAGES
    assert refusal(lambda: client(server, "wrong").translate(SENTENCES[0], "en", "it")) == \
        (403, {"error": "Invalid API key"})
    assert refusal(lambda: client(server, "wrong").detect(SENTENCES[0])) == (403, {"error": "Invalid API key"})
    assert refusal(lambda: lt.translate(SENTENCES[0], "en", "de")) == \
        (400, {"error": "de is not supported: this server translates en into it"})
    assert no_traceback(server)


def libre(server: ServerProcess, body: Any, path: str = "/translate") -> tuple[int, Any]:
    """A JSON request without the Authorization header: the key, if any, travels as api_key."""
    return call(server.port, "POST", path, body, headers={"Content-Type": "application/json"})


def test_json_client(server: ServerProcess, translator: TorchTranslator) -> None:
    """A list q gets a list; an auto source the model's language with the detector's confidence
    (one detection for a list, repeated); alternatives the n-best list's other translations, beyond
    the server's beam when asked (the server's beam 5; 2 asked for: n-best 3); the key as this
    project's header works too."""
    expected = translator.translate_best(SENTENCES[:3], DecodingOptions())
    assert libre(server, {"q": SENTENCES[:3], "source": "en", "target": "it", "api_key": KEY}) == \
        (200, {"translatedText": expected})
    status, answer = libre(server, {"q": SENTENCES[0], "source": "auto", "target": "it", "api_key": KEY})
    assert status == 200 and answer["translatedText"] == expected[0]
    assert answer["detectedLanguage"]["language"] == "en" and answer["detectedLanguage"]["confidence"] > 90
    status, answer = libre(server, {"q": SENTENCES[:2], "source": "auto", "target": "it", "api_key": KEY})
    assert status == 200 and answer["detectedLanguage"] == [answer["detectedLanguage"][0]] * 2
    [hypotheses] = translator.translate([SENTENCES[1]], DecodingOptions(n_best=3))
    status, answer = libre(server, {"q": SENTENCES[1], "source": "en", "target": "it", "alternatives": 2,
                                    "api_key": KEY})
    assert status == 200 and answer["translatedText"] == hypotheses[0].text
    assert answer["alternatives"] == [h.text for h in hypotheses[1:]] and len(set(answer["alternatives"])) == 2
    status, answer = call(server.port, "POST", "/translate", {"q": [SENTENCES[1]], "source": "en", "target": "it",
                                                              "alternatives": "1"})
    assert (status, answer) == (200, {"translatedText": [hypotheses[0].text], "alternatives": [[hypotheses[1].text]]})


def multipart(fields: dict[str, str]) -> tuple[bytes, dict[str, str]]:
    boundary = uuid.uuid4().hex
    parts = [f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'
             for name, value in fields.items()]
    return "".join(parts + [f"--{boundary}--\r\n"]).encode(), \
        {"Content-Type": f"multipart/form-data; boundary={boundary}"}


def test_multipart_form(server: ServerProcess, translator: TorchTranslator) -> None:
    body, headers = multipart({"q": SENTENCES[2], "source": "en", "target": "it", "api_key": KEY})
    status, _, answer = exchange(server.port, "POST", "/translate", raw=body, headers=headers)
    assert (status, json.loads(answer)) == (200, {"translatedText": translator.translate_best(SENTENCES[2:3],
                                                                                             DecodingOptions())[0]})


BAD_REQUESTS = [
    # (body, status, the error) of a JSON request to /translate without Authorization
    ({"q": SENTENCES[0], "source": "en", "target": "it"}, 403,
     "Invalid API key: this server needs one (the field api_key)"),
    ({"q": SENTENCES[0], "source": "en", "target": "it", "api_key": "wrong"}, 403, "Invalid API key"),
    ({"q": "", "source": "en", "target": "it", "api_key": KEY}, 400, "Invalid request: missing q parameter"),
    ({"q": [], "source": "en", "target": "it", "api_key": KEY}, 400, "Invalid request: missing q parameter"),
    ({"q": SENTENCES[0], "target": "it", "api_key": KEY}, 400, "Invalid request: missing source parameter"),
    ({"q": SENTENCES[0], "source": "en", "api_key": KEY}, 400, "Invalid request: missing target parameter"),
    ({"q": SENTENCES[0], "source": "fr", "target": "it", "api_key": KEY}, 400,
     "fr is not supported: this server translates from en"),
    ({"q": SENTENCES[0], "source": "en", "target": "de", "api_key": KEY}, 400,
     "de is not supported: this server translates en into it"),
    ({"q": SENTENCES[0], "source": "en", "target": "it", "format": "xml", "api_key": KEY}, 400,
     "'xml' format is not supported (formats: text, html)"),
    ({"q": SENTENCES[0], "source": "en", "target": "it", "alternatives": "many", "api_key": KEY}, 400,
     "Invalid request: alternatives parameter is not a number"),
    ({"q": SENTENCES[0], "source": "en", "target": "it", "alternatives": 3, "api_key": KEY}, 400,
     "Invalid request: alternatives parameter must be <= 2 (serve_max_beam_size 3"),
    ({"q": 7, "source": "en", "target": "it", "api_key": KEY}, 400, "'q' must be a string or a list of strings"),
    ({"q": [SENTENCES[0], 7], "source": "en", "target": "it", "api_key": KEY}, 400,
     "item 2 of 'q' must be a string, got a number"),
    ({"q": SENTENCES[:5], "source": "en", "target": "it", "api_key": KEY}, 400,
     "'q' has 5 texts; the limit is 4 (serve_max_sentences)"),
    ({"q": "One. Two. Three.\n\nFour. Five.", "source": "en", "target": "it", "api_key": KEY}, 400,
     "'q' has 5 sentences; the limit is 4 (serve_max_sentences)"),
    ({"q": "a" * 81, "source": "en", "target": "it", "api_key": KEY}, 400,
     "'q' is 81 characters long; the limit is 80 (serve_max_chars)"),
    ({"q": "Il gatto vede il cane nero.", "source": "auto", "target": "it", "api_key": KEY}, 400,
     "the text reads as it (confidence 99."),
]


@pytest.mark.parametrize("body, status, message", BAD_REQUESTS, ids=[m[:40] for _, _, m in BAD_REQUESTS])
def test_bad_request_gets_libretranslates_error(server: ServerProcess, body: dict[str, Any], status: int,
                                               message: str) -> None:
    got, answer = libre(server, body)
    assert (got, list(answer)) == (status, ["error"]) and answer["error"].startswith(message), answer
    assert no_traceback(server)


def test_detect_and_languages(server: ServerProcess) -> None:
    """/detect needs the key and a q, /languages needs neither (LibreTranslate's clients ask it
    first); both are counted in /metrics."""
    before = metric(server.port, "serve_requests_total", endpoint="detect", code="200")
    status, answer = libre(server, {"q": ["Il gatto vede il cane.", "La casa rossa."], "api_key": KEY}, "/detect")
    assert status == 200 and [d["language"] for d in answer] == ["it", "en"] and answer[0]["confidence"] > 90
    assert libre(server, {"q": SENTENCES[0]}, "/detect") == \
        (403, {"error": "Invalid API key: this server needs one (the field api_key)"})
    assert libre(server, {"api_key": KEY}, "/detect") == (400, {"error": "Invalid request: missing q parameter"})
    assert call(server.port, "GET", "/languages", headers=None) == (200, LANGUAGES)
    assert metric(server.port, "serve_requests_total", endpoint="detect", code="200") == before + 1
    assert metric(server.port, "serve_requests_total", endpoint="languages", code="200") >= 1


def test_html_comes_back_with_its_markup_and_inline_tags_placed_by_attention(server: ServerProcess,
                                                                             translator: TorchTranslator) -> None:
    """format html: read by documents.py, its markup, comment and pre kept, its text translated and
    the inline tag placed as translate.py --input places it (the model's attention: the same answer
    as the translator's own translate_document), alone and in a list q."""
    page = '<p class="x">The old man sees the <b>black</b> cat.</p><!--n--><pre>a b</pre>'
    expected, _ = translator.translate_document(page, "html", DecodingOptions(), True)
    assert "<b>" in expected and expected.endswith("<!--n--><pre>a b</pre>")
    fields = {"source": "en", "target": "it", "format": "html", "api_key": KEY}
    assert libre(server, {"q": page, **fields}) == (200, {"translatedText": expected})
    status, answer = libre(server, {"q": [page, "The dog eats."], **fields})
    assert status == 200 and answer["translatedText"][0] == expected
    assert answer["translatedText"][1] == translator.translate_document("The dog eats.", "html", DecodingOptions(),
                                                                        True)[0]
    assert no_traceback(server)
