"""decoding.py: the KV cache changes nothing, beam 1 is greedy, raw text keeps its order and
over-long sources are truncated with a warning."""
from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from decoding import beam_search, encode_sources, greedy_decode, max_output_tokens, translate_sentences
from model import build_transformer, causal_mask
from tokenizer import EOS_ID, PAD_ID, SOS_ID


def source_batch(toy, sentences: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    rows = encode_sources(toy.tok_src, sentences, toy.seq_len)
    src = torch.full((len(rows), max(map(len, rows))), PAD_ID)
    for i, row in enumerate(rows):
        src[i, :len(row)] = torch.tensor(row)
    return src, (src != PAD_ID)[:, None, None, :]


@pytest.fixture(scope="module")
def mixed_lengths(toy_translator) -> list[str]:
    """Sentences of 3 to 8 words, shuffled, so rows finish at different steps."""
    return [s for s, _ in toy_translator.pairs(24, seed=7)]


def test_cached_greedy_equals_uncached_greedy(toy_translator, mixed_lengths: list[str]) -> None:
    src, src_mask = source_batch(toy_translator, mixed_lengths)
    cached = greedy_decode(toy_translator.model, src, src_mask, max_tokens=20)
    uncached = greedy_decode(toy_translator.model, src, src_mask, max_tokens=20, use_cache=False)
    assert cached == uncached
    assert len({len(tokens) for tokens in cached}) >= 4  # rows really finished at different steps
    assert all(EOS_ID not in tokens and SOS_ID not in tokens for tokens in cached)
    # a sentence decodes the same alone as in a padded batch
    for row in (0, 5, 11):
        alone_src, alone_mask = source_batch(toy_translator, [mixed_lengths[row]])
        assert greedy_decode(toy_translator.model, alone_src, alone_mask, max_tokens=20)[0] == cached[row]


def test_cache_gives_the_same_states_as_full_decoding() -> None:
    """On a random model that never emits EOS: every cached step equals the full recomputation."""
    torch.manual_seed(3)
    model = build_transformer(17, 19, 40, 40, d_model=16, N=2, h=2, dropout=0.0, d_ff=32).eval()
    src = torch.tensor([[2, 5, 6, 7, 8, 3], [2, 9, 3, PAD_ID, PAD_ID, PAD_ID]])
    src_mask = (src != PAD_ID)[:, None, None, :]
    with torch.no_grad():
        memory = model.encode(src, src_mask)
        tgt = torch.randint(4, 19, (2, 12))
        tgt[:, 0] = SOS_ID
        full = model.decode(memory, src_mask, tgt, causal_mask(12)[None])
        cache = model.new_cache()
        steps = [model.decode(memory, src_mask, tgt[:, i:i + 1], None, cache) for i in range(12)]
    assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        model.projection_layer.proj.bias[EOS_ID] = -1e4  # never stop: exercise the full length
    cached = greedy_decode(model, src, src_mask, max_tokens=30)
    assert cached == greedy_decode(model, src, src_mask, max_tokens=30, use_cache=False)
    assert [len(t) for t in cached] == [30, 30]


def test_beam_size_one_equals_greedy(toy_translator, mixed_lengths: list[str]) -> None:
    src, src_mask = source_batch(toy_translator, mixed_lengths)
    greedy = greedy_decode(toy_translator.model, src, src_mask, max_tokens=20)
    beams = beam_search(toy_translator.model, src, src_mask, max_tokens=20, beam_size=1)
    assert [hyps[0][0] for hyps in beams] == greedy
    # also when every sentence runs out of tokens before EOS
    short = greedy_decode(toy_translator.model, src, src_mask, max_tokens=3)
    assert [h[0][0] for h in beam_search(toy_translator.model, src, src_mask, 3, beam_size=1)] == short


def test_beam_search_returns_ranked_distinct_hypotheses(toy_translator, mixed_lengths: list[str]) -> None:
    src, src_mask = source_batch(toy_translator, mixed_lengths[:6])
    results = beam_search(toy_translator.model, src, src_mask, max_tokens=20, beam_size=4, n_best=3)
    greedy = greedy_decode(toy_translator.model, src, src_mask, max_tokens=20)
    for hyps, best_greedy in zip(results, greedy):
        assert len(hyps) == 3
        scores = [score for _, score in hyps]
        assert scores == sorted(scores, reverse=True)
        assert len({tuple(tokens) for tokens, _ in hyps}) == 3
        assert hyps[0][0] == best_greedy  # a confident model: the wider search agrees


def test_translate_sentences_keeps_the_input_order(toy_translator, mixed_lengths: list[str]) -> None:
    toy = toy_translator
    together = translate_sentences(toy.model, toy.tok_src, toy.tok_tgt, mixed_lengths, toy.seq_len, batch_size=5)
    one_by_one = [translate_sentences(toy.model, toy.tok_src, toy.tok_tgt, [s], toy.seq_len)[0]
                  for s in mixed_lengths]
    assert together == one_by_one
    expected = dict(toy.pairs(24, seed=7))
    assert sum(out == expected[s] for s, out in zip(mixed_lengths, together)) >= 22
    beam = translate_sentences(toy.model, toy.tok_src, toy.tok_tgt, mixed_lengths, toy.seq_len, batch_size=5,
                               beam_size=3)
    assert sum(a == b for a, b in zip(beam, together)) >= 22
    assert translate_sentences(toy.model, toy.tok_src, toy.tok_tgt, [], toy.seq_len) == []
    assert not toy.model.training


def test_too_long_source_is_truncated_with_a_warning(toy_translator, capsys: pytest.CaptureFixture) -> None:
    toy = toy_translator
    words = ("one two three four five six seven eight " * 4).split()
    long_sentence, fitting = " ".join(words), " ".join(words[:toy.seq_len - 2])
    out = translate_sentences(toy.model, toy.tok_src, toy.tok_tgt, [long_sentence, "one two three."], toy.seq_len)
    err = capsys.readouterr().err
    assert "warning: truncated 1 source sentence(s)" in err and f"{toy.seq_len - 2} tokens" in err
    assert out[0] == translate_sentences(toy.model, toy.tok_src, toy.tok_tgt, [fitting], toy.seq_len)[0]
    assert out[1] == "tre due uno."
    assert capsys.readouterr().err == ""  # the fitting sentence alone triggers no warning


def test_max_output_tokens() -> None:
    assert max_output_tokens(5, 256) == 20  # twice the source plus 10
    assert max_output_tokens(200, 256) == 255  # the decoder holds seq_len positions including [SOS]
    assert max_output_tokens(0, 2) == 1
