"""loadtest.py: a short run against the tiny model on loopback answers every request, and its
report adds up; percentiles by nearest rank."""
from __future__ import annotations

import json

import pytest

import loadtest


def test_report_adds_up(trained_run, capsys: pytest.CaptureFixture) -> None:
    code = loadtest.main(["--datasource", str(trained_run.datasource), "--model_folder", str(trained_run.model_folder),
                          "--clients", "4", "--requests", "12", "--sentences_per_request", "3", "--time_limit", "60",
                          "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    [row] = json.loads(captured.out)
    assert row["engine"] == "pytorch" and row["requests"] == 12
    assert row["answered"] == 12 and row["errors"] == 0 and row["unsent"] == 0
    assert row["sentences"] == 12 * 3
    assert 0 < row["p50_ms"] <= row["p99_ms"] <= 1000 * row["seconds"]
    assert row["sentences_per_second"] == pytest.approx(row["sentences"] / row["seconds"], rel=0.01)
    assert "serving" in captured.err and "Traceback" not in captured.err


def test_table_lists_each_engine() -> None:
    row = {"engine": "pytorch", "requests": 3, "answered": 3, "errors": 0, "unsent": 0, "p50_ms": 1.5,
           "p99_ms": 2.0, "sentences_per_second": 10.0, "seconds": 0.9}
    lines = loadtest.table([row, dict(row, engine="ctranslate2", p50_ms=None)]).splitlines()
    assert lines[0].split() == ["engine", "requests", "answered", "errors", "unsent", "p50", "ms", "p99", "ms",
                                "sentences/s", "seconds"]
    assert lines[1].split() == ["pytorch", "3", "3", "0", "0", "1.5", "2.0", "10.0", "0.9"]
    assert lines[2].split()[0] == "ctranslate2" and lines[2].split()[5] == "-"


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert loadtest.percentile(values, 50) == 50 and loadtest.percentile(values, 99) == 99
    assert loadtest.percentile([3.0, 1.0, 2.0], 50) == 2 and loadtest.percentile([7.0], 99) == 7
