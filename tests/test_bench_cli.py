"""benchmarks/bench_cli.py on the suite's trained run (given a calibrator): it exports the run, runs
translate.py on each engine, and --scores, as whole processes on the split repeated, and reports
their times, the speed-up against its target, the CPU, and that --scores kept the translations."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from benchmarks import bench_cli
from conftest import GOOD_CALIBRATOR
from nmt.inference.ct2_model import cpu_info


def test_bench_cli_times_both_engines_as_whole_processes(trained_run, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture) -> None:
    folder = tmp_path / "weights" / trained_run.folder.name
    shutil.copytree(trained_run.folder, folder, ignore=shutil.ignore_patterns("*.lock"))
    (folder / "confidence.json").write_text(json.dumps(GOOD_CALIBRATOR), encoding="utf-8")
    assert bench_cli.main(["--datasource", str(trained_run.datasource), "--model_folder", str(folder.parent),
                           "--repeat", "2", "--rounds", "1", "--quantization", "float32", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    rows = result["rows"]
    assert list(rows) == ["pytorch", "ctranslate2", "ctranslate2 --scores"]
    assert all(row["wall_s"] > 0 and row["cpu_s"] > 0 for row in rows.values())
    assert rows["ctranslate2 --scores"]["command"].endswith("--split_sentences false --scores < INPUT")
    assert result["input"].endswith("test x2 (32 lines)") and result["quantization"] == "float32"
    assert result["scores_keep_translations"] is True
    [speedup, scores] = result["targets"].values()
    assert speedup["value"] == rows["pytorch"]["wall_s"] / rows["ctranslate2"]["wall_s"]
    assert speedup["met"] == (speedup["value"] >= 3) and scores["target"] == "information"
    info = cpu_info()
    assert result["cpu"] == {"model_name": info.model or info.vendor or "unknown", "numbers": info.numbers,
                             "family": info.family, "avx512f": "avx512f" in info.flags, "avx2": "avx2" in info.flags}
