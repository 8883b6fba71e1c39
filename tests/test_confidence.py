"""confidence.py: a calibrator fitted on features against sentence chrF gives probabilities in
[0, 1] that rise with the model's score, round-trips through JSON, refuses data it cannot use;
the report's rank correlation, lowest-decile chrF and calibration error are what they should be."""
from __future__ import annotations

import contextlib
import io
import json
import math
import random
from pathlib import Path

import pytest
import torch
from torch.testing import assert_close

import translate

from nmt.inference.confidence import (CONFIDENCE_FILE, CalibrationError, Calibrator, confidence_report, features,
                                      fit_calibrator, read_calibrator, save_calibrator, sentence_chrfs)


def synthetic(count: int, seed: int) -> tuple[list[list[float]], list[float]]:
    """Hypotheses whose chrF rises with their mean log-probability, with noise."""
    rng = random.Random(seed)
    rows, chrfs = [], []
    for _ in range(count):
        mean = rng.uniform(-2.0, 0.0)
        length = rng.randint(3, 30)
        rows.append(features(mean * length, length, mean - rng.uniform(0.0, 3.0)))
        chrfs.append(min(100.0, max(0.0, 70 + 30 * mean + rng.gauss(0, 12))))
    return rows, chrfs


def test_fitted_probabilities_are_calibrated_and_rise_with_the_score() -> None:
    rows, chrfs = synthetic(400, 0)
    calibrator = fit_calibrator(rows, chrfs, threshold=50.0)
    held_out, held_out_chrfs = synthetic(400, 1)
    probabilities = calibrator.probabilities(held_out)
    assert all(0.0 <= p <= 1.0 for p in probabilities)
    report = confidence_report(probabilities, held_out_chrfs, 50.0)
    assert report["spearman"] > 0.6 and report["calibration_error"] < 0.08
    assert report["lowest_10pct_chrf"] < report["rest_chrf"] - 20
    # Monotone in the model's score, whatever the data said: the two weights are positive.
    assert min(calibrator.weights[:2]) > 0
    scores = [calibrator.probability(log_prob, 10, -4.0) for log_prob in (-30.0, -10.0, -5.0, -1.0, 0.0)]
    assert scores == sorted(scores) and scores[0] < scores[-1]


def test_weights_stay_positive_when_the_data_points_the_other_way() -> None:
    rows, chrfs = synthetic(200, 2)
    calibrator = fit_calibrator(rows, [100.0 - c for c in chrfs], threshold=50.0)  # worse when more likely
    assert min(calibrator.weights[:2]) > 0
    assert calibrator.probability(-1.0, 10, -1.0) >= calibrator.probability(-20.0, 10, -1.0)


def test_a_calibrator_is_plain_json_data() -> None:
    rows, chrfs = synthetic(100, 3)
    calibrator = fit_calibrator(rows, chrfs, threshold=45.0)
    stored = json.loads(json.dumps(calibrator.to_dict()))
    assert Calibrator.from_dict(stored) == calibrator and stored["threshold"] == 45.0 and stored["sentences"] == 100
    assert fit_calibrator(rows, chrfs, threshold=45.0) == calibrator  # the same data, the same model
    for broken in ({}, {**stored, "kind": "isotonic"}, {**stored, "weights": [1.0]}, {**stored, "scale": [0, 1, 1]},
                   {**stored, "weights": [-1.0, 1.0, 1.0]}, {**stored, "bias": "nan"}, None,
                   {**stored, "sentences": 1e400}, {**stored, "threshold": math.inf}):
        with pytest.raises(CalibrationError, match="not a stored confidence calibrator") as error:
            Calibrator.from_dict(broken)
        assert "\n" not in str(error.value)
    with pytest.raises(CalibrationError, match="not a stored confidence calibrator: it has no 'bias'"):
        Calibrator.from_dict({key: value for key, value in stored.items() if key != "bias"})


def test_a_stored_calibrator_is_read_with_or_without_a_byte_order_mark(tmp_path: Path) -> None:
    rows, chrfs = synthetic(100, 3)
    calibrator = fit_calibrator(rows, chrfs, threshold=45.0)
    save_calibrator(tmp_path, calibrator, "ckpt_00000001.pt")
    assert read_calibrator(tmp_path) == calibrator and read_calibrator(tmp_path / "none") is None
    path = tmp_path / CONFIDENCE_FILE
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())  # saved again by a Windows editor
    assert read_calibrator(tmp_path) == calibrator
    path.write_bytes(path.read_bytes()[:40])
    with pytest.raises(CalibrationError, match=f"^the confidence calibrator {path} is not valid JSON: [^\n]+$"):
        read_calibrator(tmp_path)


def test_data_a_calibrator_cannot_be_fitted_on_is_one_line() -> None:
    rows, chrfs = synthetic(50, 4)
    for arguments, message in (((rows[:5], chrfs[:5]), "at least 20 sentences"), ((rows, chrfs[:3]), "50 feature rows"),
                               ((rows, [90.0] * 50), "every one of the 50 sentences is at or above chrF 50")):
        with pytest.raises(CalibrationError, match=message):
            fit_calibrator(*arguments, threshold=50.0)


def test_report_on_hand_worked_numbers() -> None:
    probabilities = [0.05, 0.15, 0.25, 0.35, 0.45, 0.55, 0.65, 0.75, 0.85, 0.95]
    chrfs = [10.0, 20.0, 30.0, 40.0, 45.0, 60.0, 70.0, 80.0, 90.0, 100.0]
    report = confidence_report(probabilities, chrfs, 50.0)
    assert report["spearman"] == pytest.approx(1.0)
    assert report["lowest_10pct_chrf"] == 10.0 and report["rest_chrf"] == pytest.approx(535.0 / 9)
    # Each bin holds one sentence: |p - good| is p below chrF 50, 1 - p above.
    assert report["calibration_error"] == pytest.approx((0.05 + 0.15 + 0.25 + 0.35 + 0.45) / 10 * 2)
    assert confidence_report(probabilities, chrfs[::-1], 50.0)["spearman"] == pytest.approx(-1.0)
    tied = confidence_report([0.5] * 10, chrfs, 50.0)
    assert tied["spearman"] == 0.0


def test_features_and_sentence_chrf() -> None:
    assert_close(torch.tensor(features(-6.0, 3, -4.0)), torch.tensor([-2.0, -4.0, math.log(3)]))
    assert sentence_chrfs(["il gatto nero"], [["il gatto nero"]]) == [100.0]
    best, = sentence_chrfs(["il gatto nero"], [["un cane", "il gatto nero"]])
    assert best == 100.0


# ---------------------------------------------------------------------------- stored with a run, used

def test_fitted_at_the_end_of_training_and_used_by_translate_the_api_and_an_export(tmp_path) -> None:
    """A run whose validation split holds known sentences and ones with nonsense references: the
    calibrator fitted at its end is stored beside its checkpoints; translate.py --scores prints each
    sentence's confidence, the API returns it per sentence, and an export carries it to the
    CTranslate2 engine, which gives the same values."""
    import export
    from benchmarks.loadtest import ServerProcess
    from conftest import train_in_process
    from nmt.inference.confidence import CONFIDENCE_FILE, read_calibrator
    from synthetic_data import synthetic_pairs, write_hub_dataset
    from test_serve import call

    known = synthetic_pairs(200, 1)
    nonsense = [(source, "Zq xw vv kk.") for source, _ in synthetic_pairs(15, 5)]
    data = write_hub_dataset(tmp_path / "data", {"train": known, "validation": known[:15] + nonsense,
                                                 "test": synthetic_pairs(16, 3)})
    args = ["--datasource", str(data), "--preset", "tiny", "--batch_tokens", "256", "--lr", "1e-2", "--num_epochs",
            "100", "--max_steps", "40", "--model_folder", str(tmp_path / "weights"), "--runs_folder",
            str(tmp_path / "runs"), "--store_folder", str(tmp_path / "stores"), "--clean", "false",
            "--confidence_chrf_threshold", "30"]
    run = train_in_process(args)
    assert run.code == 0 and "confidence calibrator of" in run.stderr, run.stderr
    folder = tmp_path / "weights" / "data_en-it"
    calibrator = read_calibrator(folder)
    assert (folder / CONFIDENCE_FILE).exists() and calibrator.sentences == 30
    # monotone in the model's score: at one length, a likelier translation is never less trusted
    assert calibrator.probabilities([[-x / 10, -x / 5, 1.5] for x in range(20, 0, -1)]) == \
        sorted(calibrator.probabilities([[-x / 10, -x / 5, 1.5] for x in range(20, 0, -1)]))

    model = ["--datasource", str(data), "--model_folder", str(tmp_path / "weights")]
    text = "The cat sees the dog. The red house."
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert translate.main(model + ["--scores", text]) == 0
    rows = [line.split("\t") for line in out.getvalue().splitlines()]
    assert [row[0] for row in rows] == ["1.1", "1.2"] and all(0 <= float(row[1]) <= 1 for row in rows)

    with ServerProcess(model) as server:
        status, answer = call(server.port, "POST", "/translate", {"text": text}, headers=None)
    assert status == 200 and [s["translation"] for s in answer["sentences"]] == [row[2] for row in rows]
    assert [round(s["confidence"], 3) for s in answer["sentences"]] == [float(row[1]) for row in rows]

    exported = tmp_path / "ct2"
    assert export.main(model + ["--quantization", "float32", "--output", str(exported)]) == 0
    assert json.loads((exported / "project.json").read_text())["confidence"] == calibrator.to_dict()
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert translate.main(model + ["--engine", "ctranslate2", "--model_dir", str(exported), "--scores",
                                       "--beam_size", "1", text]) == 0
    greedy = io.StringIO()
    with contextlib.redirect_stdout(greedy), contextlib.redirect_stderr(io.StringIO()):
        assert translate.main(model + ["--scores", "--beam_size", "1", text]) == 0
    ct2_rows, torch_rows = [[line.split("\t") for line in o.getvalue().splitlines()] for o in (out, greedy)]
    assert [row[2] for row in ct2_rows] == [row[2] for row in torch_rows]
    assert [float(row[1]) for row in ct2_rows] == pytest.approx([float(row[1]) for row in torch_rows], abs=0.002)
