"""Documents as people save them, end to end through translate.py --input: UTF-8 with a byte-order
mark and CRLF endings comes back with both, in every format; a file that is not UTF-8 is refused in
one line before a model loads."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from nmt.inference import documents
from nmt.inference.translator import DecodingOptions, TorchTranslator
from test_translate import experiment, run_main

# each document, and what its format keeps
DOCUMENTS = {"notes.md": ('# The red house.\r\n\r\nThe cat sees the [dog](<docs/the dog.html> "The dog").\r\n',
                          ['](<docs/the dog.html> "The dog")']),  # the full stop is the sentence's
             "film.srt": ("1\r\n00:00:01,000 --> 00:00:02,500\r\nThe cat sees the dog.\r\n",
                          ["\ufeff1\r\n00:00:01,000 --> 00:00:02,500\r\n"]),
             "plain.txt": ("The cat sees the dog.\r\n\r\nThe dog eats the bread.\r\n", ["\r\n\r\n"])}


@pytest.mark.parametrize("name", sorted(DOCUMENTS))
def test_a_document_with_a_byte_order_mark_comes_back_with_it(trained_run, capsys: pytest.CaptureFixture,
                                                             tmp_path: Path, name: str) -> None:
    source, target = tmp_path / name, tmp_path / f"out-{name}"
    text, kept = "\ufeff" + DOCUMENTS[name][0], DOCUMENTS[name][1]
    source.write_bytes(text.encode("utf-8"))
    code, out, err = run_main(capsys, experiment(trained_run) + ["--input", str(source), "--output", str(target)])
    assert (code, out) == (0, []), err
    translated = target.read_bytes().decode("utf-8")
    translator = TorchTranslator.load(None, trained_run.folder, torch.device("cpu"))
    # the translator's own document path: a Markdown link placed by the model's attention
    assert translated == translator.translate_document(text, documents.document_format(name), DecodingOptions(),
                                                       True)[0]
    assert translated.startswith("\ufeff") and translated.count("\ufeff") == 1
    assert translated.count("\r\n") == text.count("\r\n") and translated != text
    assert all(part in translated for part in kept)


@pytest.mark.parametrize("data, byte", [("The caf\xe9 is open.\n".encode("latin-1"), 7),
                                        ("\ufeffThe cat.\n".encode("utf-16"), 0)])
def test_a_document_that_is_not_utf8_is_refused_in_one_line(trained_run, capsys: pytest.CaptureFixture,
                                                            tmp_path: Path, data: bytes, byte: int) -> None:
    source = tmp_path / "notes.md"
    source.write_bytes(data)
    code, out, err = run_main(capsys, experiment(trained_run) + ["--input", str(source), "--output",
                                                                 str(tmp_path / "out.md")])
    assert (code, out, len(err)) == (2, [], 1)
    assert f"--input {source} is not valid UTF-8 (byte {byte})" in err[0]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["notes.md"]
