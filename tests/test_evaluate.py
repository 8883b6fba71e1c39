"""evaluate.py end to end: a tiny model trained here, scored on its own test split and on an
evaluation-only data set, with the printed BLEU checked against sacrebleu on the written file; lines
translated whole by default and sentence by sentence with --split_sentences true; a model of several
target languages needs --target_lang, which names the default output."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import sacrebleu
import torch

import evaluate
import train
from nmt.training.checkpoint import MANIFEST
from config import get_config
from nmt.inference.scoring import grouped_scores
from nmt.corpora.store import text_store
from synthetic_data import synthetic_pairs, tiny_corpus, write_hub_dataset
from test_translator import several_targets  # noqa: F401  (a fixture: an untrained model of en -> fr+it)
from nmt.inference.translator import DecodingOptions, TorchTranslator


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("evaluate")
    data = tiny_corpus(root / "toy", train=300, validation=20, test=40)
    weights, runs = root / "weights", root / "runs"
    code = train.main(["--datasource", str(data), "--preset", "tiny", "--tokenizer_type", "bpe", "--vocab_size", "80",
                       "--joint_vocab", "true", "--tie_embeddings", "true", "--d_model", "48", "--d_ff", "96",
                       "--num_epochs", "25", "--lr", "1e-2", "--model_folder", str(weights), "--runs_folder", str(runs),
                       "--store_folder", str(root / "stores"),
                       "--keep_checkpoints", "6", "--val_max_sentences", "5", "--num_examples", "0"])
    assert code == 0
    return {"data": data, "weights": weights, "runs": runs, "root": root}


def run_evaluate(capsys, *argv: str) -> tuple[int, list[str], str]:
    code = evaluate.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out.splitlines(), captured.err


def references(folder: Path, split: str, lang: str = "it") -> list[str]:
    import datasets
    return [row["translation"][lang] for row in datasets.load_dataset(str(folder), "en-it", split=split)]


def test_bleu_equals_sacrebleu_on_the_written_hypotheses(trained, capsys, tmp_path) -> None:
    output = tmp_path / "hyps.txt"
    code, out, err = run_evaluate(capsys, "--datasource", str(trained["data"]), "--model_folder",
                                  str(trained["weights"]), "--split", "test", "--beam_size", "3", "--output", str(output))
    assert code == 0, err
    hypotheses = output.read_text(encoding="utf-8").splitlines()
    refs = references(trained["data"], "test")
    assert len(hypotheses) == len(refs) == 40
    expected = sacrebleu.corpus_bleu(hypotheses, [refs])
    assert out[-1] == str(expected) and out[-1].startswith("BLEU = ")
    assert expected.score > 5, "the toy model should have learnt some of its word-for-word dictionary"
    chrf = sacrebleu.corpus_chrf(hypotheses, [refs])
    assert f"chrF2 = {chrf.score:.2f}" in "\n".join(out)
    assert any(line.startswith("BLEU signature: nrefs:1|case:mixed|eff:no|tok:13a") for line in out)
    grouped = grouped_scores(references(trained["data"], "test", "en"), hypotheses, refs)
    assert out[-3] == (f"grouped by source: {grouped['sources']} distinct sources, 40 references: BLEU "
                       f"{grouped['bleu']:.2f}, chrF2 {grouped['chrf']:.2f} ({grouped['bleu_signature']})")


def test_default_output_and_averaging(trained, capsys) -> None:
    code, out, err = run_evaluate(capsys, "--datasource", str(trained["data"]), "--model_folder",
                                  str(trained["weights"]), "--runs_folder", str(trained["runs"]),
                                  "--split", "validation", "--average", "3", "--checkpoint_choice", "latest")
    assert code == 0, err
    written = sorted((trained["runs"] / "toy_en-it").glob("toy.validation.ckpt_*.avg3.beam5.it"))
    assert len(written) == 1 and str(written[0]) in err
    assert out[-1] == str(sacrebleu.corpus_bleu(written[0].read_text(encoding="utf-8").splitlines(),
                                                [references(trained["data"], "validation")]))
    assert "average of 3" in out[0]


def test_checkpoint_choice_best_loads_the_best_by_validation(trained, capsys) -> None:
    manifest = json.loads((trained["weights"] / "toy_en-it" / MANIFEST).read_text())
    newest = max(name for name in manifest["checkpoints"] if "avg" not in name)
    assert manifest["best"] != newest, "premise: the best is not the newest"
    for choice, expected in (("best", manifest["best"]), ("latest", newest)):
        code, out, err = run_evaluate(capsys, "--datasource", str(trained["data"]), "--model_folder",
                                      str(trained["weights"]), "--runs_folder", str(trained["runs"]),
                                      "--split", "validation", "--checkpoint_choice", choice)
        assert code == 0 and out[0].startswith(f"model: {trained['weights'] / 'toy_en-it' / expected} "), (out, err)


def test_scores_an_evaluation_only_set_with_another_experiments_model(trained, capsys, tmp_path) -> None:
    other = write_hub_dataset(tmp_path / "outside", {"test": synthetic_pairs(15, seed=9)})
    output = tmp_path / "outside.txt"
    code, out, err = run_evaluate(capsys, "--datasource", str(other), "--model_folder", str(trained["weights"]),
                                  "--experiment_name", "toy_en-it", "--output", str(output))
    assert code == 0, err
    hypotheses = output.read_text(encoding="utf-8").splitlines()
    assert out[-1] == str(sacrebleu.corpus_bleu(hypotheses, [references(other, "test")]))
    # Without naming the model's experiment: the only run there scores it, and says so.
    code, out, err = run_evaluate(capsys, "--datasource", str(other), "--model_folder", str(trained["weights"]))
    assert code == 0 and out[-1] == str(sacrebleu.corpus_bleu(hypotheses, [references(other, "test")]))
    assert f"using the only run under {trained['weights']}/: toy_en-it" in err


@pytest.mark.parametrize("argv, message", [
    (["--split", "dev"], "has no 'dev' split"),
    (["--average", "9"], "cannot average 9 checkpoints"),
    (["--checkpoint", "missing.pt"], "does not exist"),
    (["--lang_tgt", "fr"], "does not match"),
])
def test_bad_input_gives_one_line(trained, capsys, argv, message) -> None:
    code, out, err = run_evaluate(capsys, "--datasource", str(trained["data"]), "--model_folder",
                                  str(trained["weights"]), "--experiment_name", "toy_en-it", *argv)
    assert code == 1 and out == []
    assert err.count("\n") == 1 and message in err


def test_a_train_only_source_is_scored_on_the_split_training_held_out(tmp_path: Path, capsys) -> None:
    """evaluate.py carves a train-only source exactly as training did (the same text store): its
    test split is the one training never saw."""
    data = write_hub_dataset(tmp_path / "only_train", {"train": synthetic_pairs(400, 1) + synthetic_pairs(100, 1)})
    common = ["--datasource", str(data), "--model_folder", str(tmp_path / "w"), "--store_folder", str(tmp_path / "s")]
    assert train.main(common + ["--preset", "tiny", "--max_steps", "3", "--runs_folder", str(tmp_path / "r"),
                                "--val_max_sentences", "4", "--test_max_pairs", "12"]) == 0
    output = tmp_path / "hypotheses.txt"
    code, out, err = run_evaluate(capsys, *common, "--split", "test", "--output", str(output))
    assert code == 0, err
    store = text_store({**get_config(), "datasource": str(data), "store_folder": str(tmp_path / "s"),
                        "test_max_pairs": 12})
    test_pairs = store.pairs("test")
    assert len(test_pairs) == 12 and len(output.read_text(encoding="utf-8").splitlines()) == 12
    assert out[-1] == str(sacrebleu.corpus_bleu(output.read_text(encoding="utf-8").splitlines(),
                                                [[t for _, t in test_pairs]]))
    assert not {s for s, _ in test_pairs} & {s for s, _ in store.pairs("train")}


def test_a_split_the_model_trained_on_is_refused_unless_insisted(trained, capsys, tmp_path: Path) -> None:
    """Pairs given with --test_data of which 6 are training pairs: refused in one line; with
    --allow_train_overlap, scored, and said on stderr and on the data line."""
    fresh = [(f"Never seen sentence number {i}.", f"Frase mai vista numero {i}.") for i in range(4)]
    tsv = tmp_path / "mixed.tsv"
    tsv.write_text("".join(f"{s}\t{t}\n" for s, t in synthetic_pairs(300, 1)[:6] + fresh), encoding="utf-8")
    argv = ["--datasource", str(trained["data"]), "--model_folder", str(trained["weights"]), "--store_folder",
            str(trained["root"] / "stores"), "--test_data", str(tsv), "--output", str(tmp_path / "out.txt")]
    code, out, err = run_evaluate(capsys, *argv)
    assert (code, out) == (1, []) and err.count("\n") == 1, err
    assert "6 of the 10 pairs of the test split have a source sentence the model trained on" in err
    assert "--allow_train_overlap true" in err
    code, out, err = run_evaluate(capsys, *argv, "--allow_train_overlap", "true")
    assert code == 0 and "WARNING: 6 of the 10 pairs" in err
    assert any(line.startswith("data: ") and "WARNING: 6 of the 10 pairs" in line for line in out)


def test_split_sentences_true_segments_each_line(trained, capsys, tmp_path: Path) -> None:
    """Lines of two sentences: by default each line is translated as one sentence; with
    --split_sentences true its sentences are found and translated apart, as translate.py does."""
    pairs = synthetic_pairs(8, seed=11)
    joined = [(f"{a} {b}", f"{x} {y}") for (a, x), (b, y) in zip(pairs[::2], pairs[1::2])]
    tsv = tmp_path / "paragraphs.tsv"
    tsv.write_text("".join(f"{s}\t{t}\n" for s, t in joined), encoding="utf-8")
    written = {}
    for flag in ("false", "true"):
        output = tmp_path / f"{flag}.txt"
        code, out, err = run_evaluate(capsys, "--datasource", str(trained["data"]), "--model_folder",
                                      str(trained["weights"]), "--store_folder", str(trained["root"] / "stores"),
                                      "--test_data", str(tsv), "--output", str(output), "--split_sentences", flag)
        assert code == 0, err
        written[flag] = output.read_text(encoding="utf-8").splitlines()
    translator = TorchTranslator.load(None, trained["weights"] / "toy_en-it", torch.device("cpu"))
    sources = [s for s, _ in joined]
    assert written["false"] == translator.translate_best(sources, DecodingOptions())
    assert written["true"] == translator.translate_text(sources, DecodingOptions(), True).lines != written["false"]


def test_a_model_of_several_targets_needs_target_lang(several_targets, capsys) -> None:
    code, out, err = run_evaluate(capsys, *several_targets.args)
    assert (code, out) == (1, [])
    assert err == "evaluate.py: error: this model translates into fr, it: choose one with target_lang\n"
    output = evaluate.default_output(several_targets.config, several_targets.checkpoint, 1, "test", "pytorch", "fr",
                                     several_targets.config["beam_size"])
    assert output.name.endswith(".test.ckpt_00000001.beam5.fr")


def test_a_calibrator_that_cannot_be_used_is_one_warning(trained_run, bad_calibrator_run: tuple[Path, str],
                                                         capsys, tmp_path: Path) -> None:
    """A truncated or hand-edited confidence.json: the split is scored, without a confidence line,
    and the calibrator is one warning."""
    folder, problem = bad_calibrator_run
    code, out, err = run_evaluate(capsys, "--datasource", str(trained_run.datasource), "--model_folder",
                                  str(folder.parent), "--store_folder", trained_run.config["store_folder"],
                                  "--runs_folder", str(tmp_path / "runs"))
    assert code == 0 and out[-1].startswith("BLEU = ") and not any(line.startswith("confidence:") for line in out)
    [warning] = [line for line in err.splitlines() if "confidence" in line]
    assert warning.startswith(f"warning: {problem}") and warning.endswith("translating without confidence (fit it "
                                                                          "again with evaluate.py --fit_confidence)")
