"""translate.py: translations alone on stdout, one clear line for bad input, batch mode from
stdin that survives bad lines, text that keeps its shape (indentation, spacing, blank lines, one
output line per input line) with segmentation on and off, a sentence over the model's limit
translated in pieces, documents (.srt, Markdown) through --input/--output, n-best numbering, a
quiet end when the reader of stdout goes away, --checkpoint PATH (here a checkpoint written on a
GPU), and a model of several target languages: named by their set, --target_lang required, a
--lang_tgt of one of them refused with the way to name it."""
from __future__ import annotations

import io
import json
import os
import queue
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from nmt.inference import documents
import translate
from test_translator import several_targets  # noqa: F401  (a fixture: an untrained model of en -> fr+it)
from nmt.inference.translator import CTranslate2Translator, DecodingOptions, TorchTranslator, Translator

FIRST, SECOND = "The cat sees the dog.", "The dog eats the bread."


@pytest.fixture(scope="module")
def expected(trained_run) -> dict[str, str]:
    """What the trained run's latest checkpoint makes of a few sentences."""
    translator = TorchTranslator.load(None, trained_run.folder, torch.device("cpu"))
    return dict(zip([FIRST, SECOND], translator.translate_best([FIRST, SECOND], DecodingOptions())))


ROOT = Path(__file__).resolve().parents[1]


def experiment(run) -> list[str]:
    return ["--datasource", str(run.datasource), "--model_folder", str(run.model_folder)]


def run_main(capsys: pytest.CaptureFixture, argv: list[str]) -> tuple[int, list[str], list[str]]:
    try:
        code = translate.main(argv)
    except SystemExit as stop:  # argparse errors
        code = stop.code
    captured = capsys.readouterr()
    return code, captured.out.splitlines(), captured.err.strip().splitlines()


def test_sentences_as_arguments(trained_run, expected: dict[str, str], capsys: pytest.CaptureFixture) -> None:
    code, out, err = run_main(capsys, experiment(trained_run) + [FIRST, SECOND])
    assert code == 0
    assert out == [expected[FIRST], expected[SECOND]]
    assert len(err) == 1 and err[0].startswith("translate.py: using ")


def test_missing_checkpoint_is_one_line(tmp_path: Path, trained_run, capsys: pytest.CaptureFixture) -> None:
    code, out, err = run_main(capsys, ["--datasource", str(trained_run.datasource), "--model_folder",
                                       str(tmp_path / "empty"), FIRST])
    assert code == 1 and out == []
    assert len(err) == 1 and "no usable checkpoint" in err[0] and "--checkpoint" in err[0]
    code, out, err = run_main(capsys, ["--checkpoint", str(tmp_path / "nope.pt"), FIRST])
    assert code == 1 and out == [] and len(err) == 1 and "nope.pt does not exist" in err[0]


@pytest.mark.parametrize("sentences", [[""], ["   "], [FIRST, ""]])
def test_empty_sentence_is_one_line(trained_run, capsys: pytest.CaptureFixture, sentences: list[str]) -> None:
    code, out, err = run_main(capsys, experiment(trained_run) + sentences)
    assert code == 2 and out == []
    assert len(err) == 1 and f"sentence {len(sentences)} is empty" in err[0]


def test_bad_option_is_one_line(trained_run, capsys: pytest.CaptureFixture) -> None:
    code, out, err = run_main(capsys, experiment(trained_run) + ["--beam_size", "0", FIRST])
    assert code == 2 and out == [] and len(err) == 1 and "--beam_size" in err[0]


def test_a_sentence_over_the_limit_is_translated_in_pieces(trained_run, capsys: pytest.CaptureFixture) -> None:
    """No truncation: every piece of a sentence over the model's limit is translated, the pieces'
    translations are joined on the one output line, and the count goes to stderr."""
    long_sentence = " ".join(["the big black cat sees the small white dog"] * 20) + "."
    translator = TorchTranslator.load(None, trained_run.folder, torch.device("cpu"))
    plan, _ = translator.segment_lines([long_sentence], "", split_sentences=True)
    assert len(plan.sources) >= 3
    code, out, err = run_main(capsys, experiment(trained_run) + [long_sentence])
    assert code == 0 and out == [" ".join(translator.translate_best(plan.sources, DecodingOptions()))]
    assert err[1:] == [f"translate.py: 1 sentence(s) over the model's limit of {translator.max_source_tokens} "
                       f"tokens translated in pieces"]


def test_stdin_batch_mode_translates_the_good_lines(trained_run, expected: dict[str, str], cli) -> None:
    stdin = f"{FIRST}\n\n".encode() + b"caf\xe9 latte\n" + f"{SECOND}\n".encode()
    result = cli("translate.py", *experiment(trained_run), stdin=stdin)
    assert result.returncode == 1  # a line could not be read
    assert "Traceback" not in result.stderr
    # one output line per input line, so outputs stay aligned with inputs; the blank line is text
    assert result.stdout.split("\n") == [expected[FIRST], "", "", expected[SECOND], ""]
    assert "line 3: not valid UTF-8" in result.stderr and "line 2" not in result.stderr


@pytest.mark.parametrize("split_sentences", ["true", "false"])
def test_text_keeps_its_shape(trained_run, capsys: pytest.CaptureFixture, split_sentences: str) -> None:
    """Indentation, the spacing between sentences, blank and whitespace-only lines come back as they
    were, one output line per input line; with segmentation on each sentence is translated on its
    own, off the line is one sentence. Exit 0: blank lines are text."""
    lines = [f"  {FIRST}   {SECOND}", "", f"\t{SECOND}", "   "]
    stdin = io.TextIOWrapper(io.BytesIO("".join(line + "\n" for line in lines).encode()), encoding="utf-8")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "stdin", stdin)
        code, out, err = run_main(capsys, experiment(trained_run) + ["--split_sentences", split_sentences])
    translator = TorchTranslator.load(None, trained_run.folder, torch.device("cpu"))
    first, second = translator.translate_best([FIRST, SECOND], DecodingOptions())
    paragraph = f"{first}   {second}" if split_sentences == "true" else \
        translator.translate_best([f"{FIRST}   {SECOND}"], DecodingOptions())[0]
    assert (code, out) == (0, [f"  {paragraph}", "", f"\t{second}", "   "])
    assert len(err) == 1


def test_a_line_past_max_line_bytes_is_translated_in_pieces_onto_one_line(trained_run, expected: dict[str, str],
                                                                          capsys, monkeypatch) -> None:
    """Read in pieces of at most --max_line_bytes cut at whitespace (kept with the piece), each
    translated, their translations joined: the lines after it stay aligned with their inputs."""
    long_line = " ".join([FIRST] * 60)  # 1,319 bytes
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(f"{long_line}\n{SECOND}\n".encode())))
    translated: list[str] = []
    real = TorchTranslator.translate_text
    monkeypatch.setattr(TorchTranslator, "translate_text", lambda self, texts, options, split_sentences:
                        translated.extend(texts) or real(self, texts, options, split_sentences))
    code, out, err = run_main(capsys, experiment(trained_run) + ["--max_line_bytes", "256"])
    assert code == 0 and len(out) == 2 and out[1] == expected[SECOND], (out, err)
    assert max(len(text.encode()) for text in translated) <= 256 and "".join(translated[:-1]) == long_line
    assert len(out[0].split()) > len(translated[0].split())  # the pieces' translations, one after the other


def test_input_pieces_hold_no_line_whole(tmp_path: Path) -> None:
    """The issue's 54 MB line made translate.py hold 5.36 GB to translate 62 tokens: here a 24 MB line
    is read in pieces of 64 KiB, with the reading's Python allocations under 1 MB."""
    import tracemalloc
    path = tmp_path / "input.txt"
    path.write_bytes(b"word " * 4_800_000 + b"\nShort.\n")
    tracemalloc.start()
    try:
        with open(path, "rb") as stream:
            pieces = sum(1 for _ in translate.input_pieces(stream, 65536))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert pieces == 24_000_000 // 65536 + 2 and peak < 1 << 20, (pieces, peak)
    ends = [ends for _, ends in translate.input_pieces(io.BytesIO(b"a b\n\n" + b"x" * 100 + b"\n"), 64)]
    assert ends == [True, True, False, True]


def test_checkpoint_path_written_on_a_gpu(trained_run, expected: dict[str, str], tmp_path: Path,
                                          save_as_if_from_cuda, capsys: pytest.CaptureFixture) -> None:
    """--checkpoint with a file outside any experiment folder (no manifest), whose tensors are
    recorded as cuda:0: the model is rebuilt from the config inside it, on the CPU."""
    latest, state = trained_run.latest()
    moved = tmp_path / "elsewhere" / "from_gpu.pt"
    moved.parent.mkdir()
    save_as_if_from_cuda(state, moved)
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="CUDA"):
            torch.load(moved, weights_only=True)
    # no --datasource/--model_folder: the checkpoint alone defines the model and tokenizers
    code, out, err = run_main(capsys, ["--checkpoint", str(moved), FIRST])
    assert code == 0 and out == [expected[FIRST]]
    assert err == [f"translate.py: using {moved}"]


# ---------------------------------------------------------------------------- documents

SUBTITLES = ("1\n00:00:01,000 --> 00:00:02,500\nThe cat sees the dog.\n\n"
             "2\n00:00:03,000 --> 00:00:04,000\nThe dog eats\nthe bread.\n")
MARKDOWN = ("# The red house.\n\nThe cat sees the [dog](https://example.org/dog). The dog eats the bread.\n\n"
            "```python\nprint(\"The cat.\")\n```\n")


@pytest.mark.parametrize("name, text, kept", [
    ("film.srt", SUBTITLES, ["1\n00:00:01,000 --> 00:00:02,500\n", "\n\n2\n00:00:03,000 --> 00:00:04,000\n"]),
    ("notes.md", MARKDOWN, ["# ", "](https://example.org/dog)", "```python\nprint(\"The cat.\")\n```\n"])])
def test_documents_through_input_and_output(trained_run, capsys: pytest.CaptureFixture, tmp_path: Path, name: str,
                                            text: str, kept: list[str]) -> None:
    """A document in its format (from its name), translated in its shape to --output: what its
    format keeps is there as it was, and the text is what documents.py makes of the translator's
    sentences."""
    source, target = tmp_path / name, tmp_path / f"out-{name}"
    source.write_text(text, encoding="utf-8")
    code, out, err = run_main(capsys, experiment(trained_run) + ["--input", str(source), "--output", str(target)])
    assert (code, out) == (0, []) and err[-1] == f"translate.py: wrote {target} ({documents.document_format(name)})"
    translated = target.read_text(encoding="utf-8")
    translator = TorchTranslator.load(None, trained_run.folder, torch.device("cpu"))
    # the translator's own document path: a Markdown link placed by the model's attention
    assert translated == translator.translate_document(text, documents.document_format(name), DecodingOptions(),
                                                       True)[0]
    assert translated != text and all(part in translated for part in kept)
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted([name, f"out-{name}"])  # no temporary left


def test_an_html_page_through_input_keeps_its_markup_and_places_its_inline_tag(
        trained_run, capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    """translate.py --input page.html: the head, attributes, comment and script as they were, the
    <b> placed by the model's attention (Translator.translate_document, as serve.py places it)."""
    page = ('<!DOCTYPE html><html><head><title>The red house.</title><script>var a = "<b>";</script></head>'
            '<body><p class="x">The cat sees the <b>dog</b>.</p><!-- keep --></body></html>')
    source, target = tmp_path / "page.html", tmp_path / "page.it.html"
    source.write_text(page, encoding="utf-8")
    code, out, err = run_main(capsys, experiment(trained_run) + ["--input", str(source), "--output", str(target)])
    assert (code, out) == (0, []) and err[-1] == f"translate.py: wrote {target} (html)"
    translated = target.read_text(encoding="utf-8")
    translator = TorchTranslator.load(None, trained_run.folder, torch.device("cpu"))
    assert translated == translator.translate_document(page, "html", DecodingOptions(), True)[0]
    assert translated.startswith('<!DOCTYPE html><html><head><title>') and translated.count("<b>") == 2
    assert '<script>var a = "<b>";</script>' in translated and '<p class="x">' in translated
    assert translated.endswith("</p><!-- keep --></body></html>") and "The cat" not in translated


def test_document_options_are_checked_in_one_line(trained_run, capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    source = tmp_path / "report.docx"
    source.write_text(FIRST, encoding="utf-8")
    for extra, message in ((["--format", "docx"], "unknown document format 'docx' (known: text, srt, markdown, html)"),
                           ([], f"cannot tell the format of {source} from its name"),
                           (["--format", "text", "--output", str(source)], f"--output {source} is the input"),
                           (["--format", "text", FIRST], "not with sentence arguments")):
        code, out, err = run_main(capsys, experiment(trained_run) + ["--input", str(source), *extra])
        assert (code, out, len(err)) == (2, [], 1) and message in err[0], extra
    code, out, err = run_main(capsys, experiment(trained_run) + ["--format", "srt", FIRST])
    assert (code, out, len(err)) == (2, [], 1) and "--output and --format go with --input FILE" in err[0]
    assert source.read_text(encoding="utf-8") == FIRST


# ---------------------------------------------------------------------------- n-best, sampling, streaming

def test_n_best_lines_are_numbered_scored_and_ranked(trained_run, capsys: pytest.CaptureFixture) -> None:
    """LINE.SENTENCE with segmentation on, LINE with it off; blank lines get no hypothesis."""
    found = {}
    for split_sentences in ("true", "false"):
        stdin = io.TextIOWrapper(io.BytesIO(f"{FIRST}\n\n{FIRST} {SECOND}\n".encode()), encoding="utf-8")
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(sys, "stdin", stdin)
            code, out, err = run_main(capsys, experiment(trained_run) + ["--beam_size", "4", "--n_best", "3",
                                                                         "--split_sentences", split_sentences])
        assert code == 0, err
        found[split_sentences] = [line.split("\t") for line in out]
    assert [label for label, _, _ in found["true"]] == ["1.1"] * 3 + ["3.1"] * 3 + ["3.2"] * 3
    assert [label for label, _, _ in found["false"]] == ["1"] * 3 + ["3"] * 3
    for rows in found.values():
        for label in {label for label, _, _ in rows}:
            scores = [float(score) for n, score, _ in rows if n == label]
            assert scores == sorted(scores, reverse=True) and all(score < 0 for score in scores)
            assert len({text for n, _, text in rows if n == label}) == 3
    translator = TorchTranslator.load(None, trained_run.folder, torch.device("cpu"))
    best = translator.translate([FIRST, SECOND], DecodingOptions(beam_size=4, n_best=3))
    assert [(text, score) for _, score, text in found["true"]] == \
        [(h.text, f"{h.score:.4f}") for h in best[0] + best[0] + best[1]]


def test_brevity_penalty_expects_the_models_length_ratio_unless_told(trained_run,
                                                                     capsys: pytest.CaptureFixture) -> None:
    translator = TorchTranslator.load(None, trained_run.folder, torch.device("cpu"))
    assert translator.length_ratio == translator.model_config["length_ratio"] > 0  # train.py measured it
    found = {}
    for extra, ratio in (([], translator.length_ratio), (["--length_ratio", "3"], 3.0)):
        code, out, _ = run_main(capsys, experiment(trained_run) + ["--beam_size", "4", "--n_best", "2",
                                                                   "--brevity_penalty", "1", *extra, FIRST])
        assert code == 0
        translator.length_ratio = ratio
        best = translator.translate([FIRST], DecodingOptions(beam_size=4, n_best=2, brevity_penalty=1.0))[0]
        found[ratio] = [(text, score) for _, score, text in (line.split("\t") for line in out)]
        assert found[ratio] == [(h.text, f"{h.score:.4f}") for h in best]
    assert found[3.0] != found[translator.model_config["length_ratio"]], "premise: a ratio of 3 penalises"


def test_sampling_is_reproducible_with_seed(trained_run, capsys: pytest.CaptureFixture) -> None:
    sample = experiment(trained_run) + ["--sampling_topk", "8", "--temperature", "1.5", "--n_best", "5", FIRST]
    first = run_main(capsys, sample + ["--seed", "1"])
    assert first[0] == 0 and len(first[1]) == 5
    assert run_main(capsys, sample + ["--seed", "1"])[1] == first[1]
    assert run_main(capsys, sample + ["--seed", "2"])[1] != first[1]
    code, out, err = run_main(capsys, experiment(trained_run) + ["--sampling_topp", "0.9", "--beam_size", "3", FIRST])
    assert code == 2 and out == [] and len(err) == 1 and "needs --beam_size 1" in err[0]


def test_stdin_is_translated_and_flushed_chunk_by_chunk(trained_run, expected: dict[str, str]) -> None:
    """Output arrives while standard input is still open (nothing waits for its end), and a run
    killed with SIGKILL leaves only complete lines."""
    process = subprocess.Popen([sys.executable, "translate.py", *experiment(trained_run), "--chunk_size", "2"],
                               cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    output: queue.Queue[bytes] = queue.Queue()
    reader = threading.Thread(target=lambda: [output.put(line) for line in iter(process.stdout.readline, b"")],
                              daemon=True)
    reader.start()
    try:
        process.stdin.write(f"{FIRST}\n{SECOND}\n".encode())
        process.stdin.flush()
        first_chunk = [output.get(timeout=60).decode().rstrip("\n") for _ in range(2)]  # stdin is still open
        assert first_chunk == [expected[FIRST], expected[SECOND]]
        process.stdin.write(f"{FIRST}\n".encode() * 40)
        process.stdin.flush()
        output.get(timeout=60)
    finally:
        process.kill()
        process.wait(timeout=30)
    reader.join(timeout=30)
    lines = []
    while not output.empty():
        lines.append(output.get())
    assert all(line.endswith(b"\n") for line in lines), "a killed run leaves whole lines"


def test_a_closed_pipe_ends_quietly_with_141(trained_run, expected: dict[str, str]) -> None:
    """`translate.py < input | head -1`: head exits after its line, and translate.py's next write
    meets a closed pipe. It stops as a Unix tool killed by SIGPIPE would look to a shell (141),
    without a traceback or an 'Exception ignored' message at exit. Input is given only once head
    has gone, so the next write is sure to meet the closed pipe, however loaded the machine."""
    read_end, write_end = os.pipe()
    process = subprocess.Popen([sys.executable, "translate.py", *experiment(trained_run), "--chunk_size", "1"],
                               cwd=ROOT, stdin=subprocess.PIPE, stdout=write_end, stderr=subprocess.PIPE)
    head = subprocess.Popen(["head", "-1"], stdin=read_end, stdout=subprocess.PIPE)
    os.close(read_end)
    os.close(write_end)
    try:
        process.stdin.write(f"{FIRST}\n".encode())
        process.stdin.flush()
        first_line, _ = head.communicate(timeout=120)
        _, stderr = process.communicate(f"{SECOND}\n".encode() * 5, timeout=120)
    finally:
        process.kill()
        head.kill()
    assert first_line.decode().splitlines() == [expected[FIRST]]
    assert process.returncode == translate.EXIT_CLOSED_PIPE == 141
    lines = stderr.decode().splitlines()
    assert len(lines) == 1 and lines[0].startswith("translate.py: using "), lines


def test_a_closed_stdout_ends_quietly_with_141(trained_run) -> None:
    """`translate.py "x" >&-`: Python starts with no sys.stdout; the run ends at once as for a closed
    pipe, before the model loads, with nothing on stderr."""
    process = subprocess.run([sys.executable, "translate.py", *experiment(trained_run), FIRST], cwd=ROOT,
                             stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, preexec_fn=lambda: os.close(1),
                             timeout=120)
    assert (process.returncode, process.stderr) == (141, b"")


def test_a_model_of_several_targets_needs_target_lang(several_targets, capsys: pytest.CaptureFixture) -> None:
    sentences = ["the cat sees the dog .", "a red house ."]
    code, out, err = run_main(capsys, several_targets.args + sentences)
    assert (code, out) == (1, [])
    assert err == ["translate.py: error: this model translates into fr, it: choose one with target_lang"]
    code, out, err = run_main(capsys, several_targets.args + ["--target_lang", "fr", *sentences])
    assert code == 0, err
    assert out == several_targets.translator().translate_best(sentences, DecodingOptions(target_lang="fr"))
    assert err == [f"translate.py: using {several_targets.checkpoint}, translating into fr"]
    code, out, err = run_main(capsys, ["--checkpoint", str(several_targets.checkpoint), "--lang_tgt", "fr",
                                       sentences[0]])
    assert (code, out) == (1, [])
    assert err == ["translate.py: error: --lang_tgt fr does not match the model's fr+it: it translates into several "
                   "languages, named by all of them: --lang_tgt fr+it --target_lang fr"]


def test_glossary_terms_are_in_their_sentences_and_free_lines_as_without(trained_run, expected: dict[str, str],
                                                                         capsys: pytest.CaptureFixture,
                                                                         tmp_path: Path) -> None:
    """Every term of every sentence (segmented: two in one line) is in that sentence, before its end;
    a line without a term comes out as without the glossary."""
    glossary = tmp_path / "terms.tsv"
    glossary.write_text("dog\tpesce\nBread\tlibro\n", encoding="utf-8")
    code, out, err = run_main(capsys, experiment(trained_run) + ["--glossary", str(glossary),
                                                                 f"{SECOND} The red dog.", FIRST.replace("dog", "cat")])
    assert code == 0 and len(err) == 2 and "beam size 10 (glossary_beam_size), the others with 5" in err[1], err
    first_sentence, second_sentence = out[0].split(". ", 1)
    assert {"pesce", "libro"} <= set(first_sentence.split()) and "pesce" in second_sentence.rstrip(".").split()
    plain = TorchTranslator.load(None, trained_run.folder, torch.device("cpu"))
    assert out[1] == plain.translate_best([FIRST.replace("dog", "cat")], DecodingOptions())[0]


def test_a_glossary_with_greedy_search_widens_its_sentences_and_says_so_once(trained_run, capsys: pytest.CaptureFixture,
                                                                  tmp_path: Path) -> None:
    glossary = tmp_path / "terms.tsv"
    glossary.write_text("dog\tpesce\n", encoding="utf-8")
    code, out, err = run_main(capsys, experiment(trained_run) + ["--glossary", str(glossary), "--beam_size", "1",
                                                                 FIRST, SECOND])
    assert code == 0 and all("pesce" in line for line in out)
    assert err[1:] == ["translate.py: sentences holding a glossary term are searched with beam size 10 "
                       "(glossary_beam_size), the others with 1"]


@pytest.mark.parametrize("terms, options, message", [
    ("dog\t猫\n", [], "the target term '猫' cannot be spelled by the model's vocabulary: '猫' is unknown to it"),
    ("dog\tpesce\n", ["--sampling_topk", "3"], "sampling takes none"),
    ("dog\n", [], "terms.tsv:1: expected 2 tab-separated columns"),
])
def test_a_glossary_it_cannot_use_is_one_line(trained_run, capsys: pytest.CaptureFixture, tmp_path: Path,
                                              terms: str, options: list[str], message: str) -> None:
    glossary = tmp_path / "terms.tsv"
    glossary.write_text(terms, encoding="utf-8")
    code, out, err = run_main(capsys, experiment(trained_run) + ["--glossary", str(glossary), *options, FIRST])
    assert code == 2 and out == [] and message in err[-1] and not any("Traceback" in line for line in err)


def test_scores_without_a_calibrator_is_one_line(trained_run, capsys: pytest.CaptureFixture) -> None:
    """The trained run's validation split (16 sentences) is too small to fit one: training said so
    in one warning line, and --scores says there is none."""
    assert [line for line in trained_run.second.stderr.splitlines() if "confidence" in line] == \
        ["warning: no confidence calibrator: calibration needs at least 20 sentences, got 16"]
    code, out, err = run_main(capsys, experiment(trained_run) + ["--scores", FIRST])
    assert code == 2 and out == [] and "has no confidence calibrator; fit one with evaluate.py --fit_confidence" \
        in err[-1]


def test_a_language_flag_that_matches_the_only_run_finds_it(trained_run, expected: dict[str, str],
                                                            capsys: pytest.CaptureFixture) -> None:
    """--lang_src en names the only run (en->it) without its --datasource: the run, not opus_books_en-it."""
    code, out, err = run_main(capsys, ["--model_folder", str(trained_run.model_folder), "--lang_src", "en", FIRST])
    assert (code, out) == (0, [expected[FIRST]]) and "using the only run under" in err[0]
    code, out, err = run_main(capsys, ["--model_folder", str(trained_run.model_folder), "--lang_src", "fr", FIRST])
    assert (code, out) == (2, []) and len(err) == 1
    assert f"matches --lang_src fr: the only run there is {trained_run.folder.name} (en->it from" in err[0]


def test_a_calibrator_that_cannot_be_used_is_one_warning(trained_run, bad_calibrator_run: tuple[Path, str],
                                                         expected: dict[str, str],
                                                         capsys: pytest.CaptureFixture) -> None:
    """A truncated or hand-edited confidence.json: the model translates, said once on stderr; --scores
    says in one line why there is no confidence."""
    folder, problem = bad_calibrator_run
    model = ["--datasource", str(trained_run.datasource), "--model_folder", str(folder.parent)]
    code, out, err = run_main(capsys, model + [FIRST])
    assert (code, out) == (0, [expected[FIRST]])
    [warning] = [line for line in err if "confidence" in line]
    assert warning.startswith(f"warning: {problem}")
    assert warning.endswith(": translating without confidence (fit it again with evaluate.py --fit_confidence)")
    code, out, err = run_main(capsys, model + ["--scores", FIRST])
    assert (code, out, len(err)) == (2, [], 1) and f"error: --scores: {problem}" in err[0]
    assert err[0].endswith("; fit it again with evaluate.py --fit_confidence (see --help)")


def test_confidence_is_computed_only_with_scores(trained_run, expected: dict[str, str], capsys: pytest.CaptureFixture,
                                                tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run with a calibrator, on each engine: without --scores no hypothesis is calibrated (nor
    scored again by CTranslate2, which costs more than its search), and the translations are the
    ones --scores prints beside its confidence."""
    import export
    from conftest import GOOD_CALIBRATOR
    folder = tmp_path / "weights" / trained_run.folder.name
    shutil.copytree(trained_run.folder, folder, ignore=shutil.ignore_patterns("*.lock"))
    (folder / "confidence.json").write_text(json.dumps(GOOD_CALIBRATOR), encoding="utf-8")
    model = ["--datasource", str(trained_run.datasource), "--model_folder", str(folder.parent)]
    assert export.main(model + ["--quantization", "float32", "--output", str(tmp_path / "ct2")]) == 0
    calls: list[str] = []
    calibrated, rescored = Translator.calibrated, CTranslate2Translator.token_log_probs
    monkeypatch.setattr(Translator, "calibrated", lambda self, *args: calls.append("calibrated") or
                        calibrated(self, *args))
    monkeypatch.setattr(CTranslate2Translator, "token_log_probs", lambda self, *args: calls.append("rescored") or
                        rescored(self, *args))
    engines = {"pytorch": model, "ctranslate2": ["--engine", "ctranslate2", "--model_dir", str(tmp_path / "ct2")]}
    for engine, arguments in engines.items():
        code, plain, _ = run_main(capsys, arguments + [FIRST, SECOND])
        assert code == 0 and calls == [] and (engine != "pytorch" or plain == [expected[FIRST], expected[SECOND]])
        code, rows, _ = run_main(capsys, arguments + ["--scores", FIRST, SECOND])
        assert code == 0 and [row.split("\t")[2] for row in rows] == plain
        assert all(0 <= float(row.split("\t")[1]) <= 1 for row in rows)
        assert set(calls) == {"calibrated", *(["rescored"] if engine == "ctranslate2" else [])}
        calls.clear()


def test_an_attention_plot_without_matplotlib_is_one_line_after_the_translations(
        trained_run, expected: dict[str, str], capsys: pytest.CaptureFixture, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # what an import of a missing package raises
    code, out, err = run_main(capsys, experiment(trained_run) + ["--plot_attention", str(tmp_path / "a.png"), FIRST])
    assert (code, out) == (1, [expected[FIRST]]) and not (tmp_path / "a.png").exists()
    assert err[-1].startswith("translate.py: error: cannot draw the attention plot: ") and "Traceback" not in err[-1]
