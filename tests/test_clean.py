"""clean.py: the cleaning alone on a corpus, reported by reason with samples, and bad input in one line."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import clean
from config import parse_config
from nmt.corpora.store import text_store
from synthetic_data import write_hub_dataset

GOOD = [("The station is on the other side of the river.", "La stazione è dall'altra parte del fiume."),
        ("I would like a cup of coffee, please.", "Vorrei una tazza di caffè, per favore."),
        ("We are going to the sea tomorrow morning.", "Domani mattina andiamo al mare.")]


REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def in_tmp_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """clean.py builds the text stores train.py would, under store_folder (stores/ of the working folder)."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    swapped = ("Il treno parte alle nove di sera, ma io resto a casa.",
               "The train leaves at nine in the evening, but I stay at home.")
    train = GOOD + [("Tom is here.", "Tom is here."), (GOOD[1][1], GOOD[2][1]), GOOD[0], swapped]
    return write_hub_dataset(tmp_path / "data", {"train": train, "test": GOOD[:1]})


def test_reports_each_reason_with_samples(corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    report = tmp_path / "report.json"
    assert clean.main(["--datasource", str(corpus), "--report", str(report)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "data en-it train: kept 4 of 7 pairs (57.14%), sides swapped 1, NFC-normalised 0"
    assert out[1:4] == ["  removed copy                   1  (14.29%)",
                        "  removed language               1  (14.29%)",
                        "  removed near_duplicate         1  (14.29%)"]
    assert "    row 5: 'Vorrei una tazza di caffè, per favore.' ||| 'Domani mattina andiamo al mare.'  " \
           "[source reads as it (1.00 against en)]" in out
    assert "    row 7: 'Il treno parte alle nove di sera, ma io resto a casa.' ||| 'The train leaves at nine in the " \
           "evening, but I stay at home.'  [source reads as it (1.00 against en), target reads as en (1.00 against " \
           "it)]" in out
    written = json.loads(report.read_text(encoding="utf-8"))
    assert [entry["removed"] for entry in written] == [{"copy": 1, "language": 1, "near_duplicate": 1}]
    assert written[0]["samples"]["copy"] == [{"row": 3, "source": "Tom is here.", "target": "Tom is here.",
                                              "detail": "source equals target"}]


def test_a_threshold_turns_a_rule_off(corpus: Path, capsys: pytest.CaptureFixture) -> None:
    assert clean.main(["--datasource", str(corpus), "--clean_copies", "false", "--clean_near_duplicates", "no",
                       "--split", "test"]) == 0
    assert capsys.readouterr().out == "data en-it test: kept 1 of 1 pairs (100.00%), sides swapped 0, NFC-normalised 0\n"


def exit_code(argv: list[str]) -> int:
    """clean.main's return value, or the code argparse exits with."""
    try:
        return clean.main(argv)
    except SystemExit as stop:
        return int(stop.code)


@pytest.mark.parametrize("args, code, message", [
    (["--clean_max_length_ratio", "0.5"], 2, "error: --clean_max_length_ratio must be 0 (off) or at least 1, got 0.5"),
    (["--clean_score_forward", "model.pt"], 2, "error: scoring needs a model each way"),
    (["--clean_copies", "maybe"], 2, "error: argument --clean_copies: expected true or false, got 'maybe'"),
    (["--split", "validation"], 1, "error: '{corpus}' has no 'validation' split (found: test, train)"),
])
def test_bad_input_is_one_line(corpus: Path, capsys: pytest.CaptureFixture, args: list[str], code: int,
                               message: str) -> None:
    assert exit_code(["--datasource", str(corpus), *args]) == code
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].split(": ", 1)[1].startswith(message.format(corpus=corpus))  # prog: __main__.py here


def test_scores_the_kept_pairs_with_a_model_each_way(corpus: Path, tmp_path: Path, untrained_checkpoint,
                                                     capsys: pytest.CaptureFixture) -> None:
    forward = untrained_checkpoint(tmp_path / "forward", GOOD, "en", "it")
    backward = untrained_checkpoint(tmp_path / "backward", [(t, s) for s, t in GOOD], "it", "en")
    report = tmp_path / "report.json"
    assert clean.main(["--datasource", str(corpus), "--clean_score_forward", str(forward), "--clean_score_backward",
                       str(backward), "--clean_score_keep", "0.6", "--clean_samples", "2",
                       "--report", str(report)]) == 0
    out = capsys.readouterr().out
    scoring = json.loads(report.read_text(encoding="utf-8"))[0]["scoring"]
    assert (scoring["scored"], scoring["kept"], len(scoring["worst"])) == (4, 3, 2)  # 2.4 pairs, rounded up
    assert {sample["row"] for sample in scoring["worst"]} <= {0, 1, 2, 6}  # the rows the rules kept
    # worst first; the second worst of four is the highest score the best three keep
    assert scoring["worst"][0]["score"] >= scoring["worst"][1]["score"] == scoring["cut"]
    assert f"  scored 4 kept pairs by dual conditional cross-entropy: keeping the best 3 (60%), scores up to " \
           f"{scoring['cut']:.3f}\n" in out
    assert exit_code(["--datasource", str(corpus), "--clean_score_forward", str(backward), "--clean_score_backward",
                      str(forward)]) == 1
    assert capsys.readouterr().err.splitlines()[-1] == \
        f"clean.py: error: cannot score {str(corpus)!r} with --clean_score_forward and --clean_score_backward: the " \
        f"forward model translates it into en, not en into it"


def test_cleans_the_training_pairs_training_cleans(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A train-only corpus of 60 pairs: train.py carves 3 validation and 3 test pairs (rows 7, 17, 24;
    18, 28, 55 with the default seed), then cleans the 54 left, and so does clean.py (it cleaned all
    60): of two copies, the one carved into validation is not counted; the store it built is the one
    train.py opens."""
    pairs = [(f"I have {i} red apples in my bag.", f"Ho {i} mele rosse nella borsa.") for i in range(60)]
    pairs[7], pairs[9] = ("Tom is here.", "Tom is here."), ("Mary is here.", "Mary is here.")
    corpus = write_hub_dataset(tmp_path / "data", {"train": pairs})
    assert clean.main(["--datasource", str(corpus)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "data en-it train: kept 53 of 54 pairs (98.15%), sides swapped 0, NFC-normalised 0",
        "  removed copy                   1  (1.85%)", "  copy (sample of 1; row numbers from 1):",
        "    row 10: 'Mary is here.' ||| 'Mary is here.'  [source equals target]"]
    store = text_store(parse_config(["--datasource", str(corpus)]))
    assert (store.size("validation"), store.size("test"), store.size("train")) == (3, 3, 53)
    assert pairs[7] in store.pairs("validation") and pairs[7] not in store.pairs("train")


def test_the_help_example_names_data_a_clone_has() -> None:
    example = re.search(r"`python clean\.py --datasource (\S+)`", clean.argument_parser().description).group(1)
    assert (REPO / example).is_dir() and REPO in (REPO / example).resolve().parents, example
