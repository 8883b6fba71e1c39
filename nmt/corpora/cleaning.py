"""Corpus cleaning: training pairs filtered by rules before they are learned, or scored by models.

1. `Cleaner` is a streaming filter over (source, target) pairs of one language pair: each pair is
   normalised to Unicode NFC; its sides are exchanged when each reads as the other's language
   (`swap_sides`: py3langid, `langid_pair_threshold` on both sides; a crawler's swapped pair is a
   real translation, so it is repaired rather than lost); then it is judged by the rules below in
   order; the first that fires removes it and names the reason. Kept pairs come out NFC-normalised.
   The cleaner counts removals by reason and keeps a bounded, seeded sample of each reason's pairs
   (`CleaningReport`), for the log, TensorBoard and a file beside the data store. The rules, each with its threshold in
   `CleaningSettings` (0 or False turns one off):
   - too_short / too_long: a side with fewer than `min_chars` or more than `max_chars` characters;
   - bad_characters: a control character (tab and line breaks aside), a private-use or surrogate
     code point, or U+FFFD (text that was decoded wrongly somewhere);
   - copy: source equal to target once normalised (`near_duplicate_key`): untranslated copies;
   - length_ratio: the longer side has more than `max_length_ratio` times the shorter's characters,
     judged only when the longer has at least `ratio_min_chars` (short pairs vary most: Jinx! /
     Uccello del malaugurio!);
   - script: less than `script_min_share` of a side's letters are in its language's script(s)
     (`SCRIPTS`; languages missing there are not judged);
   - language: py3langid, whose probabilities are tempered by the text's length, so short
     sentences rarely reach a confident verdict (docs/cleaning.md): a side is removed when, between
     the pair's two languages, the other one's probability is at least `langid_pair_threshold`
     (the target language on both sides; swapped sides not repaired above), or when a third
     language's is at least `langid_other_threshold`. Languages py3langid does not know are not judged;
   - near_duplicate: the pair's normalised text (casefolded, punctuation and whitespace removed,
     digits kept) equals an earlier kept pair's: the first is kept. The set holds one 64-bit hash per
     kept pair (about 70 bytes each in Python: 700 MB for 10 million pairs).
   `CleaningSettings.describe()` is a dict of plain values that changes with every setting and with
   the version of these rules and of py3langid: for a store's key and a checkpoint.
2. Scoring by models: a `PairScorer` scores pairs, lower is better (the dual conditional
   cross-entropy of two trained models, one each way: nmt/inference/pair_scoring.py, handed to the
   store by the program that builds it, so that this stage imports nothing of inference);
   `keep_best` keeps the best fraction and `scoring_summary` says what it kept. A first run's
   models clean the corpus of a second (docs/cleaning.md).
3. What a data store records (store.py cleans each corpus's training pairs as it builds its text
   store): `cleaning_description`, the rules' settings and the scoring models' sha256, is part of
   the store's key and of the checkpoint's batch settings (`cleaning_changes` says how two differ);
   `report_line` and `cleaning_scalars` turn the report written beside the store into the log's
   line and TensorBoard's counts.
"""
from __future__ import annotations

import math
import random
import re
import unicodedata
from dataclasses import asdict, dataclass, field, fields
from functools import lru_cache
from importlib.metadata import version
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, NamedTuple, Sequence

import numpy as np

from nmt.atomic_files import sha256_of
from config import OPTIONS, corpus_name
from nmt.corpora.sources import DataError, Pair, text_hash

CLEANING_VERSION = 2  # bump when a rule changes what it removes: stores built with the old rules are rebuilt
REASONS = ("too_short", "too_long", "bad_characters", "copy", "length_ratio", "script", "language", "near_duplicate")

# The scripts of each language's letters, as the first word of their Unicode names (LATIN SMALL
# LETTER A); "CJK" covers the Han ideographs.
_LATIN = ("ace af an az bcl br bs ca crh cs cy da de en eo es et eu ext fi fo fr fuv fy ga gcf gcr gd gl gug guw "
          "ha hr ht hu id ig is it jv kab kik ku la lb lg lij ln lt ltg lv mg ms mt nl nn no nso oc om pcm pl pt qu "
          "ro rw se sk sl sn so sq st sv sw tk tl tr uz vec vi vo wa xh yo zu").split()
SCRIPTS: dict[str, tuple[str, ...]] = {
    **{lang: ("LATIN",) for lang in _LATIN},
    **{lang: ("CYRILLIC",) for lang in "ba be bg kk ky mk mn ru tg tt uk".split()},
    "sr": ("CYRILLIC", "LATIN"),
    **{lang: ("ARABIC",) for lang in "ar ary arz fa ps sdh ug ur uzs".split()},
    **{lang: ("HEBREW",) for lang in ("he", "hbo")},
    **{lang: ("GREEK",) for lang in ("el", "grc")},
    **{lang: ("DEVANAGARI",) for lang in "gom hi mr ne sa".split()},
    **{lang: ("BENGALI",) for lang in ("as", "bn")},
    "pa": ("GURMUKHI",), "gu": ("GUJARATI",), "or": ("ORIYA",), "ta": ("TAMIL",), "te": ("TELUGU",),
    "kn": ("KANNADA",), "ml": ("MALAYALAM",), "si": ("SINHALA",), "th": ("THAI",), "lo": ("LAO",),
    "km": ("KHMER",), "my": ("MYANMAR",), "dz": ("TIBETAN",), "ka": ("GEORGIAN",), "hy": ("ARMENIAN",),
    "am": ("ETHIOPIC",),
    **{lang: ("CJK", "IDEOGRAPHIC") for lang in ("zh", "yue", "wuu")},
    "ja": ("CJK", "IDEOGRAPHIC", "HIRAGANA", "KATAKANA", "KATAKANA-HIRAGANA", "HALFWIDTH"),
    "ko": ("HANGUL", "CJK", "IDEOGRAPHIC"),
}

# C0 and C1 controls but tab and line breaks, surrogates, private use (BMP), U+FFFD and the noncharacters.
_BAD_CHARACTERS = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\uf8ff\ufffd-\uffff]")


@dataclass(frozen=True)
class CleaningSettings:
    """Each rule's threshold (module docstring); 0 or False turns a rule off. The defaults remove
    one pair of tatoeba's 15,359 clean training pairs, a near-duplicate (docs/cleaning.md)."""

    # The defaults are the config's (config.OPTIONS). One-word sentences are real (Jinx!): min_chars 1;
    # a sentence may quote a word or two in another script: script_min_share 0.5.
    min_chars: int = OPTIONS["clean_min_chars"].default
    max_chars: int = OPTIONS["clean_max_chars"].default
    bad_characters: bool = OPTIONS["clean_bad_characters"].default
    copies: bool = OPTIONS["clean_copies"].default
    max_length_ratio: float = OPTIONS["clean_max_length_ratio"].default
    ratio_min_chars: int = OPTIONS["clean_ratio_min_chars"].default
    script_min_share: float = OPTIONS["clean_script_min_share"].default
    langid_pair_threshold: float = OPTIONS["clean_langid_pair_threshold"].default
    langid_other_threshold: float = OPTIONS["clean_langid_other_threshold"].default
    near_duplicates: bool = OPTIONS["clean_near_duplicates"].default
    swap_sides: bool = OPTIONS["clean_swap_sides"].default

    def __post_init__(self) -> None:
        for name in ("min_chars", "max_chars", "ratio_min_chars"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be 0 or more, got {getattr(self, name)}")
        if self.max_length_ratio and self.max_length_ratio < 1:
            raise ValueError(f"max_length_ratio must be 0 (off) or at least 1, got {self.max_length_ratio}")
        for name in ("script_min_share", "langid_pair_threshold", "langid_other_threshold"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} must be between 0 and 1, got {getattr(self, name)}")

    @property
    def langid(self) -> bool:
        return bool(self.langid_pair_threshold or self.langid_other_threshold)

    def describe(self) -> dict[str, Any]:
        """Plain values that name what these settings remove: for a store's key and a checkpoint."""
        described = {"version": CLEANING_VERSION, "normalization": "NFC", **asdict(self)}
        if self.langid:
            described["langid"] = f"py3langid {version('py3langid')}"
        return described


def settings_from_config(config: dict[str, Any]) -> CleaningSettings:
    """The settings of a config's clean_NAME keys, one per field (clean_max_chars, ...); a ValueError
    names a value out of range."""
    return CleaningSettings(**{setting.name: config[f"clean_{setting.name}"] for setting in fields(CleaningSettings)})


@lru_cache(maxsize=4)  # the copy rule and the near-duplicate rule ask for the same pair's keys
def near_duplicate_key(text: str) -> str:
    """`text` casefolded without punctuation or whitespace, digits kept: what near-duplicates share."""
    return "".join(ch for ch in text.casefold() if not _punctuation_or_space(ch))


@lru_cache(maxsize=None)
def _punctuation_or_space(ch: str) -> bool:
    return ch.isspace() or unicodedata.category(ch)[0] in "PZ"


@lru_cache(maxsize=None)
def _script(ch: str) -> str:
    return unicodedata.name(ch, "?").split(" ")[0]


def script_share(text: str, scripts: tuple[str, ...]) -> float:
    """The share of `text`'s letters that are in one of `scripts`; 1 for text without letters."""
    if text.isascii() and "LATIN" in scripts:
        return 1.0
    letters = [ch for ch in text if ch.isalpha()]
    return sum(_script(ch) in scripts for ch in letters) / len(letters) if letters else 1.0


@lru_cache(maxsize=1)
def _identifier() -> tuple[Any, dict[str, int]]:
    """py3langid's identifier with its shipped model, probabilities normalised, and each language's
    column (the first, where a label has several: py3langid sums them there). Loaded once (~1 s)."""
    from py3langid.langid import MODEL_FILE, LanguageIdentifier
    identifier = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
    columns: dict[str, int] = {}
    for column, label in enumerate(identifier.nb_classes):
        columns.setdefault(label, column)
    return identifier, columns


def known_languages() -> set[str]:
    """The languages py3langid identifies."""
    return set(_identifier()[1])


def language_verdict(text: str, own: str, other: str, pair_threshold: float, other_threshold: float) -> str:
    """Why `text`, one side of an `own`-`other` pair meant to be in `own`, reads as another language;
    "" when it may be `own` (module docstring). Both languages must be py3langid's."""
    identifier, columns = _identifier()
    probability = _probabilities(text)
    mine, theirs = float(probability[columns[own]]), float(probability[columns[other]])
    if pair_threshold and mine + theirs > 0 and theirs / (mine + theirs) >= pair_threshold:
        return f"reads as {other} ({theirs / (mine + theirs):.2f} against {own})"
    top = int(probability.argmax())
    if other_threshold and identifier.nb_classes[top] != own and probability[top] >= other_threshold:
        return f"reads as {identifier.nb_classes[top]} ({probability[top]:.2f})"
    return ""


@lru_cache(maxsize=4)  # the swap check and the language rule ask about the same pair's sides
def _probabilities(text: str) -> np.ndarray:
    """py3langid's probability of each language for `text` (columns: _identifier's)."""
    # _decide is the probability vector behind the public classify() and rank(); rank() would
    # build and sort a list of all 140 languages per sentence, doubling the time (docs/cleaning.md).
    return _identifier()[0]._decide(text)


class Removal(NamedTuple):
    """Why a pair was removed: one of REASONS, and what the rule saw."""

    reason: str
    detail: str


@dataclass
class CleaningReport:
    """What a Cleaner did: pairs seen and kept, those NFC changed, kept pairs whose sides it
    exchanged, removals by reason, a sample of each reason's pairs and of the swapped ones (row =
    position in the stream, from 0), and the rules it could not apply."""

    pair: str
    settings: dict[str, Any]
    seen: int = 0
    kept: int = 0
    normalized: int = 0
    swapped: int = 0
    removed: dict[str, int] = field(default_factory=dict)
    samples: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    unjudged: list[str] = field(default_factory=list)

    def summary(self) -> str:
        """One line for the log."""
        removed = ", ".join(f"{self.removed[reason]} {reason}" for reason in REASONS if reason in self.removed)
        line = (f"cleaning {self.pair}: kept {self.kept} of {self.seen} pairs, removed {self.seen - self.kept}"
                f"{f' ({removed})' if removed else ''}, sides swapped {self.swapped}, NFC-normalised {self.normalized}")
        return line + "".join(f"; not judged: {note}" for note in self.unjudged)

    def as_dict(self) -> dict[str, Any]:
        """Plain data, samples in row order: for the file beside the store and clean.py."""
        return {**asdict(self), "samples": {reason: sorted(found, key=lambda sample: sample["row"])
                                            for reason, found in self.samples.items()}}


def _printable(text: str) -> str:
    """`text` with lone surrogates escaped, so that a sample of bad characters can be written as UTF-8."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


class Cleaner:
    """The rules of `settings` over the pairs of `lang_src`-`lang_tgt`, streaming; keeps at most
    `samples_per_reason` removed pairs per reason, a uniform sample drawn with `seed` (reservoir)."""

    def __init__(self, settings: CleaningSettings, lang_src: str, lang_tgt: str, samples_per_reason: int = 5,
                 seed: int = 0) -> None:
        self.settings, self.languages = settings, (lang_src, lang_tgt)
        self.samples_per_reason, self.random = samples_per_reason, random.Random(seed)
        self.report = CleaningReport(f"{lang_src}-{lang_tgt}", settings.describe())
        self.seen_keys: set[int] = set()
        self.swaps = False
        self.rules = self._rules()

    def _rules(self) -> list[tuple[str, Callable[[str, str], str]]]:
        """(reason, rule) in the order they are asked; a rule returns what it saw, "" to keep the pair.
        Sets `swaps`: swapped sides are repaired only where py3langid knows both languages."""
        s = self.settings
        rules = [("too_short", self._too_short)] if s.min_chars else []
        rules += [("too_long", self._too_long)] if s.max_chars else []
        rules += [("bad_characters", self._bad_characters)] if s.bad_characters else []
        rules += [("copy", self._copy)] if s.copies else []
        rules += [("length_ratio", self._length_ratio)] if s.max_length_ratio else []
        if s.script_min_share:
            unknown = [lang for lang in self.languages if lang not in SCRIPTS]
            self.report.unjudged += [f"script of {lang} (not in cleaning.SCRIPTS)" for lang in unknown]
            rules += [("script", self._script)] if len(unknown) < 2 else []
        if s.langid:
            unknown = [lang for lang in self.languages if lang not in known_languages()]
            self.report.unjudged += [f"language {lang} (not one of py3langid's)" for lang in unknown]
            rules += [("language", self._language)] if not unknown else []
            self.swaps = s.swap_sides and bool(s.langid_pair_threshold) and not unknown
        return rules + ([("near_duplicate", self._near_duplicate)] if s.near_duplicates else [])

    def _sides(self, src: str, tgt: str) -> list[tuple[str, str, str, str]]:
        """(side name, text, its language, the other language) of each side."""
        lang_src, lang_tgt = self.languages
        return [("source", src, lang_src, lang_tgt), ("target", tgt, lang_tgt, lang_src)]

    def _too_short(self, src: str, tgt: str) -> str:
        return next((f"{side} has {len(text)} characters (min {self.settings.min_chars})"
                     for side, text, _, _ in self._sides(src, tgt) if len(text) < self.settings.min_chars), "")

    def _too_long(self, src: str, tgt: str) -> str:
        return next((f"{side} has {len(text)} characters (max {self.settings.max_chars})"
                     for side, text, _, _ in self._sides(src, tgt) if len(text) > self.settings.max_chars), "")

    def _bad_characters(self, src: str, tgt: str) -> str:
        for side, text, _, _ in self._sides(src, tgt):
            found = _BAD_CHARACTERS.search(text)
            if found:
                return f"{side} has U+{ord(found.group()):04X}"
        return ""

    def _copy(self, src: str, tgt: str) -> str:
        return "source equals target" if near_duplicate_key(src) == near_duplicate_key(tgt) else ""

    def _length_ratio(self, src: str, tgt: str) -> str:
        longer, shorter = max(len(src), len(tgt)), min(len(src), len(tgt))
        if longer >= self.settings.ratio_min_chars and longer > self.settings.max_length_ratio * shorter:
            return f"{len(src)} / {len(tgt)} characters (max ratio {self.settings.max_length_ratio:g})"
        return ""

    def _script(self, src: str, tgt: str) -> str:
        for side, text, lang, _ in self._sides(src, tgt):
            if lang in SCRIPTS:
                share = script_share(text, SCRIPTS[lang])
                if share < self.settings.script_min_share:
                    return f"{side}: {share:.0%} of its letters in {'/'.join(SCRIPTS[lang])}"
        return ""

    def _language(self, src: str, tgt: str) -> str:
        for side, text, lang, other in self._sides(src, tgt):
            verdict = language_verdict(text, lang, other, self.settings.langid_pair_threshold,
                                       self.settings.langid_other_threshold)
            if verdict:
                return f"{side} {verdict}"
        return ""

    def _swapped_sides(self, src: str, tgt: str) -> str:
        """What py3langid saw when each side reads as the other's language; "" otherwise."""
        threshold = self.settings.langid_pair_threshold
        verdicts = [language_verdict(text, lang, other, threshold, 0) for _, text, lang, other in self._sides(src, tgt)]
        return f"source {verdicts[0]}, target {verdicts[1]}" if all(verdicts) else ""

    def _near_duplicate(self, src: str, tgt: str) -> str:
        key = text_hash(near_duplicate_key(src) + "\t" + near_duplicate_key(tgt))
        if key in self.seen_keys:
            return "repeats an earlier pair"
        self.seen_keys.add(key)  # the last rule: only kept pairs are remembered
        return ""

    def judge(self, pair: Pair) -> Pair | Removal:
        """The pair NFC-normalised (its sides exchanged where they read as each other's language) if
        it is kept, else why it is removed; counted in the report."""
        src, tgt = (unicodedata.normalize("NFC", text) for text in pair)
        self.report.seen += 1
        self.report.normalized += (src, tgt) != tuple(pair)
        swapped = self._swapped_sides(src, tgt) if self.swaps else ""
        if swapped:
            src, tgt = tgt, src
        for reason, rule in self.rules:
            detail = rule(src, tgt)
            if detail:
                self.report.removed[reason] = self.report.removed.get(reason, 0) + 1
                self._sample(reason, self.report.removed[reason], detail, pair)
                return Removal(reason, detail)
        self.report.kept += 1
        if swapped:  # counted among the kept pairs only: a swapped pair may still be removed above
            self.report.swapped += 1
            self._sample("swapped", self.report.swapped, swapped, pair)
        return src, tgt

    def _sample(self, reason: str, count: int, detail: str, pair: Pair) -> None:
        """Keep `pair`, the `count`th of its reason, in the reason's bounded uniform sample."""
        sample = {"row": self.report.seen - 1, "source": _printable(pair[0]), "target": _printable(pair[1]),
                  "detail": _printable(detail)}
        found = self.report.samples.setdefault(reason, [])
        if len(found) < self.samples_per_reason:
            found.append(sample)
        elif (slot := self.random.randrange(count)) < self.samples_per_reason:
            found[slot] = sample

    def clean(self, pairs: Iterable[Pair]) -> Iterator[Pair]:
        """The kept pairs of `pairs`, NFC-normalised, in order."""
        for pair in pairs:
            judged = self.judge(pair)
            if not isinstance(judged, Removal):
                yield judged

    def clean_batches(self, batches: Iterable[list[Pair]]) -> Iterator[list[Pair]]:
        """`clean` over batches (sources.read_pairs'), batch for batch."""
        for batch in batches:
            yield list(self.clean(batch))

    def mark(self, pairs: Sequence[Pair]) -> tuple[list[Pair], np.ndarray]:
        """Each pair, NFC-normalised where it is kept and as given where it is removed, and which are
        kept (booleans): for a store that writes every row and selects the kept ones afterwards."""
        judged = [self.judge(pair) for pair in pairs]
        kept = np.fromiter((not isinstance(found, Removal) for found in judged), dtype=bool, count=len(judged))
        return [pair if isinstance(found, Removal) else found for pair, found in zip(pairs, judged)], kept


# ---------------------------------------------------------------------------- scoring by models

# Scores of sentence pairs in languages (lang_src, lang_tgt), one per pair, lower is better: what the
# program that builds a data store hands it (nmt.inference.pair_scoring.pair_scorer); a ValueError
# says the pairs are not of its languages.
PairScorer = Callable[[Sequence[Pair], str, str], np.ndarray]


def keep_best(scores: np.ndarray, fraction: float) -> np.ndarray:
    """The indices of the best (lowest) `fraction` of `scores`, rounded up, in their original order;
    ties go to the earlier pair."""
    if not 0 < fraction <= 1:
        raise ValueError(f"the fraction of pairs to keep must be in (0, 1], got {fraction}")
    count = math.ceil(round(fraction * len(scores), 6))  # 0.07 * 100 is 7.000000000000001: 7 pairs, not 8
    best = np.argsort(scores, kind="stable")[:count]
    return np.sort(best)


def scoring_summary(scores: np.ndarray, keep: float, worst: int) -> tuple[np.ndarray, dict[str, Any], np.ndarray]:
    """The indices of the best `keep` share of `scores` (`keep_best`); how many were scored and kept
    and the highest score kept, as plain data; and the indices of the `worst` scores, worst first."""
    best = keep_best(scores, keep)
    summary = {"scored": len(scores), "keep": keep, "kept": len(best),
               "cut": float(scores[best].max()) if len(best) else 0.0}
    return best, summary, np.argsort(-scores, kind="stable")[:worst]


# ---------------------------------------------------------------------------- what a data store records

NOT_CLEANED = {"rules": False, "scoring": False}  # what a checkpoint from before cleaning was trained on


def cleaning_description(config: dict[str, Any]) -> dict[str, Any]:
    """What cleaning does to each corpus's training pairs, as plain values for the text store's key
    and the checkpoint: the rules' settings (`describe()`; False with --clean false), and scoring's
    models, by the sha256 of each checkpoint file rather than its path, with the share it keeps
    (False without scoring). A DataError names a scoring checkpoint that cannot be read."""
    scoring: dict[str, Any] | bool = False
    if config["clean_score_forward"]:
        digests = {}
        for way in ("forward", "backward"):
            path = config[f"clean_score_{way}"]
            try:
                digests[way] = sha256_of(Path(path))
            except OSError as error:
                raise DataError(f"--clean_score_{way} {path}: cannot read it ({error.strerror or error})") from None
        scoring = {**digests, "keep": config["clean_score_keep"]}
    return {"rules": settings_from_config(config).describe() if config["clean"] else False, "scoring": scoring}


def cleaning_changes(old: dict[str, Any], new: dict[str, Any]) -> str:
    """How two `cleaning_description`s differ, in words: "rules max_length_ratio 3.0 -> 2.5",
    "scoring off -> on" (a model's sha256 shortened to 12 digits)."""
    def shown(value: Any) -> Any:
        return f"{value[:12]}..." if isinstance(value, str) and len(value) == 64 else value

    changes = []
    for part in ("rules", "scoring"):
        before, after = old.get(part, False), new.get(part, False)
        if before == after:
            continue
        if not before or not after:
            changes.append(f"{part} {'on' if before else 'off'} -> {'on' if after else 'off'}")
            continue
        changes += [f"{part} {name} {shown(before.get(name))} -> {shown(after.get(name))}"
                    for name in dict.fromkeys([*before, *after]) if before.get(name) != after.get(name)]
    return ", ".join(changes)


def report_line(report: dict[str, Any]) -> str:
    """One line for the log of what cleaning removed from a corpus's training pairs (the report a
    text store keeps beside its files: store.TextStore.cleaning)."""
    parts = []
    if report.get("rules"):
        parts.append(CleaningReport(**report["rules"]).summary())
    if report.get("scoring"):
        scoring = report["scoring"]
        parts.append(f"scoring by dual conditional cross-entropy kept the best {scoring['kept']} of "
                     f"{scoring['scored']} ({scoring['keep']:.0%}), scores up to {scoring['cut']:.3f}")
    return f"{corpus_name(report['corpus'])}: {'; '.join(parts)}"


def cleaning_scalars(reports: Sequence[dict[str, Any]]) -> dict[str, int]:
    """TensorBoard's counts, summed over the corpora's reports: pairs seen and kept, kept pairs whose
    sides were swapped, and the pairs removed for each reason (every rule's, 0 included, and "score"
    for scoring)."""
    totals = {"seen": 0, "kept": 0, "swapped": 0, **dict.fromkeys(REASONS, 0), "score": 0}
    for report in reports:
        rules, scoring = report.get("rules"), report.get("scoring")
        totals["seen"] += rules["seen"] if rules else scoring["scored"]
        totals["kept"] += scoring["kept"] if scoring else rules["kept"]
        totals["swapped"] += rules.get("swapped", 0) if rules else 0
        for reason, count in (rules["removed"] if rules else {}).items():
            totals[reason] += count
        totals["score"] += scoring["scored"] - scoring["kept"] if scoring else 0
    return totals
