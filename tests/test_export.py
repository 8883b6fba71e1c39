"""export.py and the CTranslate2 engine: an exported model decodes exactly as this project's PyTorch
decoding does (greedy and beam search, tokens and scores), in every architecture variant; int8 keeps
at least half a toy's greedy outputs; what cannot be represented is refused; translate.py and evaluate.py run it with
--engine ctranslate2, and a missing or damaged model directory is one line. --output is never a folder
or file export.py did not write: refused in one line, untouched; --overwrite replaces only an earlier
export holding nothing but the files its marker lists, which a failed or interrupted export leaves as
it was. A model of several target languages exports them in its config, translate.py runs it with
--target_lang on CTranslate2 as on PyTorch, and one whose tokenizer lacks their tags is refused."""
from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import ctranslate2
import pytest
import sacrebleu
import torch
from torch import nn

import evaluate
import export
import translate
from config import get_config
from nmt.inference.decoding import beam_search, max_output_tokens
from model import build_transformer
from synthetic_data import synthetic_pairs
from test_translator import several_targets  # noqa: F401  (a fixture: an untrained model of en -> fr+it)
from nmt.corpora.tokenizer import EOS_ID, train_tokenizer
from nmt.inference import ct2_model
from nmt.inference.ct2_model import TIMINGS, CpuInfo
from test_ct2_model import GRAVITON, SAPPHIRE_RAPIDS, ZEN3, ZEN4, simulate_timings
from nmt.inference.translator import CTranslate2Translator, DecodingOptions, TorchTranslator, TranslatorError

SENTENCES = 80


@pytest.fixture(autouse=True)
def avx2_machine(monkeypatch: pytest.MonkeyPatch, backend_env: None) -> None:
    """A simulated CPU of a fixed rule (export.py's auto writes int8, `auto` never times) for every
    test here, unless it simulates another: the tests do not depend on the machine that runs them."""
    monkeypatch.setattr(ct2_model, "cpu_info", lambda: ZEN3)


@pytest.fixture(scope="module")
def toy_sources(toy_translator) -> list[str]:
    seen = set(toy_translator.train_pairs)
    return [s for s, t in toy_translator.pairs(200, seed=21) if (s, t) not in seen][:SENTENCES]


def export_toy(toy, folder: Path, quantization: str = "float32") -> CTranslate2Translator:
    config = dict(get_config(), d_model=32, num_layers=1, num_heads=2, d_ff=64, seq_len=toy.seq_len)
    export.export_model(toy.model, config, toy.tok_src, toy.tok_tgt, folder, quantization)
    return CTranslate2Translator(folder)


def agreement(ours, theirs, tolerance: float = 1e-4) -> tuple[int, int]:
    """(same best tokens, of those also the same score within `tolerance`)."""
    same = [(a[0], b[0]) for a, b in zip(ours, theirs) if a[0].text == b[0].text]
    return len(same), sum(abs(a.score - b.score) <= tolerance for a, b in same)


def test_greedy_output_and_scores_equal_pytorch(toy_translator, toy_sources, tmp_path: Path) -> None:
    ct2 = export_toy(toy_translator, tmp_path / "ct2")
    ours = toy_translator.translator().translate(toy_sources, DecodingOptions())
    theirs = ct2.translate(toy_sources, DecodingOptions())
    assert agreement(ours, theirs) == (SENTENCES, SENTENCES)
    assert len({len(h[0].text.split()) for h in ours}) >= 5, "outputs of many lengths"


@pytest.mark.parametrize("norm_first", [True, False])
@pytest.mark.parametrize("tied", [True, False])
def test_every_architecture_variant_exports_exactly(tmp_path: Path, norm_first: bool, tied: bool) -> None:
    """Random weights (outputs of every length up to the limit): pre-norm with its final LayerNorms
    or post-norm, one tied matrix or three."""
    torch.manual_seed(1)
    pairs = synthetic_pairs(200, 1)
    tokenizer = train_tokenizer([text for pair in pairs for text in pair], "bpe", 90, 1)
    size = tokenizer.get_vocab_size()
    model = build_transformer(size, size, 24, 24, d_model=32, N=2, h=4, d_ff=48, dropout=0.0,
                              norm_first=norm_first, tie_embeddings=tied).eval()
    with torch.no_grad():
        model.projection_layer.proj.bias[EOS_ID] = 1.0  # some outputs end early, others run to the limit
    config = dict(get_config(), d_model=32, num_layers=2, num_heads=4, d_ff=48, seq_len=24, norm_first=norm_first,
                  tie_embeddings=tied, joint_vocab=True, tokenizer_type="bpe")
    export.export_model(model, config, tokenizer, tokenizer, tmp_path / "ct2", "float32")
    sources = [s for s, _ in synthetic_pairs(40, 7)]
    greedy = DecodingOptions(beam_size=1)
    ours = TorchTranslator(model, tokenizer, tokenizer, config).translate(sources, greedy)
    theirs = CTranslate2Translator(tmp_path / "ct2").translate(sources, greedy)
    assert agreement(ours, theirs) == (40, 40)
    assert (tmp_path / "ct2" / "shared_vocabulary.json").is_file()


@pytest.mark.parametrize("length_penalty, ngram", [(1.0, 0), (0.6, 0), (1.2, 3)])
def test_beam_search_equals_ctranslate2s(toy_translator, toy_sources, tmp_path: Path, length_penalty: float,
                                         ngram: int) -> None:
    """Both define scores as log-probability over length ** length_penalty with [EOS] counted, and
    finish only an [EOS] among the first beam_size extensions. CTranslate2 stops a sentence once
    beam_size hypotheses have finished unless `patience` asks for more: with a patience it cannot
    reach it searches to the end, which this project's search must equal exactly. At its default
    patience it may stop before finding the best hypothesis: this project's is then never worse."""
    toy = toy_translator
    ct2 = export_toy(toy, tmp_path / "ct2")
    beam = DecodingOptions(beam_size=4, length_penalty=length_penalty, no_repeat_ngram_size=ngram)
    ours = toy.translator().translate(toy_sources, beam)
    tokens = [e.tokens for e in toy.tok_src.encode_batch(toy_sources, add_special_tokens=False)]
    exhaustive = [ct2.ct2.translate_batch([t], beam_size=4, length_penalty=length_penalty, patience=1000,
                                          no_repeat_ngram_size=ngram, min_decoding_length=0, return_scores=True,
                                          max_decoding_length=max_output_tokens(len(t), toy.seq_len))[0]
                  for t in tokens]
    for hypotheses, result in zip(ours, exhaustive):
        assert hypotheses[0].text == toy.tok_tgt.decode([toy.tok_tgt.token_to_id(t) for t in result.hypotheses[0]])
        assert hypotheses[0].score == pytest.approx(result.scores[0], abs=1e-4)
    engine = ct2.translate(toy_sources, beam)
    assert agreement(ours, engine)[0] >= SENTENCES - 4
    assert all(a[0].score >= b[0].score - 1e-4 for a, b in zip(ours, engine))


def test_brevity_penalty_ranks_ctranslate2s_beam(toy_translator, toy_sources, tmp_path: Path) -> None:
    """CTranslate2 has no brevity penalty in its search: its engine ranks its final beam with the
    term added. Where it picks what this project's search picks, the scores are the same (the same
    lengths counted on both sides); elsewhere this project's search, which goes on until nothing
    better can come, finds a better-scoring hypothesis, never a worse one."""
    ct2 = export_toy(toy_translator, tmp_path / "ct2")
    ours = toy_translator.translator()
    ours.length_ratio = ct2.length_ratio = 2.5  # longer than the toy's outputs: the term matters
    brevity = DecodingOptions(beam_size=4, brevity_penalty=2.0)
    with_term = ours.translate(toy_sources, brevity)
    theirs = ct2.translate(toy_sources, brevity)
    same, same_scores = agreement(with_term, theirs)
    assert same >= SENTENCES // 4 and same_scores == same
    without = {h[0].text: h[0].score for h in ct2.translate(toy_sources, DecodingOptions(beam_size=4))}
    penalised = [a[0] for a, b in zip(with_term, theirs) if a[0].text == b[0].text and a[0].text in without
                 and a[0].score < without[a[0].text] - 1e-3]
    assert len(penalised) >= 5, "premise: some of the agreeing outputs carry the term"
    assert all(a[0].score >= b[0].score - 1e-4 for a, b in zip(with_term, theirs))


def test_confidence_is_pytorchs_and_computed_only_when_asked(toy_translator, toy_sources, tmp_path: Path) -> None:
    """With a calibrator, CTranslate2's search is scored once more for what the calibrator reads:
    only the hypotheses it returns (here 2 of a beam of 4 ranked with the brevity penalty), giving
    each what this project's search gives it; with confidence off, nothing is scored again and the
    translations and scores are the same."""
    from conftest import GOOD_CALIBRATOR
    config = dict(get_config(), d_model=32, num_layers=1, num_heads=2, d_ff=64, seq_len=toy_translator.seq_len)
    export.export_model(toy_translator.model, config, toy_translator.tok_src, toy_translator.tok_tgt,
                        tmp_path / "ct2", "float32", confidence=GOOD_CALIBRATOR)
    ct2, ours = CTranslate2Translator(tmp_path / "ct2"), toy_translator.translator()
    ours.calibrator, ours.length_ratio, ct2.length_ratio = ct2.calibrator, 2.5, 2.5

    class CountingScores:  # CTranslate2's translator, counting the hypotheses it is given to score
        def __init__(self, engine) -> None:
            self.engine, self.scored = engine, 0

        def __getattr__(self, name: str):
            return getattr(self.engine, name)

        def score_batch(self, sources, targets, **options):
            self.scored += len(targets)
            return self.engine.score_batch(sources, targets, **options)

    ct2.ct2 = CountingScores(ct2.ct2)
    options = DecodingOptions(beam_size=4, n_best=2, brevity_penalty=2.0)
    theirs, expected = ct2.translate(toy_sources, options), ours.translate(toy_sources, options)
    assert ct2.ct2.scored == 2 * SENTENCES
    same = [(k, a, b) for mine, found in zip(expected, theirs) for k, (a, b) in enumerate(zip(mine, found))
            if a.text == b.text]
    assert len(same) >= SENTENCES // 4 and {k for k, _, _ in same} == {0, 1}  # best and second best
    for _, a, b in same:
        assert (b.length, b.log_prob, b.lowest) == (a.length, pytest.approx(a.log_prob, abs=1e-4),
                                                    pytest.approx(a.lowest, abs=1e-4))
        assert b.confidence == pytest.approx(a.confidence, abs=1e-4)
    without = ct2.translate(toy_sources, options.replace(confidence=False))
    assert ct2.ct2.scored == 2 * SENTENCES
    assert [[(h.text, h.score) for h in found] for found in without] == \
        [[(h.text, h.score) for h in found] for found in theirs]
    assert all(h.confidence is None for found in without for h in found)


def test_int8_keeps_most_greedy_outputs(toy_translator, toy_sources, tmp_path: Path) -> None:
    ct2 = export_toy(toy_translator, tmp_path / "int8", "int8")
    assert ct2.describe()["quantization"] == "int8"
    ours = toy_translator.translator().translate_best(toy_sources, DecodingOptions())
    theirs = ct2.translate_best(toy_sources, DecodingOptions())
    # A 32-wide toy is far more sensitive to 8-bit weights than a real model: oneDNN's int8 products
    # without AVX-512 VNNI keep about two thirds of its greedy outputs (the tatoeba model keeps its
    # BLEU: docs/serving.md). A wrong scale or layout keeps almost none.
    assert sum(a == b for a, b in zip(ours, theirs)) >= 0.5 * SENTENCES
    assert (tmp_path / "int8" / "model.bin").stat().st_size < 0.5 * export_toy(
        toy_translator, tmp_path / "fp32").path.joinpath("model.bin").stat().st_size


def test_weights_it_cannot_place_are_refused(toy_translator, tmp_path: Path) -> None:
    toy = toy_translator
    model = build_transformer(toy.tok_src.get_vocab_size(), toy.tok_tgt.get_vocab_size(), toy.seq_len, toy.seq_len,
                              d_model=32, N=1, h=2, d_ff=64)
    model.decoder.layers[0].gate = nn.Linear(32, 32)  # a block model.py does not have
    config = dict(get_config(), d_model=32, num_layers=1, num_heads=2, d_ff=64, seq_len=toy.seq_len)
    with pytest.raises(export.ExportError, match=r"decoder\.layers\.0\.gate\.bias"):
        export.export_model(model, config, toy.tok_src, toy.tok_tgt, tmp_path / "ct2", "float32")
    assert not (tmp_path / "ct2").exists()


# ---------------------------------------------------------------------------- the programs

@pytest.fixture(scope="module")
def exported(trained_run, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("exported") / "model"
    assert export.main(["--datasource", str(trained_run.datasource), "--model_folder", str(trained_run.model_folder),
                        "--quantization", "float32", "--output", str(folder)]) == 0
    return folder


def run(capsys, main, argv: list[str]) -> tuple[int, list[str], list[str]]:
    try:
        code = main(argv)
    except SystemExit as stop:
        code = stop.code
    captured = capsys.readouterr()
    return code, captured.out.splitlines(), captured.err.strip().splitlines()


def test_translate_and_evaluate_with_the_exported_model(trained_run, exported: Path, capsys, tmp_path: Path) -> None:
    sentences = ["The cat sees the dog.", "The old man reads the red book."]
    experiment = ["--datasource", str(trained_run.datasource), "--model_folder", str(trained_run.model_folder)]
    code, pytorch_out, _ = run(capsys, translate.main, experiment + ["--beam_size", "3"] + sentences)
    assert code == 0
    code, ct2_out, err = run(capsys, translate.main, ["--engine", "ctranslate2", "--model_dir", str(exported),
                                                      "--beam_size", "3"] + sentences)
    assert code == 0 and ct2_out == pytorch_out and err == [f"translate.py: using {exported}"]
    project = (exported / "project.json").read_text(encoding="utf-8")
    assert "ckpt_00000060.pt" in project and '"quantization": "float32"' in project

    output = tmp_path / "hypotheses.txt"
    code, out, err = run(capsys, evaluate.main, ["--datasource", str(trained_run.datasource), "--engine",
                                                 "ctranslate2", "--model_dir", str(exported), "--output", str(output)])
    assert code == 0, err
    references = [t for _, t in synthetic_pairs(16, 3)]  # the fixture's test split
    assert out[-1] == str(sacrebleu.corpus_bleu(output.read_text(encoding="utf-8").splitlines(), [references]))
    assert "(ctranslate2)" in out[0]


def test_plot_attention_draws_either_engines_heatmap(trained_run, exported: Path, capsys, tmp_path: Path) -> None:
    engines = {"pytorch": ["--datasource", str(trained_run.datasource), "--model_folder", str(trained_run.model_folder)],
               "ctranslate2": ["--engine", "ctranslate2", "--model_dir", str(exported)]}
    for engine, choice in engines.items():
        plot = tmp_path / f"{engine}.png"
        code, out, err = run(capsys, translate.main, choice + ["--plot_attention", str(plot), "The cat sees the dog."])
        assert code == 0 and len(out) == 1 and err[-1] == f"translate.py: saved the attention plot to {plot}", err
        assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_model_of_several_targets_exports_its_languages(several_targets, capsys, tmp_path: Path) -> None:
    sentences = ["the cat sees the dog .", "a red house ."]
    exported = tmp_path / "ct2"
    code, _, err = run(capsys, export.main, several_targets.args + ["--quantization", "float32", "--output",
                                                                    str(exported)])
    assert code == 0, err
    assert json.loads((exported / "project.json").read_text(encoding="utf-8"))["config"]["lang_tgt"] == "fr+it"
    code, out, err = run(capsys, translate.main, several_targets.args + [
        "--engine", "ctranslate2", "--model_dir", str(exported), "--target_lang", "it", "--beam_size", "1", *sentences])
    assert code == 0, err
    assert out == several_targets.translator().translate_best(sentences, DecodingOptions(beam_size=1, target_lang="it"))
    assert err == [f"translate.py: using {exported}, translating into it"]
    untagged = train_tokenizer(sentences, "wordlevel", 100, 1)
    with pytest.raises(export.ExportError, match="several target languages .fr.it. needs the tag <2fr>"):
        export.export_model(several_targets.model, several_targets.config, untagged, untagged, tmp_path / "no", "int8")


def test_a_calibrator_that_cannot_be_read_is_one_warning_and_no_confidence(trained_run,
                                                                          bad_calibrator_run: tuple[Path, str],
                                                                          capsys, tmp_path: Path) -> None:
    """A truncated or hand-edited confidence.json beside the checkpoints: a side file, so the model
    is exported, without confidence, and the problem said in one warning."""
    folder, problem = bad_calibrator_run
    code, _, err = run(capsys, export.main, ["--datasource", str(trained_run.datasource), "--model_folder",
                                             str(folder.parent), "--quantization", "float32", "--output",
                                             str(tmp_path / "ct2")])
    assert code == 0, err
    [warning] = [line for line in err if "warning" in line]
    assert warning.startswith(f"export.py: warning: {problem}") and warning.endswith(
        ": exporting without confidence (fit it again with evaluate.py --fit_confidence, then export again)")
    assert json.loads((tmp_path / "ct2" / "project.json").read_text(encoding="utf-8"))["confidence"] is None
    assert "has no confidence calibrator" in CTranslate2Translator(tmp_path / "ct2").no_confidence


def test_missing_or_damaged_model_directory_is_one_line(exported: Path, tmp_path: Path, capsys) -> None:
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    for path in exported.iterdir():
        (damaged / path.name).write_bytes(path.read_bytes())
    (damaged / "model.bin").write_bytes((damaged / "model.bin").read_bytes()[:1000])
    cases = [(["--model_dir", str(tmp_path / "nowhere")], "does not exist"),
             (["--model_dir", str(damaged)], "cannot load the CTranslate2 model"),
             ([], "needs --model_dir")]
    for extra, message in cases:
        code, out, err = run(capsys, translate.main, ["--engine", "ctranslate2", *extra, "Hello."])
        assert code == 1 and out == [] and len(err) == 1 and message in err[0], err
    (damaged / "tokenizer_target.json").unlink()
    code, out, err = run(capsys, translate.main, ["--engine", "ctranslate2", "--model_dir", str(damaged), "Hello."])
    assert code == 1 and len(err) == 1 and "not a model directory written by export.py" in err[0]


def test_a_model_the_device_cannot_run_is_found_when_it_loads(exported: Path, capsys,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """CTranslate2 loads a model on a GPU without cuBLAS and fails only when it first translates: the
    translator's warm-up finds that before any program translates, and says it in one line."""
    real = ctranslate2.Translator

    class WithoutCublas:  # what CTranslate2 does on such a GPU, here on the CPU
        def __init__(self, *args, **kwargs) -> None:
            self.loaded = real(*args, **kwargs)

        def translate_batch(self, *args, **kwargs) -> None:
            raise RuntimeError("Library libcublas.so.12 is not found or cannot be loaded")

    monkeypatch.setattr(ctranslate2, "Translator", WithoutCublas)
    with pytest.raises(TranslatorError, match=f"^cannot run the CTranslate2 model in {exported} on cpu: Library "
                                              f"libcublas.so.12 is not found or cannot be loaded$"):
        CTranslate2Translator(exported)
    code, out, err = run(capsys, evaluate.main, ["--engine", "ctranslate2", "--model_dir", str(exported)])
    assert code == 1 and out == [] and err == [f"evaluate.py: error: cannot run the CTranslate2 model in {exported} on "
                                               f"cpu: Library libcublas.so.12 is not found or cannot be loaded"]


def snapshot(folder: Path) -> dict[str, bytes | str]:
    """Every entry under `folder`: a file's bytes, a link's target, a folder's mark."""
    return {str(p.relative_to(folder)): os.readlink(p) if p.is_symlink() else p.read_bytes() if p.is_file() else "dir"
            for p in sorted(folder.rglob("*"))}


def test_an_output_export_py_did_not_write_is_refused_untouched(trained_run, tmp_path: Path, capsys) -> None:
    experiment = ["--datasource", str(trained_run.datasource), "--model_folder", str(trained_run.model_folder)]
    thesis = tmp_path / "thesis"
    thesis.mkdir()
    (thesis / "thesis.txt").write_text("Four years of work.\n", encoding="utf-8")
    (tmp_path / "empty").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "empty")
    before = snapshot(tmp_path)
    cases = [(thesis, "is a folder that export.py did not write"), (thesis / "thesis.txt", "is a file that"),
             (tmp_path / "link", "is a symbolic link, which export.py refuses as --output")]
    for output, message in cases:
        for overwrite in ([], ["--overwrite"]):
            code, out, err = run(capsys, export.main, experiment + ["--output", str(output), *overwrite])
            assert code == 1 and out == [] and len(err) == 1 and message in err[0], err
            assert snapshot(tmp_path) == before
    code, _, err = run(capsys, export.main, experiment + ["--output", str(tmp_path / "empty")])
    assert code == 0, err
    assert export.export_marker(tmp_path / "empty") and (tmp_path / "link" / "model.bin").is_file()


def test_overwrite_replaces_only_an_earlier_export(trained_run, tmp_path: Path, capsys,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    experiment = ["--datasource", str(trained_run.datasource), "--model_folder", str(trained_run.model_folder),
                  "--output", str(tmp_path / "model")]
    assert run(capsys, export.main, experiment + ["--quantization", "float32"])[0] == 0
    earlier = snapshot(tmp_path)
    code, _, err = run(capsys, export.main, experiment)
    assert code == 1 and len(err) == 1 and "holds an earlier export; pass --overwrite" in err[0]
    assert snapshot(tmp_path) == earlier

    def full_disk(path: Path, data: bytes) -> str:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with monkeypatch.context() as patch:
        patch.setattr(export, "atomic_write_bytes", full_disk)
        code, _, err = run(capsys, export.main, experiment + ["--overwrite"])
    assert code == 1 and len(err) == 1 and f"cannot write {tmp_path / 'model'}: No space left on device" in err[0]
    assert snapshot(tmp_path) == earlier, "a failed export leaves the earlier one and nothing else"
    code, _, err = run(capsys, export.main, experiment + ["--overwrite"])
    assert code == 0, err
    assert [p.name for p in tmp_path.iterdir()] == ["model"] and export.export_marker(tmp_path / "model")
    assert '"quantization": "int8"' in (tmp_path / "model" / "project.json").read_text(encoding="utf-8")


def test_overwrite_never_removes_a_file_the_user_put_in_an_export(trained_run, tmp_path: Path, capsys,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    model = tmp_path / "model"
    experiment = ["--datasource", str(trained_run.datasource), "--model_folder", str(trained_run.model_folder),
                  "--output", str(model), "--overwrite"]
    assert run(capsys, export.main, experiment)[0] == 0
    marker = json.loads((model / export.MARKER).read_text(encoding="utf-8"))
    assert sorted(marker["files"] + [export.MARKER]) == sorted(p.name for p in model.iterdir())
    (model / "notes.txt").write_text("what this model is for\n", encoding="utf-8")
    (model / "plots").mkdir()
    (model / "plots" / "bleu.png").write_bytes(b"png")
    earlier = snapshot(tmp_path)
    code, _, err = run(capsys, export.main, experiment)
    assert code == 1 and len(err) == 1, err
    assert f"{model} holds an earlier export and notes.txt, plots, plots/bleu.png, which export.py did not write" \
        in err[0] and "move them out of it" in err[0]
    assert snapshot(tmp_path) == earlier

    (model / "notes.txt").unlink()
    del marker["files"]  # what export.py cannot vouch for: an export whose marker lists no files
    (model / export.MARKER).write_text(json.dumps(marker), encoding="utf-8")
    earlier = snapshot(tmp_path)
    code, _, err = run(capsys, export.main, experiment)
    assert code == 1 and len(err) == 1 and "does not list its files, so export.py cannot tell them from yours" \
        in err[0], err
    assert snapshot(tmp_path) == earlier

    shutil.rmtree(model)
    assert run(capsys, export.main, experiment)[0] == 0
    real_write = export.atomic_write_bytes

    def user_writes_meanwhile(path: Path, data: bytes) -> str:
        if path.name == export.MARKER:  # after --overwrite was checked, before the earlier export is replaced
            (model / "notes.txt").write_text("written during the export\n", encoding="utf-8")
        return real_write(path, data)

    monkeypatch.setattr(export, "atomic_write_bytes", user_writes_meanwhile)
    earlier = snapshot(tmp_path)
    code, _, err = run(capsys, export.main, experiment)
    assert code == 1 and len(err) == 1 and "and notes.txt, which export.py did not write" in err[0], err
    assert snapshot(tmp_path) == {**earlier, "model/notes.txt": b"written during the export\n"}


def test_ctrl_c_during_an_export_is_one_line_and_leaves_the_earlier_export(trained_run, tmp_path: Path, capsys,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    experiment = ["--datasource", str(trained_run.datasource), "--model_folder", str(trained_run.model_folder),
                  "--output", str(tmp_path / "model"), "--overwrite"]
    assert run(capsys, export.main, experiment)[0] == 0
    earlier = snapshot(tmp_path)
    real_write = export.atomic_write_bytes

    def interrupted_at_the_marker(path: Path, data: bytes) -> str:
        if path.name == export.MARKER:  # the new model is complete in its staging folder: Ctrl-C now
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(60)  # the signal's KeyboardInterrupt ends this at once
        return real_write(path, data)

    monkeypatch.setattr(export, "atomic_write_bytes", interrupted_at_the_marker)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        code, out, err = run(capsys, export.main, experiment)
    except KeyboardInterrupt:
        pytest.fail("Ctrl-C escaped export.main as a KeyboardInterrupt")
    finally:
        signal.signal(signal.SIGINT, previous)
    assert code == 130 and out == [] and err == [f"export.py: interrupted; nothing was written to {tmp_path / 'model'}"]
    assert snapshot(tmp_path) == earlier, "the staging folder is removed and the earlier export left as it was"


KILLED_BETWEEN_RENAMES = """import os, signal, sys
import export
def killed(staging, output, aside):  # SIGKILL after the earlier export was moved aside, before the new one is in
    output.rename(aside)
    os.kill(os.getpid(), signal.SIGKILL)
export.swap_in = killed
sys.exit(export.main(sys.argv[1:]))
"""


def test_the_next_export_cleans_up_after_one_killed_by_sigkill(trained_run, tmp_path: Path, capsys) -> None:
    """An export killed at its worst moment leaves its staging folder (a full model) and the earlier
    export moved aside into it, and no --output. The next export puts the earlier export back, removes
    the leftover in one line each, and leaves alone the staging folder of an export still running
    (locked); here it then refuses to replace the earlier export without --overwrite, as it would
    have before the kill."""
    model = tmp_path / "model"
    experiment = ["--datasource", str(trained_run.datasource), "--model_folder", str(trained_run.model_folder),
                  "--output", str(model)]
    assert run(capsys, export.main, experiment)[0] == 0
    earlier = snapshot(model)
    killed = subprocess.run([sys.executable, "-c", KILLED_BETWEEN_RENAMES, *experiment, "--overwrite"],
                            cwd=export.Path(export.__file__).parent, capture_output=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    [leftover] = tmp_path.glob(".model.export-*")
    assert not model.exists() and snapshot(leftover / "previous") == earlier
    assert [path for path in leftover.glob("*/model.bin") if path.parent.name != "previous"], "the new model"
    running = tmp_path / ".model.export-running1"
    running.mkdir()
    (running / "model.bin").write_bytes(b"being written")
    held = export.lock_folder(running)
    try:
        code, out, err = run(capsys, export.main, experiment)
    finally:
        os.close(held)
    assert code == 1 and err == [
        f"export.py: put back the earlier export at {model}, which a killed export had moved aside",
        f"export.py: removed {leftover}, the staging folder of an export that was killed",
        f"export.py: error: {model} holds an earlier export; pass --overwrite to replace it"]
    assert snapshot(model) == earlier and sorted(p.name for p in tmp_path.iterdir()) == [".model.export-running1",
                                                                                      "model"]


def test_a_translator_never_reads_a_half_replaced_export(toy_translator, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """export.py --overwrite replaces the export (float32 by int8) while a server loads it, after its
    tokenizers and config are read and before its weights: the translator gets one export whole (the
    new one, read again once the old one is gone), never the old one's files with the new weights."""
    from nmt.inference import translator as translator_module
    folder = tmp_path / "model"
    export_toy(toy_translator, folder, "float32")
    read_project_files, replacements = translator_module.read_project_files, []

    def replaced_meanwhile(path: Path) -> tuple:
        found = read_project_files(path)
        if not replacements:
            config = dict(get_config(), d_model=32, num_layers=1, num_heads=2, d_ff=64, seq_len=toy_translator.seq_len)
            replacements.append(export.export_model(toy_translator.model, config, toy_translator.tok_src,
                                                    toy_translator.tok_tgt, folder, "int8", overwrite=True))
        return found

    monkeypatch.setattr(translator_module, "read_project_files", replaced_meanwhile)
    loaded = CTranslate2Translator(folder)
    assert replacements and loaded.project["quantization"] == "int8" and loaded.ct2.compute_type.startswith("int8")


@pytest.mark.parametrize("quantization", ["float16", "int8_float16"])
def test_gpu_quantizations_export_and_run_on_the_cpu_too(toy_translator, toy_sources, tmp_path: Path,
                                                         quantization: str) -> None:
    """The GPU types are exported as such; on a CPU CTranslate2 runs them in a type it has."""
    ct2 = export_toy(toy_translator, tmp_path / quantization, quantization)
    described = ct2.describe()
    assert described["quantization"] == quantization
    assert described["compute_type"] in ctranslate2.get_supported_compute_types("cpu")
    ours = toy_translator.translator().translate_best(toy_sources, DecodingOptions())
    theirs = ct2.translate_best(toy_sources, DecodingOptions())
    assert sum(a == b for a, b in zip(ours, theirs)) >= 0.5 * len(toy_sources)


@pytest.mark.parametrize("info, rates, written", [
    (ZEN3, None, "int8"), (GRAVITON, None, "int8"),  # fixed rules: no timing
    (ZEN4, {"float32": 300.0, "int8": 400.0}, "int8"),
    (SAPPHIRE_RAPIDS, {"float32": 500.0, "int8": 400.0}, "float32"),
])
def test_export_auto_writes_the_type_each_cpu_family_runs_fastest(toy_translator, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch, info: CpuInfo,
                                                                  rates: dict | None, written: str) -> None:
    monkeypatch.setattr(ct2_model, "cpu_info", lambda: info)
    weights: list = []
    calls = simulate_timings(monkeypatch, rates or {}, weights)
    folder = tmp_path / "model"
    assert export_toy(toy_translator, folder, "auto").describe()["quantization"] == written
    assert calls == ([("float32", "int8")] if rates else [])
    # each type timed on an export of its own weights, not float32 on the int8 export
    assert weights == ([{"float32": "float32", "int8": "int8"}] if rates else [])
    assert ((folder / TIMINGS).exists(), TIMINGS in export.export_marker(folder)["files"]) == (bool(rates),) * 2
    loaded = CTranslate2Translator(folder, compute_type="auto")
    assert len(calls) == len(bool(rates) * [1]), "this machine loads its export without timing it again"
    assert loaded.describe()["compute_type"] == ("float32" if written == "float32" else "int8_float32")


def test_a_real_timing_chooses_once_and_outputs_follow_the_chosen_type(toy_translator, toy_sources, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch,
                                                                        capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setattr(ct2_model, "cpu_info", lambda: ZEN4)
    folder = tmp_path / "int8"
    export_toy(toy_translator, folder, "int8")  # an explicit type: not timed by export.py
    capsys.readouterr()
    timed = CTranslate2Translator(folder, compute_type="auto")
    assert "AVX-512 VNNI/BF16 CPU: beam 5 ran at float32 " in capsys.readouterr().err
    [entry] = json.loads((folder / TIMINGS).read_text(encoding="utf-8"))["machines"].values()
    assert timed.compute_type == entry["compute_type"] and min(entry["sentences_per_s"].values()) > 0
    cached = CTranslate2Translator(folder, compute_type="auto")
    explicit = CTranslate2Translator(folder, compute_type=entry["compute_type"])
    assert capsys.readouterr().err == "", "the choice is cached: no second timing"
    options = DecodingOptions(beam_size=3)
    assert timed.translate(toy_sources, options) == cached.translate(toy_sources, options) == \
        explicit.translate(toy_sources, options)


def test_each_timed_run_is_a_fresh_process_reading_the_pinned_export(toy_translator, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The timing loads no translator in the process that asks for it (a serving process keeps one
    translator; in one process a second made the first slower), and its children read the export
    through the descriptor translator.py pins it by; a child that fails raises its last line."""
    folder = tmp_path / "int8"
    export_toy(toy_translator, folder, "int8")

    def loaded_here(*args, **kwargs):
        raise AssertionError("a translator was loaded in the timing's own process")

    monkeypatch.setattr(ctranslate2, "Translator", loaded_here)
    with ct2_model.pinned_folder(folder) as pinned:
        assert str(pinned).startswith("/proc/self/fd/")
        rates = ct2_model.time_compute_types({"float32": pinned, "int8": pinned}, 1)
    assert list(rates) == ["float32", "int8"] and min(rates.values()) > 0
    with pytest.raises(RuntimeError, match=f"timing int8 on {tmp_path} failed: FileNotFoundError.*project.json"):
        ct2_model.time_compute_types({"int8": tmp_path}, 1)


def test_overwrite_replaces_an_export_holding_a_timing_cached_since(toy_translator, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "model"
    export_toy(toy_translator, folder, "int8")
    monkeypatch.setattr(ct2_model, "cpu_info", lambda: SAPPHIRE_RAPIDS)  # served on another machine
    simulate_timings(monkeypatch, {"float32": 500.0, "int8": 400.0})
    assert CTranslate2Translator(folder, compute_type="auto").compute_type == "float32"
    assert TIMINGS not in export.export_marker(folder)["files"] and (folder / TIMINGS).exists()
    config = dict(get_config(), d_model=32, num_layers=1, num_heads=2, d_ff=64, seq_len=toy_translator.seq_len)
    export.export_model(toy_translator.model, config, toy_translator.tok_src, toy_translator.tok_tgt, folder,
                        "float32", overwrite=True)
    assert json.loads((folder / "project.json").read_text(encoding="utf-8"))["quantization"] == "float32"
    assert not (folder / TIMINGS).exists()


def test_format_transformers_writes_a_transformers_folder(several_targets, capsys,  # noqa: F811
                                                         tmp_path: Path) -> None:
    """--format transformers: options of the other format refused in one line; a model of several
    target languages refused without --language, nothing written; with it, a folder of
    transformers' files and the export's marker, which --overwrite replaces as it replaces a
    CTranslate2 export."""
    many, output = several_targets, tmp_path / "hf"
    checkpoint = ["--checkpoint", str(many.checkpoint), "--format", "transformers", "--output", str(output)]
    code, _, err = run(capsys, export.main, checkpoint + ["--quantization", "int8"])
    assert code == 2 and len(err) == 1 and "--quantization applies to CTranslate2 exports" in err[0]
    code, _, err = run(capsys, export.main, checkpoint)
    assert code == 1 and err == ["export.py: error: this model translates into fr, it: a Transformers folder "
                                 "translates into one, named by --language"]
    assert not output.exists()
    code, _, err = run(capsys, export.main, checkpoint + ["--language", "fr"])
    assert code == 0 and f"wrote {output} (PegasusForConditionalGeneration)" in err[-1]
    files = {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
             "README.md", "training_config.json", "target_tokenizer.json"}
    marker = json.loads((output / ct2_model.MARKER).read_text())
    assert files <= set(os.listdir(output)) and set(marker["files"]) == files
    with pytest.raises(export.ExportError, match="pass --overwrite"):
        export.export_transformers(many.model, many.config, many.tok_src, many.tok_tgt, output, target_lang="it")
    export.export_transformers(many.model, many.config, many.tok_src, many.tok_tgt, output, target_lang="it",
                               overwrite=True)
    template = json.loads((output / "tokenizer.json").read_text())["post_processor"]["single"]
    assert template[1]["SpecialToken"]["id"] == "<2it>"
