"""benchmarks/bench_data.py, bench_translate.py, bench_segmentation.py, bench_glossary.py and
bench_paragraphs.py, on small data: the corpus bench_data writes is what it says (opus_books-shaped,
train only, distinct pairs), a bench_translate child measures and reports what the engine
translated, bench_translate times every set-up `auto` chooses among and misses its target when
auto's is 10% below the fastest, bench_segmentation counts boundaries as its docstring defines
them, bench_glossary finds word pairs, takes constraints from the references and decodes as the
translator does, bench_paragraphs scores the three ways it translates paragraphs against the
joined references, and bench_new_shapes times steps of shapes it has not seen before."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from benchmarks import (bench_data, bench_glossary, bench_new_shapes, bench_paragraphs, bench_segmentation,
                        bench_translate)
from config import Resolved, get_config
from nmt.inference.ct2_model import CpuInfo
from nmt.inference.scoring import corpus_scores
from nmt.corpora.sources import open_source, read_pairs
from synthetic_data import synthetic_pairs, write_hub_dataset
from test_ct2_model import GRAVITON, ZEN3, ZEN4
from nmt.inference.translator import DecodingOptions, TorchTranslator


def test_bench_data_writes_an_opus_books_shaped_corpus(tmp_path: Path) -> None:
    source = write_hub_dataset(tmp_path / "source", {"train": synthetic_pairs(300, 1)})
    corpus = bench_data.write_corpus(tmp_path / "corpus", 2500, source)
    opened = open_source(str(corpus), "en", "it")
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
    assert bench_translate.child(args, Resolved(config, set(), set())) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    translator = TorchTranslator.load(path, trained_run.folder, torch.device("cpu"))
    assert report["translations"] == translator.translate_best(sources, DecodingOptions.from_config(config,
                                                                                                 beam_size=2))
    assert report["sentences_per_s"] == pytest.approx(len(sources) / report["seconds"])
    assert report["peak_rss_gb"] > 0.1 and report["output_tokens"] > len(sources)


def test_bench_segmentation_counts_boundaries_as_it_defines_them(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture) -> None:
    groups = [["It rains.", "We stay home. We read.", "Headline without a stop"], ["Fine.", "Good."]]
    # Paragraph 1: the join after "It rains." found, one split inside line 2 (also made on the line
    # alone), the join after it missed, and a split made only in the paragraph; paragraph 2 right.
    fake = {"It rains. We stay home. We read. Headline without a stop": [10, 24, 30], "Fine. Good.": [6],
            "We stay home. We read.": [14]}
    row = bench_segmentation.score(groups, lambda text: fake.get(text, []), errors=0)
    assert {k: row[k] for k in ("joins", "missed", "unmarked", "missed_unmarked", "inside", "inside_alone")} == {
        "joins": 3, "missed": 1, "unmarked": 0, "missed_unmarked": 0, "inside": 2, "inside_alone": 1}
    assert row["precision"] == 2 / 4 and row["recall"] == 2 / 3 and row["accuracy"] == 2 / 5
    assert row["join_accuracy"] == 2 / 4 and row["exact_paragraphs"] == 1 / 2
    sentences = ["Mr. Smith paid 3.14 dollars.", "Dr. Brown came, e.g. at noon.", "It rained.", "We stayed."] * 3
    data = write_hub_dataset(tmp_path / "set", {"test": [(s, "x") for s in sentences]})
    assert bench_segmentation.main(["--data", f"{data}:test", "--libraries", "sentencex", "--json"]) == 0
    found = json.loads(capsys.readouterr().out)["set:test"]["sentencex"]
    assert found["joins"] == found["sentences"] - found["paragraphs"] > 5 and found["accuracy"] == 1.0
    # --language it: the Italian side, with Italian rules ("sig." and "dott." end no sentence there,
    # they do under English rules); the English side, two sentences a line, would split inside lines.
    italian = ["Il sig. Rossi pagò 3,14 euro.", "Il dott. Bianchi venne a mezzogiorno.", "Pioveva.", "Restammo."] * 3
    data = write_hub_dataset(tmp_path / "it", {"test": [("One. Two.", t) for t in italian]})
    assert bench_segmentation.main(["--data", f"{data}:test", "--language", "it", "--libraries", "sentencex",
                                    "--json"]) == 0
    found = json.loads(capsys.readouterr().out)["it:test"]["sentencex"]
    assert found["joins"] > 5 and found["inside"] == 0 and found["accuracy"] == 1.0


def test_noisy_corpus_adds_a_seeded_share_of_noise_by_kind_to_every_clean_pair(tmp_path: Path,
                                                                             capsys: pytest.CaptureFixture) -> None:
    from benchmarks import noisy_corpus

    pairs = synthetic_pairs(100, 1)
    source = write_hub_dataset(tmp_path / "source", {"train": pairs, "validation": synthetic_pairs(5, 2),
                                                     "test": synthetic_pairs(5, 3)})
    assert noisy_corpus.main(["--output", str(tmp_path / "noisy"), "--source", str(source), "--seed", "3",
                              "--fraction", "0.5", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    kinds = json.loads((tmp_path / "noisy" / "noise.json").read_text())["rows"]
    assert {kind: len(rows) for kind, rows in kinds.items()} == dict.fromkeys(noisy_corpus.KINDS, 10)
    noisy = [pair for batch in read_pairs(open_source(str(tmp_path / "noisy"), "en", "it"), "train", "en", "it")
             for pair in batch]
    kind_of = {row: kind for kind, rows in kinds.items() for row in rows}
    assert len(noisy) == 150 and [pair for row, pair in enumerate(noisy) if row not in kind_of] == pairs
    sources, targets = {s for s, _ in pairs}, {t for _, t in pairs}
    for row, (new_src, new_tgt) in enumerate(noisy):
        expected = {None: True, "copy": new_src == new_tgt and new_src in sources,
                    "swapped": (new_tgt, new_src) in set(pairs),
                    "misaligned": new_src in sources and new_tgt in targets and (new_src, new_tgt) not in set(pairs),
                    "target_both": new_src in targets and new_tgt in targets,
                    "boilerplate": new_src not in sources}
        assert expected[kind_of.get(row)], (row, kind_of.get(row), new_src, new_tgt)
    backward = [pair for batch in read_pairs(open_source(str(tmp_path / "noisy"), "it", "en"), "train", "it", "en")
                for pair in batch]
    assert backward == [(t, s) for s, t in noisy]  # the scoring recipe's backward model trains on it-en
    for split in ("validation", "test"):
        assert (tmp_path / "noisy" / "en-it" / f"{split}.jsonl").read_bytes() == \
               (source / "en-it" / f"{split}.jsonl").read_bytes()
    table = result["kinds"]
    assert table["clean"]["rows"] == 100 and table["copy"] == {"rows": 10, "removed": 10, "swapped": 0,
                                                                "by_rule": {"copy": 10}}
    removed = sum(entry["removed"] for entry in table.values())
    assert result["precision"] == (removed - table["clean"]["removed"]) / removed
    again = ["--output", str(tmp_path / "noisy"), "--source", str(source), "--fraction", "0.5", "--json"]
    assert noisy_corpus.main(again + ["--seed", "3"]) == 0  # the folder it wrote, evaluated as it is
    assert json.loads(capsys.readouterr().out) == result
    assert noisy_corpus.main(again + ["--seed", "4"]) == 1
    assert capsys.readouterr().err.endswith("noisy holds the noise of seed 3 and fraction 0.5, not 4 and 0.5\n")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("a user's file")
    assert noisy_corpus.main(["--output", str(tmp_path / "mine"), "--source", str(source)]) == 1
    assert "exists, is not empty and has no noise.json" in capsys.readouterr().err
    assert (tmp_path / "mine" / "notes.txt").read_text() == "a user's file"


def test_bench_glossary_takes_constraints_from_the_references() -> None:
    nouns = {"cat": "gatto", "dog": "cane", "horse": "cavallo", "bird": "uccello", "fish": "pesce", "cow": "mucca"}
    verbs = {"sleeps": "dorme", "eats": "mangia", "runs": "corre", "sings": "canta", "swims": "nuota",
             "waits": "aspetta"}
    pairs = [(f"The {n} {v}.", f"Il {nouns[n]} {verbs[v]}.") for n in nouns for v in verbs]
    associated = bench_glossary.word_list(pairs)
    # A noun meets each verb once in 36 pairs: below the Dice threshold (and MIN_PAIRS).
    assert associated["gatto"] == {"cat": 1.0} and associated["dorme"] == {"sleeps": 1.0}
    found = bench_glossary.sentence_glossary("The cat sleeps.", "Il gatto dorme.", "Il cane dorme.", associated, 3)
    assert found == [("cat", "gatto")]  # "dorme" is in the output already
    assert len(bench_glossary.sentence_glossary("The cat sleeps.", "Il gatto dorme.", "Ciao.", associated, 1)) == 1
    assert bench_glossary.appended("Tom dorme. gatto.", "Tom dorme.", "gatto")
    assert not bench_glossary.appended("Il gatto dorme. Sì.", "Tom dorme.", "gatto")
    assert not bench_glossary.appended("Dorme. Il gatto no.", "Dorme. Tom no.", "gatto")


def test_bench_glossary_decodes_as_the_translator_does(toy_translator) -> None:
    translator = toy_translator.translator()
    sentences = [s for s, _ in toy_translator.pairs(20, seed=5)]
    config = dict(get_config(), eval_batch_size=8)
    found, seconds = bench_glossary.search(translator, sentences, 3, config)
    expected = translator.translate_best(sentences, DecodingOptions.from_config(config, beam_size=3))
    assert [toy_translator.tok_tgt.decode(h[0]) for h in found] == expected and seconds > 0
    # A model whose training picked a repeat ban (here 1: no word twice) is searched under it, as
    # translate.py searches it (no_repeat_ngram_size -1, the default: the model's).
    banned = TorchTranslator(toy_translator.model, toy_translator.tok_src, toy_translator.tok_tgt,
                             dict(get_config(), seq_len=toy_translator.seq_len, no_repeat_ngram_size=1))
    repeating = ["one one two.", "three four three."]
    found, _ = bench_glossary.search(banned, repeating, 3, config)
    expected = banned.translate_best(repeating, DecodingOptions.from_config(config, beam_size=3))
    assert [toy_translator.tok_tgt.decode(h[0]) for h in found] == expected
    assert expected != translator.translate_best(repeating, DecodingOptions.from_config(config, beam_size=3))


def test_bench_paragraphs_scores_lines_and_paragraphs_against_joined_references(trained_run) -> None:
    """Paragraphs of short sentences that sentencex splits where they were joined: segmented, they
    translate exactly as line by line; whole, as the paragraph the engine gets."""
    groups = bench_segmentation.paragraphs(synthetic_pairs(9, 4), seed=1)
    translator = TorchTranslator.load(trained_run.latest()[0], trained_run.folder, torch.device("cpu"))
    options = DecodingOptions(beam_size=2)
    measured = bench_paragraphs.measure_engine(translator, groups, options)
    sentences = translator.translate_best([s for group in groups for s, _ in group], options)
    references = [" ".join(t for _, t in group) for group in groups]
    lines = bench_paragraphs.joined(sentences, groups)
    whole = translator.translate_best([" ".join(s for s, _ in group) for group in groups], options)
    rows = measured["rows"]
    assert rows["lines"]["bleu"] == rows["paragraphs, segmented"]["bleu"] == corpus_scores(lines, references)["bleu"]
    assert rows["paragraphs, whole"]["bleu"] == corpus_scores(whole, references)["bleu"]
    assert measured["sentence_level"]["bleu"] == corpus_scores(sentences, [t for g in groups for _, t in g])["bleu"]
    assert 0 <= measured["segmentation"]["planning_s"] and measured["split_for_length"] == 0


def test_bench_translate_misses_its_target_when_autos_set_up_is_not_the_fastest(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def row(engine: str, rate: float, bleu: float = 30.0) -> dict:
        return {"engine": engine, "beam": 5, "sentences_per_s": rate, "bleu": bleu, "setup": f"{engine}'s"}

    rows = [row("pytorch", 100.0), row(bench_translate.DEFAULT, 340.0, 29.6), row("ctranslate2 int8 on oneDNN", 340.0),
            row("ctranslate2 float32 on oneDNN", 370.0, 30.1), {**row("pytorch", 400.0), "beam": 1}]
    met = {name.split(" (")[0].split(",")[0]: target["met"] for name, target in bench_translate.targets(rows).items()}
    assert met == {"default set-up beam 5 / pytorch beam 5": True, "float32 - default set-up BLEU": True,
                   "auto's set-up": True}  # 340 / 370 = 0.92: within 10% of the fastest
    rows[3].update(sentences_per_s=380.0, bleu=30.2)
    [(name, target)] = [item for item in bench_translate.targets(rows).items() if item[0].startswith("auto")]
    assert not target["met"] and target["value"] == pytest.approx(340 / 380)
    assert "the fastest found (ctranslate2 float32 on oneDNN: ctranslate2 float32 on oneDNN's)" in name
    assert not [t for t in bench_translate.targets(rows).values() if t["target"] == "<= 0.5"][0]["met"]  # 0.6 BLEU


@pytest.mark.parametrize("info, mkl", [(ZEN4, True), (ZEN3, True), (GRAVITON, False)])
def test_bench_translate_times_every_set_up_auto_chooses_among(monkeypatch: pytest.MonkeyPatch, info: CpuInfo,
                                                               mkl: bool) -> None:
    monkeypatch.setattr(bench_translate, "cpu_info", lambda: info)
    folders = {name: Path(name) for name in ("auto", "float32", "int8")}
    rows = {(engine, beam): (folder, extra, env)
            for engine, beam, folder, extra, env in bench_translate.configurations(folders)}
    assert rows[("pytorch", 5)] == (None, [], {}) and rows[(bench_translate.DEFAULT, 5)] == (Path("auto"), [], {})
    assert rows[("ctranslate2 int8 on oneDNN", 5)] == (Path("int8"), ["--compute_type", "int8"], {"CT2_USE_MKL": "0"})
    assert rows[("ctranslate2 float32 on oneDNN", 5)][2] == {"CT2_USE_MKL": "0"}
    assert (("ctranslate2 float32 on MKL", 5) in rows) == mkl and len(rows) == 6 + 2 * mkl


def test_bench_translate_reruns_ctranslate2s_beam_5_rows_keeping_their_fastest(
        monkeypatch: pytest.MonkeyPatch) -> None:
    runs = {"pytorch": iter([30.0]), "greedy": iter([500.0]), "beam 5": iter([200.0, 300.0, 250.0])}

    def run_child(argv: list[str], environment: dict[str, str]) -> dict:
        return {"sentences_per_s": next(runs[argv[0]]), "translations": ["il gatto vede il cane nero"]}

    monkeypatch.setattr(bench_translate, "run_child", run_child)
    children = [("pytorch", 5, ["pytorch"], {}), (bench_translate.DEFAULT, 1, ["greedy"], {}),
                (bench_translate.DEFAULT, 5, ["beam 5"], {})]
    rows, signatures = bench_translate.measure_rows(children, ["il gatto vede il cane nero"], rounds=3)
    assert [row["sentences_per_s"] for row in rows] == [30.0, 500.0, 300.0] and rows[2]["chrf"] == 100.0
    assert all(next(run, None) is None for run in runs.values()) and signatures[0].startswith("nrefs:1")


def test_idle_connections_passes_serve_py_only_its_options() -> None:
    from benchmarks import idle_connections
    argv = ["--connections", "5", "--checkpoint", "x.pt", "--seconds=3", "--tls", "--serve_header_timeout_s", "2"]
    idle_connections.argument_parser().parse_args(argv)  # serve.py's flags are known to the check
    assert idle_connections.serve_arguments(argv) == ["--checkpoint", "x.pt", "--serve_header_timeout_s", "2"]


def test_bench_new_shapes_times_each_shape_on_first_sight_and_again() -> None:
    lengths = argparse.Namespace(src_lens=np.array([5, 5, 7, 5]), tgt_lens=np.array([4, 4, 4, 4]))
    batches = [np.array([0]), np.array([1]), np.array([2]), np.array([0, 3])]  # the second repeats the first's shape
    assert [b.tolist() for b in bench_new_shapes.distinct_shapes(lengths, batches, 3)] == [[0], [2], [0, 3]]
    args = bench_new_shapes.argument_parser().parse_args(["--quick", "--device", "cpu", "--steps", "3"])
    result = bench_new_shapes.measure("torch default", args)
    shapes = [tuple(shape) for shape in result["shapes"]]
    assert result["steps"] == len(set(shapes)) == 3, shapes  # (sentences, target width, source width) all differ
    assert all(ms > 0 for ms in result["first_ms"] + result["again_ms"]) and len(result["again_ms"]) == 3
    assert result["decode_first_ms"] > 0 and result["decode_again_ms"] > 0
    assert result["cudnn_attention"] is None and result["busiest_per_step"][0]["self_cpu_ms"] > 0
    lines = bench_new_shapes.table([result, {**result, "setting": "project"}], quick=True).splitlines()
    assert [line.split(" | ")[0] for line in lines if line.startswith("| ") and " | - | " in line] == \
        ["| torch default", "| project"]


def test_bench_new_shapes_refuses_bad_input_in_one_line(tmp_path: Path, capfd: pytest.CaptureFixture) -> None:
    assert bench_new_shapes.main(["--quick", "--device", "cpu", "--datasource", str(tmp_path / "none")]) == 2
    assert capfd.readouterr().err.splitlines() == [
        f"bench_new_shapes.py: error: datasource {str(tmp_path / 'none')!r} does not exist: tried the folder "
        f"{tmp_path / 'none'}, {tmp_path / 'none'}.tsv and {tmp_path / 'none'}.en + {tmp_path / 'none'}.it "
        f"(each also .gz, .bz2, .xz)"]
    with pytest.raises(SystemExit) as stopped:
        bench_new_shapes.main(["--quick", "--device", "cpu", "--steps", "0"])
    assert stopped.value.code == 2 and capfd.readouterr().err.splitlines()[-1] == \
        "bench_new_shapes.py: error: --steps must be at least 1, got 0"
