"""LibreTranslate's HTTP API, as its clients (libretranslatepy, Mastodon, Discourse, Weblate, ...)
speak it: its requests read into a `LibreRequest`, its answers built from this project's
translations. serve.py routes it beside its own API and gives it the same limits and load shedding.

- POST /translate: `q` (a text, or a list of texts), `source` (a language code, or "auto"),
  `target`, `format` ("text", the default, or "html"), `alternatives` (how many other
  translations to add, from the n-best list) and `api_key`; as JSON, or as a form (urlencoded, as
  libretranslatepy posts it, or multipart). Fields it does not know are ignored, as LibreTranslate
  ignores them. A request is LibreTranslate's when it is a form or a JSON object with `q`.
  Answer: {"translatedText": ...} (a list for a list), "alternatives" when some are asked for (a
  list, a list of lists for a list q: each text's other translations, without repeats and without
  its translation), and "detectedLanguage" {"confidence": 0 to 100, "language": code} when source
  is "auto" (for a list q, one detection of all its texts together, repeated for each, as
  LibreTranslate does): the model's source language, with the detector's confidence in it. A
  text that reads as another of the server's languages (OTHER_LANGUAGE_CONFIDENCE) is refused.
- POST /detect (`q`): [{"confidence", "language"}, ...], the most likely first.
- GET /languages: [{"code", "name", "targets"}, ...]: the model's source language with its target
  languages, then each target language (targets: none); names from ISO 639 (python-iso639).
Detection is py3langid's (the identifier the cleaning of corpora uses, nmt/corpora/cleaning.py),
with its shipped model and normalised probabilities, restricted to the server's languages that
it knows, as LibreTranslate restricts its detector to the languages it has.
Errors are {"error": "..."}: 400 for a bad request (a missing q, source or target, a language this
server does not translate, an unknown format, alternatives that are not a number or more than
serve_max_beam_size allows), 403 for a missing or wrong key where the server has one (sent as
`api_key`, or as this project's `Authorization: Bearer KEY`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from starlette.requests import Request
from starlette.types import Message

from iso639 import Language, LanguageNotFoundError
from py3langid.langid import MODEL_FILE, LanguageIdentifier

from nmt.inference.documents import DocumentPlan
from nmt.inference.translator import Hypothesis
from nmt.serving.request_checks import ApiError, check_text, json_type

FORMATS = ("text", "html")
FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")
AUTO = "auto"
Detection = dict[str, Any]  # {"confidence": 0 to 100, "language": code}
# An auto source is refused when the text reads as another of the server's languages at least this
# surely: translated as the model's source language, it would come out as nonsense.
OTHER_LANGUAGE_CONFIDENCE = 90.0


@dataclass(frozen=True)
class LibreRequest:
    """A LibreTranslate translation request, checked: its texts (one for a string q), whether q
    was a list, the languages, the format and how many alternatives to add."""

    texts: list[str]
    batch: bool
    source: str
    target: str
    format: str
    alternatives: int


def is_libretranslate(payload: Any) -> bool:
    """Whether a JSON request body is LibreTranslate's (an object with `q`) rather than this project's."""
    return isinstance(payload, dict) and "q" in payload


def is_form(request: Request) -> bool:
    """Whether a request's body is a form (urlencoded or multipart): LibreTranslate's."""
    content_type = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    return content_type in FORM_TYPES


async def form_fields(request: Request, body: bytes) -> dict[str, Any]:
    """A form's fields (`body`, already read), after the query string's, as LibreTranslate reads a
    form's values: each field's first value. Starlette parses it; a malformed one is its 400."""
    async def replay() -> Message:
        return {"type": "http.request", "body": body, "more_body": False}

    form = await Request(request.scope, replay).form()
    fields: dict[str, Any] = dict(request.query_params)
    for name in form:
        value = form.getlist(name)[0]
        if not isinstance(value, str):
            raise ApiError(400, f"the form field {name!r} is a file: send it as text")
        fields[name] = value
    return fields


def read_request(fields: Mapping[str, Any], max_items: int, max_chars: int, max_alternatives: int) -> LibreRequest:
    """A /translate request's fields (JSON, or a form's) checked; a 400 saying what is wrong."""
    texts, batch = read_q(fields, max_items, max_chars)
    source, target = required_string(fields, "source"), required_string(fields, "target")
    fmt = fields.get("format") or "text"
    if fmt not in FORMATS:
        raise ApiError(400, f"{fmt!r} format is not supported (formats: {', '.join(FORMATS)})")
    return LibreRequest(texts, batch, source, target, fmt, read_alternatives(fields, max_alternatives))


def read_q(fields: Mapping[str, Any], max_items: int, max_chars: int) -> tuple[list[str], bool]:
    """q's texts, and whether it was a list. An empty q is missing, as in LibreTranslate; a blank
    text (or a blank item of a list) comes back as it is."""
    q = fields.get("q")
    if q is None or q == "" or q == []:
        raise ApiError(400, "Invalid request: missing q parameter")
    if isinstance(q, str):
        return [q if not q.strip() else check_text(q, "'q'", max_chars)], False
    if not isinstance(q, list):
        raise ApiError(400, f"'q' must be a string or a list of strings, got {json_type(q)}")
    if len(q) > max_items:
        raise ApiError(400, f"'q' has {len(q)} texts; the limit is {max_items} (serve_max_sentences)")
    name = "item {} of 'q'"
    return [text if isinstance(text, str) and not text.strip() else check_text(text, name.format(i), max_chars)
            for i, text in enumerate(q, start=1)], True


def required_string(fields: Mapping[str, Any], name: str) -> str:
    value = fields.get(name)
    if value is None or value == "":
        raise ApiError(400, f"Invalid request: missing {name} parameter")
    if not isinstance(value, str):
        raise ApiError(400, f"'{name}' must be a string, got {json_type(value)}")
    return value


def read_alternatives(fields: Mapping[str, Any], limit: int) -> int:
    """How many alternatives are asked for: an integer (or a string of one, as a form sends it),
    a negative one read as 0 as LibreTranslate reads it; at most `limit`."""
    value = fields.get("alternatives", 0)
    if isinstance(value, str) and value.strip().lstrip("+-").isdigit():
        value = int(value)
    if type(value) is not int:
        raise ApiError(400, "Invalid request: alternatives parameter is not a number")
    if value > limit:
        raise ApiError(400, f"Invalid request: alternatives parameter must be <= {limit} (serve_max_beam_size "
                            f"{limit + 1}: the translation and its alternatives come from one beam)")
    return max(value, 0)


def check_languages(order: LibreRequest, source: str, targets: Sequence[str]) -> None:
    """A 400 unless the request translates from the model's `source` (or from "auto") into one of
    its `targets`."""
    if order.source not in (AUTO, source):
        raise ApiError(400, f"{order.source} is not supported: this server translates from {source}")
    if order.target not in targets:
        raise ApiError(400, f"{order.target} is not supported: this server translates {source} into "
                            f"{', '.join(targets)}")


def translations(plan: DocumentPlan, found: Sequence[Sequence[Hypothesis]], alternatives: int) -> tuple[str, list[str]]:
    """A text's translation (its pieces' best hypotheses put back in its shape) and up to
    `alternatives` others: the k-th puts together each piece's k-th hypothesis (its last, for a piece
    that has fewer), without repeats and without the translation itself."""
    texts = [plan.assemble([hypotheses[min(k, len(hypotheses) - 1)].text for hypotheses in found])
             for k in range(alternatives + 1)]
    return texts[0], [text for text in dict.fromkeys(texts[1:]) if text != texts[0]]


def translation_answer(order: LibreRequest, results: Sequence[tuple[str, list[str]]],
                       detected: Detection | None) -> dict[str, Any]:
    """The answer to a /translate request: its texts' translations, their alternatives when some
    were asked for, and the detected language of an auto source."""
    translated, others = [text for text, _ in results], [alternatives for _, alternatives in results]
    answer: dict[str, Any] = {"translatedText": translated if order.batch else translated[0]}
    if detected is not None:
        answer["detectedLanguage"] = [detected] * len(results) if order.batch else detected
    if order.alternatives > 0:
        answer["alternatives"] = others if order.batch else others[0]
    return answer


def language_name(code: str) -> str:
    """A language's English name from ISO 639 (its code, when it is not one)."""
    try:
        return Language.match(code).name
    except LanguageNotFoundError:
        return code


def languages(source: str, targets: Sequence[str]) -> list[dict[str, Any]]:
    """GET /languages: the source language with its targets, then each target language."""
    return [{"code": code, "name": language_name(code), "targets": list(targets) if code == source else []}
            for code in [source, *targets]]


class LanguageDetector:
    """py3langid's identifier, as nmt/corpora/cleaning.py loads it (its shipped model, probabilities
    normalised), restricted to the server's languages that it knows. When it does not know the
    model's source language, it cannot tell that language from the others: every text is then the
    source language, with confidence 0 (as LibreTranslate answers what it cannot detect)."""

    def __init__(self, source: str, targets: Sequence[str]) -> None:
        self.source = source
        self.identifier = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)  # about 1 s
        known = [code for code in dict.fromkeys([source, *targets]) if code in self.identifier.nb_classes]
        self.known = source in known
        if self.known:
            self.identifier.set_languages(known)

    def detect(self, text: str) -> list[Detection]:
        """Each language's confidence (0 to 100) that `text` is in it, the most likely first."""
        if not self.known:
            return [{"confidence": 0.0, "language": self.source}]
        return [{"confidence": round(float(probability) * 100, 2), "language": language}
                for language, probability in self.identifier.rank(text)]

    def source_detection(self, text: str) -> Detection:
        """An auto source: the model's source language with the confidence that `text` is in it; a
        400 when it reads as another of the server's languages with OTHER_LANGUAGE_CONFIDENCE or more.
        (A short text rarely reads as any language with confidence: "Hello." is 41 English, 59
        Italian; translated as what the model translates from, it comes out right.)"""
        found = self.detect(text)
        best = found[0]
        if best["language"] != self.source and best["confidence"] >= OTHER_LANGUAGE_CONFIDENCE:
            raise ApiError(400, f"the text reads as {best['language']} (confidence {best['confidence']:g}): this "
                                f"server translates from {self.source} only; send source {self.source!r} to "
                                f"translate it anyway")
        return next(detection for detection in found if detection["language"] == self.source)


def detect_text(fields: Mapping[str, Any], max_items: int, max_chars: int) -> str:
    """A /detect request's q, checked (a list's texts joined by line breaks: one detection of them all)."""
    texts, _ = read_q(fields, max_items, max_chars)
    return "\n".join(texts)
