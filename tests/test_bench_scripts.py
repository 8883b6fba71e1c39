"""benchmarks/bench_data.py and benchmarks/bench_translate.py, on small data: the corpus bench_data
writes is what it says (opus_books-shaped, train only, distinct pairs), and a bench_translate child
measures and reports what the engine translated."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import torch

from benchmarks import bench_data, bench_translate
from config import get_config
from sources import open_source, read_pairs
from synthetic_data import synthetic_pairs, write_hub_dataset
from translator import DecodingOptions, TorchTranslator


def test_bench_data_writes_an_opus_books_shaped_corpus(tmp_path: Path) -> None:
    source = write_hub_dataset(tmp_path / "source", {"train": synthetic_pairs(300, 1)})
    corpus = bench_data.write_corpus(tmp_path / "corpus", 2500, source)
    opened = open_source(str(corpus), "en-it")
    assert opened.splits == ["train"]
    assert [p.suffix for p in (corpus / "en-it").iterdir()] == [".parquet"]
    pairs = [pair for batch in read_pairs(opened, "train", "en", "it") for pair in batch]
    assert len(pairs) == 2500 and len(set(pairs)) > 2400
    words = [len(s.split()) for s, _ in pairs]
    assert 2 * 2 <= min(words) and sum(words) / len(words) > 2 * sum(len(s.split()) for s, _ in
                                                                     synthetic_pairs(300, 1)) / 300


def test_bench_translate_child_reports_its_translations(trained_run, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture) -> None:
    sources = [s for s, _ in synthetic_pairs(80, 3)]
    (tmp_path / "sources.json").write_text(json.dumps(sources), encoding="utf-8")
    path, _ = trained_run.latest()
    args = argparse.Namespace(checkpoint=path, model_dir=None, beam=2, sources=tmp_path / "sources.json")
    config = dict(get_config(), model_folder=str(trained_run.model_folder))
    assert bench_translate.child(args, config) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    translator = TorchTranslator.load(path, trained_run.folder, torch.device("cpu"))
    assert report["translations"] == translator.translate_best(sources, DecodingOptions.from_config(config,
                                                                                                 beam_size=2))
    assert report["sentences_per_s"] == pytest.approx(len(sources) / report["seconds"])
    assert report["peak_rss_gb"] > 0.1 and report["output_tokens"] > len(sources)
