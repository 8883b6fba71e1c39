"""cleaning.py: each rule removes its crafted pair (and only the rule that fires counts it), samples
stay bounded, the settings' description follows every threshold, tatoeba's clean pairs survive the
defaults, and scoring keeps the best share (the models' scores: tests/test_pair_scoring.py)."""
from __future__ import annotations

import dataclasses
import json
import unicodedata
from pathlib import Path

import numpy as np
import pytest

from nmt.corpora.cleaning import (NOT_CLEANED, REASONS, Cleaner, CleaningSettings, Removal, cleaning_changes,
                                  cleaning_description, cleaning_scalars, keep_best, near_duplicate_key, report_line,
                                  settings_from_config)
from config import get_config
from nmt.corpora.sources import DataError

ROOT = Path(__file__).resolve().parents[1]
KEPT = ("The station is on the other side of the river.", "La stazione è dall'altra parte del fiume.")

# Each pair is removed by its rule, the first that fires: removing the rule from cleaning.py makes its
# case fail. Near-duplicates have a test of their own.
CASES = {
    "too_short": (("Hi.", "Ciao."), {"min_chars": 4}),
    "too_long": ((KEPT[0] + " " + KEPT[0], KEPT[1] + " " + KEPT[1]), {"max_chars": 80}),
    "bad_characters": (("The station is on the other side of the \ufffd river.", KEPT[1]), {}),
    "copy": (("Tom is here.", "tom is here!"), {}),
    "length_ratio": (("I am leaving now because the last train to the city leaves at nine.", "Vado."), {}),
    "script": (("Станция находится на другом берегу реки.", KEPT[1]), {}),
    "language": ((KEPT[1], "La stazione si trova dall'altra parte del fiume."), {}),
}
OFF = {"too_short": {"min_chars": 0}, "too_long": {"max_chars": 0}, "bad_characters": {"bad_characters": False},
       "copy": {"copies": False}, "length_ratio": {"max_length_ratio": 0.0}, "script": {"script_min_share": 0.0},
       "language": {"langid_pair_threshold": 0.0, "langid_other_threshold": 0.0}}


@pytest.mark.parametrize("reason", sorted(CASES))
def test_each_rule_removes_its_pair_counts_and_samples_it(reason: str) -> None:
    pair, settings = CASES[reason]
    cleaner = Cleaner(CleaningSettings(**settings), "en", "it")
    judged = [cleaner.judge(KEPT), cleaner.judge(pair)]
    assert judged[0] == KEPT and isinstance(judged[1], Removal) and judged[1].reason == reason
    report = cleaner.report
    assert (report.seen, report.kept, report.removed) == (2, 1, {reason: 1})
    assert report.samples == {reason: [{"row": 1, "source": pair[0], "target": pair[1], "detail": judged[1].detail}]}
    # Off, the rule lets the pair through (or a later rule removes it for another reason).
    assert Cleaner(CleaningSettings(**{**settings, **OFF[reason]}), "en", "it").judge(pair) != judged[1]


def test_the_first_rule_that_fires_names_the_reason() -> None:
    cleaner = Cleaner(CleaningSettings(), "en", "it")
    swapped_copy = ("La stazione è lontana.", "La stazione è lontana.")  # a copy, and Italian in the source
    assert cleaner.judge(swapped_copy).reason == "copy"
    assert cleaner.report.removed == {"copy": 1}


def test_the_other_language_of_the_pair_and_a_third_language() -> None:
    cleaner = Cleaner(CleaningSettings(swap_sides=False), "en", "it")
    assert cleaner.judge((KEPT[1], KEPT[0])).detail == "source reads as it (1.00 against en)"
    french = cleaner.judge(("Il fait très beau aujourd'hui, mais demain il pleuvra.", "Oggi fa molto bello, ma domani pioverà."))
    assert french.detail.startswith("source reads as fr")
    german = cleaner.judge(("The weather is fine today, but tomorrow it will rain.", "Das Wetter ist heute schön, aber morgen regnet es."))
    assert german.detail.startswith("target reads as de")


def test_swapped_sides_are_exchanged_counted_and_sampled() -> None:
    """Both sides read as the other's language: the pair is kept the right way round; one side
    alone (the target language on both sides) is still removed; off, the swapped pair is removed."""
    train = ("The train leaves at nine in the evening, but I stay at home.",
             "Il treno parte alle nove di sera, ma io resto a casa.")
    cleaner = Cleaner(CleaningSettings(), "en", "it")
    assert cleaner.judge(KEPT) == KEPT and cleaner.judge((train[1], train[0])) == train
    assert cleaner.judge(CASES["language"][0]).reason == "language"
    report = cleaner.report
    assert (report.seen, report.kept, report.swapped, report.removed) == (3, 2, 1, {"language": 1})
    assert report.samples["swapped"] == [{"row": 1, "source": train[1], "target": train[0], "detail":
                                          "source reads as it (1.00 against en), target reads as en (1.00 against it)"}]
    assert "sides swapped 1" in report.summary()
    # A swapped pair goes on to the later rules as swapped: here it repeats the first pair.
    near = Cleaner(CleaningSettings(), "en", "it")
    near.judge(KEPT)
    assert near.judge((KEPT[1], KEPT[0])).reason == "near_duplicate" and near.report.swapped == 0
    assert Cleaner(CleaningSettings(swap_sides=False), "en", "it").judge((KEPT[1], KEPT[0])).reason == "language"


def test_short_sentences_need_a_confident_verdict() -> None:
    """Short tatoeba pairs that py3langid gets wrong without a threshold (docs/cleaning.md) are kept."""
    short = [("Use a calculator.", "Usa una calcolatrice."), ("Quiet!", "Silenzio!"), ("Jinx!", "Uccello del "
             "malaugurio!"), ("Do you hate whiskey?", "Odia il whiskey?"), ("Today is October 20th.", "Oggi è il 20 "
             "ottobre.")]
    cleaner = Cleaner(CleaningSettings(), "en", "it")
    assert [cleaner.judge(pair) for pair in short] == short
    eager = Cleaner(CleaningSettings(langid_pair_threshold=0.5, langid_other_threshold=0.5), "en", "it")
    assert all(isinstance(eager.judge(pair), Removal) for pair in short[:2])


def test_near_duplicates_keep_the_first_and_digits_matter() -> None:
    cleaner = Cleaner(CleaningSettings(), "en", "it")
    pairs = [("Let's have lunch.", "Pranziamo."), ("Let's  have LUNCH!", "Pranziamo!"),
             ("I was born in 1990.", "Sono nato nel 1990."), ("I was born in 1991.", "Sono nato nel 1991.")]
    assert list(cleaner.clean(pairs)) == [pairs[0], pairs[2], pairs[3]]
    assert cleaner.report.removed == {"near_duplicate": 1} and cleaner.report.samples["near_duplicate"][0]["row"] == 1
    assert near_duplicate_key("Let's  have LUNCH!") == "letshavelunch"


def test_kept_pairs_come_out_nfc() -> None:
    decomposed = ("The coffee is hot.", unicodedata.normalize("NFD", "Il caffè è caldo."))
    cleaner = Cleaner(CleaningSettings(), "en", "it")
    assert [list(batch) for batch in cleaner.clean_batches([[decomposed]])] == [[("The coffee is hot.",
                                                                                   "Il caffè è caldo.")]]
    assert cleaner.report.normalized == 1


def test_mark_keeps_every_row_and_says_which_are_kept() -> None:
    decomposed = unicodedata.normalize("NFD", "Il caffè è caldo.")
    pairs = [("The coffee is hot.", decomposed), ("Tom.", "Tom."), ("The coffee is hot!", decomposed)]
    written, kept = Cleaner(CleaningSettings(), "en", "it").mark(pairs)
    assert written == [("The coffee is hot.", "Il caffè è caldo."), ("Tom.", "Tom."), pairs[2]]
    assert kept.tolist() == [True, False, False]


def test_samples_are_bounded_seeded_and_in_row_order() -> None:
    copies = [(f"Copy number {n}.", f"Copy number {n}.") for n in range(50)]

    def samples(seed: int) -> list[int]:
        cleaner = Cleaner(CleaningSettings(), "en", "it", samples_per_reason=3, seed=seed)
        assert list(cleaner.clean(copies)) == []
        assert cleaner.report.removed == {"copy": 50}
        return [sample["row"] for sample in cleaner.report.as_dict()["samples"]["copy"]]

    assert len(samples(0)) == 3 and samples(0) == sorted(samples(0)) == samples(0)
    assert samples(0) != [0, 1, 2]  # a uniform sample, not the first three
    report = Cleaner(CleaningSettings(), "en", "it").report
    assert json.loads(json.dumps(report.as_dict()))["settings"] == CleaningSettings().describe()


def test_a_lone_surrogate_is_removed_and_its_sample_can_be_written() -> None:
    cleaner = Cleaner(CleaningSettings(), "en", "it")
    assert cleaner.judge(("Bad \ud800 text here.", "Testo \ud800 sbagliato.")).reason == "bad_characters"
    json.dumps(cleaner.report.as_dict(), ensure_ascii=False).encode("utf-8")


def test_report_lines_and_scalars() -> None:
    cleaner = Cleaner(CleaningSettings(), "en", "xx")
    list(cleaner.clean([KEPT, ("Tom.", "Tom.")]))
    report = cleaner.report
    assert report.summary() == ("cleaning en-xx: kept 1 of 2 pairs, removed 1 (1 copy), sides swapped 0, "
                                "NFC-normalised 0; "
                                "not judged: script of xx (not in cleaning.SCRIPTS); "
                                "not judged: language xx (not one of py3langid's)")
    rules_only = {"corpus": "data/first", "rules": {**report.as_dict(), "swapped": 3}, "scoring": None}
    scored = {"scored": 10, "keep": 0.5, "kept": 5, "cut": 1.25, "worst": []}
    both = {"corpus": "second.tsv.gz", "rules": report.as_dict(), "scoring": scored}
    assert report_line(both) == f"second: {report.summary()}; scoring by dual conditional cross-entropy kept the " \
                                "best 5 of 10 (50%), scores up to 1.250"
    # seen: what the rules (else scoring) were asked about; kept: what is left after both
    assert cleaning_scalars([rules_only, both, {"corpus": "third", "rules": None, "scoring": scored}]) == \
        {"seen": 2 + 2 + 10, "kept": 1 + 5 + 5, "swapped": 3, **{reason: 2 * (reason == "copy") for reason in REASONS},
         "score": 5 + 5}


def test_the_store_description_names_the_scoring_models_by_content(tmp_path: Path) -> None:
    """A text store's key and a checkpoint hold what cleaning does: the rules' settings or False,
    and the scoring models' sha256 (a copy elsewhere is the same model) with the share kept."""
    forward, backward = tmp_path / "forward.pt", tmp_path / "backward.pt"
    forward.write_bytes(b"one model")
    backward.write_bytes(b"another model")
    config = {**get_config(), "clean_score_forward": str(forward), "clean_score_backward": str(backward)}
    described = cleaning_description(config)
    assert described["rules"] == CleaningSettings().describe() and described["scoring"]["keep"] == 0.9
    assert cleaning_description(get_config()) == {"rules": CleaningSettings().describe(), "scoring": False}
    assert cleaning_description({**get_config(), "clean": False}) == NOT_CLEANED
    moved = tmp_path / "elsewhere.pt"
    forward.rename(moved)
    assert cleaning_description({**config, "clean_score_forward": str(moved)}) == described
    moved.write_bytes(b"one model, trained further")
    retrained = cleaning_description({**config, "clean_score_forward": str(moved), "clean_max_chars": 500})
    assert cleaning_changes(described, retrained) == \
        f"rules max_chars 1000 -> 500, scoring forward {described['scoring']['forward'][:12]}... -> " \
        f"{retrained['scoring']['forward'][:12]}..."
    assert cleaning_changes(NOT_CLEANED, described) == "rules off -> on, scoring off -> on"
    with pytest.raises(DataError, match=f"--clean_score_forward {forward}: cannot read it"):
        cleaning_description(config)


@pytest.mark.parametrize("name", [field.name for field in dataclasses.fields(CleaningSettings)])
def test_the_description_changes_with_every_setting(name: str) -> None:
    default = getattr(CleaningSettings(), name)
    changed = (not default) if isinstance(default, bool) else (0 if default else 1)
    described = CleaningSettings(**{name: changed}).describe()
    assert described != CleaningSettings().describe() and described[name] == changed


def test_settings_from_config_reads_the_clean_keys() -> None:
    assert settings_from_config({f"clean_{field.name}": getattr(CleaningSettings(), field.name)
                                 for field in dataclasses.fields(CleaningSettings)}) == CleaningSettings()


def test_the_description_names_the_rules_and_the_identifier() -> None:
    described = CleaningSettings().describe()
    assert described["version"] == 2 and described["langid"] == "py3langid 0.4.0"
    assert "langid" not in CleaningSettings(langid_pair_threshold=0, langid_other_threshold=0).describe()


@pytest.mark.parametrize("settings", [{"max_chars": -1}, {"max_length_ratio": 0.5}, {"script_min_share": 1.5},
                                      {"langid_pair_threshold": -0.1}])
def test_settings_out_of_range_are_refused(settings: dict) -> None:
    with pytest.raises(ValueError, match=next(iter(settings))):
        CleaningSettings(**settings)


def test_tatoeba_clean_pairs_lose_only_a_near_duplicate() -> None:
    """The defaults against the 15,359 training pairs shipped in data/tatoeba (docs/cleaning.md)."""
    lines = (ROOT / "data" / "tatoeba" / "en-it" / "train.jsonl").read_text(encoding="utf-8").splitlines()
    pairs = [(row["translation"]["en"], row["translation"]["it"]) for row in map(json.loads, lines)]
    cleaner = Cleaner(CleaningSettings(), "en", "it")
    kept = list(cleaner.clean(pairs))
    assert len(pairs) == 15_359 and len(kept) == 15_358
    assert cleaner.report.samples == {"near_duplicate": [{"row": 8954, "source": "Let's have lunch!",
                                                          "target": "Pranziamo!", "detail": "repeats an earlier pair"}]}


# ---------------------------------------------------------------------------- scoring by models

def test_keep_best_keeps_the_lowest_scores_in_order() -> None:
    scores = np.array([3.0, 1.0, 2.0, 1.0, 5.0])
    assert keep_best(scores, 0.6).tolist() == [1, 2, 3]
    assert keep_best(scores, 0.2).tolist() == [1]  # a tie goes to the earlier pair
    assert keep_best(scores, 0.5).tolist() == [1, 2, 3]  # 2.5 pairs, rounded up
    assert len(keep_best(np.zeros(100), 0.07)) == 7
    assert keep_best(scores, 1.0).tolist() == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError, match="fraction"):
        keep_best(scores, 0.0)
