"""translator.py: the PyTorch engine keeps the input order across length-sorted batches, truncates
over-long sources with a warning, returns n-best lists and samples, and refuses options it cannot
decode with. (The CTranslate2 engine is checked against it in tests/test_export.py.)"""
from __future__ import annotations

import pytest

from translator import DecodingOptions, TranslatorError


@pytest.fixture(scope="module")
def mixed_lengths(toy_translator) -> list[str]:
    return [s for s, _ in toy_translator.pairs(24, seed=7)]


def test_batches_keep_the_input_order(toy_translator, mixed_lengths: list[str]) -> None:
    translator = toy_translator.translator()
    together = translator.translate_best(mixed_lengths, DecodingOptions(batch_size=5))
    one_by_one = [translator.translate_best([s], DecodingOptions())[0] for s in mixed_lengths]
    assert together == one_by_one
    expected = dict(toy_translator.pairs(24, seed=7))
    assert sum(out == expected[s] for s, out in zip(mixed_lengths, together)) >= 22
    beam = translator.translate_best(mixed_lengths, DecodingOptions(beam_size=3, batch_size=5))
    assert sum(a == b for a, b in zip(beam, together)) >= 22
    assert translator.translate([], DecodingOptions()) == []
    assert not toy_translator.model.training


def test_n_best_and_samples(toy_translator, mixed_lengths: list[str]) -> None:
    translator = toy_translator.translator()
    best = translator.translate(mixed_lengths[:4], DecodingOptions(beam_size=4, n_best=3))
    assert [len(h) for h in best] == [3, 3, 3, 3]
    for hypotheses in best:
        assert [h.score for h in hypotheses] == sorted((h.score for h in hypotheses), reverse=True)
        assert len({h.text for h in hypotheses}) == 3
    options = DecodingOptions(sampling_topk=4, temperature=1.5, n_best=5)
    first = translator.translate(mixed_lengths[:4], options)
    assert [len(h) for h in first] == [5, 5, 5, 5]
    assert toy_translator.translator().translate(mixed_lengths[:4], options) == first  # same seed, same samples
    assert translator.translate(mixed_lengths[:4], options) != first  # the stream goes on


def test_too_long_source_is_truncated_with_a_warning(toy_translator, capsys: pytest.CaptureFixture) -> None:
    translator = toy_translator.translator()
    words = ("one two three four five six seven eight " * 4).split()
    long_sentence, fitting = " ".join(words), " ".join(words[:toy_translator.seq_len - 2])
    out = translator.translate_best([long_sentence, "one two three."], DecodingOptions())
    err = capsys.readouterr().err
    assert "warning: truncated 1 source sentence(s)" in err and f"{toy_translator.seq_len - 2} tokens" in err
    assert out[0] == translator.translate_best([fitting], DecodingOptions())[0]
    assert out[1] == "tre due uno."
    assert capsys.readouterr().err == ""  # the fitting sentence alone triggers no warning


@pytest.mark.parametrize("options, message", [
    (dict(beam_size=2, n_best=3), "n_best 3 needs a beam"),
    (dict(beam_size=2, sampling_topk=5), "needs beam_size 1"),
    (dict(beam_size=0), "at least 1"),
])
def test_options_it_cannot_decode_with_are_refused(options: dict, message: str) -> None:
    with pytest.raises(TranslatorError, match=message):
        DecodingOptions().replace(**options)
