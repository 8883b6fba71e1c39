"""benchmarks/bench_gpu.py and news_workload.py: the news lengths it trains on come from the stored
histogram (a few kB, fitting seq_len), and a tiny run on the CPU reports every figure of a leg:
the captured step (through StandInGraphs), the eager one and torch.nn.Transformer, eager and compiled."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from benchmarks import bench_gpu, news_workload
from synthetic_data import synthetic_pairs, write_hub_dataset


def test_the_histogram_is_small_and_its_lengths_fit_seq_len() -> None:
    histogram = json.loads(news_workload.HISTOGRAM.read_text(encoding="utf-8"))
    assert news_workload.HISTOGRAM.stat().st_size < 8000 and "newstest2009" in histogram["source"]
    source, target = news_workload.news_lengths(20_000, 0, 128)
    assert source.min() >= 1 and source.max() + 2 <= 128 and target.max() + 1 <= 128
    assert abs(source.mean() - histogram["mean_tokens"][0]) < 1.0
    assert abs(target.mean() - histogram["mean_tokens"][1]) < 1.0
    short = news_workload.news_lengths(5_000, 0, 128, max_tokens=64)
    assert short[0].max() + 2 <= 64 and short[1].max() + 1 <= 64
    dataset = news_workload.news_dataset(300, 1, 128, vocab=320)
    assert len(dataset) == 300 and 4 <= dataset.src_ids.min() and dataset.tgt_ids.max() < 320


def test_the_histogram_is_derived_from_a_folders_lengths(tmp_path: Path) -> None:
    pairs = synthetic_pairs(40, 1)
    folder = write_hub_dataset(tmp_path / "news", {"test": pairs})
    histogram = news_workload.derive(folder)
    assert sum(count for _, _, count in histogram["cells"]) == 40
    assert histogram["cell_tokens"] == news_workload.CELL and len(histogram["mean_tokens"]) == 2


def test_a_tiny_run_reports_every_figure_of_a_leg(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """(torch.nn.Transformer's compiled row is left out: dynamo alone takes seconds on a CPU.)"""
    out = tmp_path / "bench.json"
    assert bench_gpu.main(["--device", "cpu", "--tiny", "--steps", "2", "--rows", "base 32k", "--variants", "captured",
                           "eager", "nn.Transformer", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    rows = {row["variant"]: row for row in result["rows"]}
    assert set(rows) == {"captured", "eager", "nn.Transformer"}
    for row in rows.values():
        assert row["steps"] == 2 and row["tokens_per_s"] > 0 and row["ms_per_step"] > 0 and row["skipped_steps"] == 0
        assert 0 <= row["padding"] < 1 and row["mfu_measured"] > 0 and row["mfu_spec"] is None  # no datasheet for a CPU
    assert rows["captured"]["batch_shapes"] <= 27 and rows["eager"]["batch_shapes"] == "exact widths"
    assert rows["captured"]["padding"] > rows["eager"]["padding"]  # buckets pad more than exact widths
    assert all(floor["operations"] > 100 and floor["ms"] > 0 for floor in result["host_floor"].values())
    assert [form["form"] for form in result["loss"]["forms"]] == ["chunked (loss.loss_sum)", "fused (F.cross_entropy)"]
    assert len(result["targets"]) == 5 and result["targets"][1]["value"] is not None
    assert all(target["met"] is None for target in result["targets"])  # a CPU's figures judge no GPU target
    table = capsys.readouterr().out
    assert "TINY sizes" in table and "targets:" in table and table.count("base 32k") >= 3


def test_the_tatoeba_leg_reads_the_shipped_data() -> None:
    dataset, vocab = bench_gpu.leg_data(bench_gpu.LEGS["tatoeba base 4,096"], True, 2, 0)
    assert len(dataset) > 400 and vocab > 100 and np.median(dataset.src_lens) < 20  # tatoeba's short sentences
