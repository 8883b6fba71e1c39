"""decoding.py: the KV cache changes nothing, beam search finds what it should and stops when nothing
better can come, finished sentences leave the batch, sampling is reproducible and respects its cuts.

The hand-worked cases use a stub model whose next-token distribution is a fixed table keyed by the
prefix, so every expected hypothesis and score is worked out below.
"""
from __future__ import annotations

import math
import pickle
import random

import pytest
import torch
from torch.testing import assert_close

from conftest import TOY_SOURCE, TOY_TARGET, train_toy
from nmt.inference.decoding import (SentenceConstraints, beam_search, block_repeats, brevity_term, expected_length,
                                    greedy_decode, hypothesis_score, max_output_tokens, repeat_free_ngram_size, sample,
                                    source_token_counts)
from model import KVCache, build_transformer, causal_mask
from nmt.corpora.tokenizer import EOS_ID, PAD_ID, SOS_ID, encode_ids


def source_batch(toy, sentences: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """`sentences` as the translator feeds them to the model: a padded batch and its mask."""
    translator = toy.translator()
    return translator.source_batch(translator.encode(sentences, ""))


def tokens_of(hypotheses: list[tuple[list[int], float]]) -> list[list[int]]:
    return [tokens for tokens, _ in hypotheses]


@pytest.fixture(scope="module")
def mixed_lengths(toy_translator) -> list[str]:
    """Sentences of 3 to 8 words, shuffled, so rows finish at different steps."""
    return [s for s, _ in toy_translator.pairs(24, seed=7)]


# ---------------------------------------------------------------------------- the cache and greedy

def test_cached_greedy_equals_uncached_greedy(toy_translator, mixed_lengths: list[str]) -> None:
    src, src_mask = source_batch(toy_translator, mixed_lengths)
    cached = greedy_decode(toy_translator.model, src, src_mask, max_tokens=20)
    uncached = greedy_decode(toy_translator.model, src, src_mask, max_tokens=20, use_cache=False)
    assert tokens_of(cached) == tokens_of(uncached)
    assert_close(torch.tensor([s for _, s in cached]), torch.tensor([s for _, s in uncached]), rtol=1e-5, atol=1e-6)
    assert len({len(tokens) for tokens, _ in cached}) >= 4  # rows really finished at different steps
    assert all(EOS_ID not in tokens and SOS_ID not in tokens for tokens, _ in cached)
    # a sentence decodes the same alone as in a padded batch
    for row in (0, 5, 11):
        alone_src, alone_mask = source_batch(toy_translator, [mixed_lengths[row]])
        assert greedy_decode(toy_translator.model, alone_src, alone_mask, max_tokens=20)[0][0] == cached[row][0]


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
    assert tokens_of(cached) == tokens_of(greedy_decode(model, src, src_mask, max_tokens=30, use_cache=False))
    assert [len(t) for t, _ in cached] == [30, 30]


def test_several_hypotheses_per_sentence_share_its_cross_attention_cache() -> None:
    """Three hypothesis rows per sentence decode exactly as three copies of the sentence would,
    while the cache holds one cross-attention entry per sentence."""
    torch.manual_seed(4)
    model = build_transformer(17, 19, 40, 40, d_model=16, N=2, h=2, dropout=0.0, d_ff=32).eval()
    src = torch.tensor([[2, 5, 6, 7, 8, 3], [2, 9, 3, PAD_ID, PAD_ID, PAD_ID]])
    src_mask = (src != PAD_ID)[:, None, None, :]
    tgt = torch.randint(4, 19, (6, 5))
    tgt[:, 0] = SOS_ID
    with torch.no_grad():
        memory = model.encode(src, src_mask)
        shared, copies = model.new_cache(), model.new_cache()
        grouped = [model.decode(memory, src_mask, tgt[:, i:i + 1], None, shared) for i in range(5)]
        repeated = [model.decode(memory.repeat_interleave(3, 0), src_mask.repeat_interleave(3, 0), tgt[:, i:i + 1],
                                 None, copies) for i in range(5)]
    assert_close(torch.cat(grouped, 1), torch.cat(repeated, 1), atol=1e-6, rtol=1e-5)
    assert shared.cross_kv[0][0].size(0) == 2 and shared.self_kv[0][0].size(0) == 6


# ---------------------------------------------------------------------------- beam search, by hand

A, B, C = 4, 5, 6
VOCAB = 7


class StubCache:
    """Each row's tokens so far; reordered like the real KV cache."""

    def __init__(self) -> None:
        self.history: torch.Tensor | None = None
        self.length = 0

    def reorder_hypotheses(self, index: torch.Tensor) -> None:
        self.history = self.history.index_select(0, index)

    def keep_sentences(self, index: torch.Tensor) -> None:
        pass


class StubModel(torch.nn.Module):
    """Next-token probabilities looked up by prefix (after [SOS]); unknown prefixes get `default`
    (ending at once unless given). "Hidden states" are the prefixes themselves, so `project` can
    look them up."""

    def __init__(self, table: dict[tuple[int, ...], dict[int, float]], default: dict[int, float] | None = None) -> None:
        super().__init__()
        self.table, self.default = table, default or {EOS_ID: 1.0}
        self.queried: list[tuple[int, ...]] = []
        self.anchor = torch.nn.Parameter(torch.zeros(1))

    def encode(self, src: torch.Tensor, src_mask: torch.Tensor) -> torch.Tensor:
        return torch.zeros(src.size(0), src.size(1), 1)

    def new_cache(self) -> StubCache:
        return StubCache()

    def decode(self, memory, src_mask, tgt, tgt_mask, cache: StubCache) -> torch.Tensor:
        cache.history = tgt if cache.history is None else torch.cat([cache.history, tgt], dim=1)
        cache.length += 1
        return cache.history.unsqueeze(1).float()  # (B, 1, L)

    def project(self, hidden: torch.Tensor) -> torch.Tensor:
        flat = hidden.reshape(-1, hidden.size(-1)).long()
        logits = torch.full((flat.size(0), VOCAB), float("-inf"))
        for row, prefix in enumerate(flat.tolist()):
            prefix = tuple(prefix[1:])  # after [SOS]
            self.queried.append(prefix)
            for token, probability in self.table.get(prefix, self.default).items():
                logits[row, token] = math.log(probability)
        return logits.view(*hidden.shape[:-1], VOCAB)


ONE_SOURCE = (torch.tensor([[SOS_ID, 9, EOS_ID]]), torch.ones(1, 1, 1, 3, dtype=torch.bool))


def run_beam(table, beam_size: int, length_penalty: float, n_best: int = 1, max_tokens: int = 10):
    model = StubModel(table)
    return beam_search(model, *ONE_SOURCE, max_tokens, beam_size, length_penalty, n_best)[0], model


def expected_scores(*items: tuple[float, int]) -> torch.Tensor:
    return torch.tensor([math.log(p) / length for p, length in items], dtype=torch.float64)


def scores_of(hypotheses) -> torch.Tensor:
    return torch.tensor([score for _, score in hypotheses], dtype=torch.float64)


def test_beam_search_finds_the_better_sentence_greedy_misses() -> None:
    # Greedy takes A (0.6), then the best it can do is end: p([A]) = 0.6 * 0.4 = 0.24.
    # Beam 2 also keeps B (0.4), which then ends with 0.9: p([B]) = 0.36.
    table = {(): {A: 0.6, B: 0.4}, (A,): {EOS_ID: 0.4, A: 0.3, B: 0.3}, (B,): {EOS_ID: 0.9, A: 0.05, B: 0.05}}
    [(tokens, score)] = greedy_decode(StubModel(table), *ONE_SOURCE, 10, length_penalty=0.0)
    assert tokens == [A] and score == pytest.approx(math.log(0.24))
    assert tokens_of(run_beam(table, 1, 0.0)[0]) == [[A]]
    # Step 1's best four: B-EOS 0.36, A-EOS 0.24, A-A 0.18, A-B 0.18; the first two end. The open
    # A-A and A-B (0.18) cannot beat 0.24 even unnormalised: the search is done.
    results, model = run_beam(table, 2, 0.0, n_best=2)
    assert tokens_of(results) == [[B], [A]]
    assert_close(scores_of(results), expected_scores((0.36, 1), (0.24, 1)))
    assert all(len(prefix) <= 1 for prefix in model.queried), "nothing was decoded after the search was done"


def test_a_longer_hypothesis_found_after_beam_size_have_finished() -> None:
    """Stopping once beam_size hypotheses have finished (as before) misses [A A A]."""
    # Step 0: A 0.5, B 0.4 open.  Step 1: A-EOS 0.35, B-EOS 0.32 end; A-A 0.15, B-B 0.08 stay open.
    # Step 2: A-A-A 0.15, B-B-B 0.08.  Step 3: both end with probability 1.
    table = {(): {A: 0.5, B: 0.4, C: 0.1}, (A,): {EOS_ID: 0.7, A: 0.3}, (B,): {EOS_ID: 0.8, B: 0.2},
             (A, A): {A: 1.0}, (B, B): {B: 1.0}, (A, A, A): {EOS_ID: 1.0}, (B, B, B): {EOS_ID: 1.0}}
    # Length penalty 1 (scores per token, EOS counted): [A] -1.05 / 2 = -0.525, [B] -0.570,
    # [A A A] -1.90 / 4 = -0.474. After step 1 the open A-A (log 0.15 = -1.90) could still reach
    # -1.90 / 10 at the longest: the search goes on.
    results, _ = run_beam(table, 2, 1.0, n_best=2)
    assert tokens_of(results) == [[A, A, A], [A]]
    assert_close(scores_of(results), expected_scores((0.15, 4), (0.35, 2)))
    # Without a length penalty [A] (log 0.35) is best, and no open hypothesis (log 0.15) can beat it:
    # the search stops after step 1.
    results, model = run_beam(table, 2, 0.0)
    assert tokens_of(results) == [[A]] and results[0][1] == pytest.approx(math.log(0.35))
    assert (A, A) not in model.queried


def test_only_eos_among_the_first_beam_size_extensions_finishes() -> None:
    """As in fairseq and CTranslate2: an [EOS] ranked below the first beam_size extensions is
    dropped, and the open beams are the first beam_size extensions that do not end."""
    # Step 1's best four: A-A 0.30, A-C 0.20, B-EOS 0.18, B-B 0.12: B-EOS is third, so [B] never
    # finishes, though its log-probability (log 0.18) beats every hypothesis that does.
    # Step 2, the last (max_tokens 3): A-A-EOS 0.165 ends; A-A-A 0.135 and A-C-B 0.11 are cut off.
    table = {(): {A: 0.5, B: 0.3, C: 0.2}, (A,): {A: 0.6, C: 0.4}, (B,): {EOS_ID: 0.6, B: 0.4},
             (A, A): {EOS_ID: 0.55, A: 0.45}, (A, C): {EOS_ID: 0.45, B: 0.55}}
    results, model = run_beam(table, 2, 0.0, n_best=2, max_tokens=3)
    assert tokens_of(results) == [[A, A], [A, A, A]]
    assert_close(scores_of(results), torch.tensor([math.log(0.165), math.log(0.135)], dtype=torch.float64))
    assert (B, B) not in model.queried


def test_open_hypotheses_compete_when_tokens_run_out() -> None:
    # Nothing ends within 2 steps: both open beams are ranked by their normalised scores.
    table = {(): {A: 0.7, B: 0.3}, (A,): {A: 1.0}, (B,): {B: 1.0}}
    results, _ = run_beam(table, 2, 1.0, n_best=2, max_tokens=2)
    assert tokens_of(results) == [[A, A], [B, B]]
    assert_close(scores_of(results), expected_scores((0.7, 2), (0.3, 2)))
    assert hypothesis_score(-1.5, 3, 1.0) == pytest.approx(-0.5)


def test_brevity_penalty_lowers_only_hypotheses_shorter_than_expected() -> None:
    # log BP = 1 - expected / length below the expected length, 0 from it on; lengths count [EOS].
    assert hypothesis_score(-1.5, 3, 1.0, expected_length=4.0, brevity_penalty=2.0) == \
        pytest.approx(-0.5 + 2 * (1 - 4 / 3))
    assert hypothesis_score(-1.5, 3, 1.0, expected_length=3.0, brevity_penalty=2.0) == pytest.approx(-0.5)
    assert hypothesis_score(-1.5, 6, 0.0, expected_length=3.0, brevity_penalty=2.0) == pytest.approx(-1.5)
    # The expected length: length_ratio x the source's tokens after [SOS], padding not counted.
    src = torch.tensor([[SOS_ID, 9, 9, 9, EOS_ID], [SOS_ID, 9, EOS_ID, PAD_ID, PAD_ID]])
    expected = expected_length(source_token_counts((src != PAD_ID)[:, None, None, :]), 1.5)
    assert expected.dtype == torch.float64 and expected.tolist() == [6.0, 3.0]
    assert [expected_length(n, 1.5) for n in (3, 1)] == [6.0, 3.0]


def test_the_brevity_term_of_a_number_and_of_a_tensor_are_the_same_bits() -> None:
    """Greedy decoding, sampling and CTranslate2's ranking take the number; beam search the tensor."""
    expected = [expected_length(n, ratio) for n in range(0, 40, 3) for ratio in (0.0, 0.93, 1.0, 1.17)]
    for brevity_penalty in (0.0, 0.2, 1.0):
        for length in range(1, 60, 7):
            as_numbers = torch.tensor([brevity_term(length, e, brevity_penalty) for e in expected], dtype=torch.float64)
            as_tensor = brevity_term(length, torch.tensor(expected, dtype=torch.float64), brevity_penalty)
            assert_close(as_tensor, as_numbers, rtol=0, atol=0)


def test_brevity_penalty_makes_beam_search_prefer_the_expected_length() -> None:
    """The table of the test above: [A] wins on its own with length_penalty 0. The source (one
    token and [EOS]) with length_ratio 2 expects 4 tokens with [EOS]: [A A A] [EOS] meets that, and
    [A] [EOS] (length 2) pays 1 - 4 / 2 = -1 per unit of brevity penalty."""
    table = {(): {A: 0.5, B: 0.4, C: 0.1}, (A,): {EOS_ID: 0.7, A: 0.3}, (B,): {EOS_ID: 0.8, B: 0.2},
             (A, A): {A: 1.0}, (B, B): {B: 1.0}, (A, A, A): {EOS_ID: 1.0}, (B, B, B): {EOS_ID: 1.0}}
    search = lambda brevity: beam_search(StubModel(table), *ONE_SOURCE, 10, 2, 0.0, 2, brevity_penalty=brevity,
                                         length_ratio=2.0)[0]
    assert tokens_of(search(0.0)) == [[A], [B]]
    # log 0.35 - 1 = -2.05 and log 0.32 - 1 = -2.14 fall below [A A A]'s log 0.15 = -1.90.
    results = search(1.0)
    assert tokens_of(results) == [[A, A, A], [A]]
    assert_close(scores_of(results), torch.tensor([math.log(0.15), math.log(0.35) - 1.0], dtype=torch.float64))
    # Greedy reports the same score for what it finds, and the term changes nothing it chooses.
    [(tokens, score)] = greedy_decode(StubModel(table), *ONE_SOURCE, 10, length_penalty=0.0, brevity_penalty=1.0,
                                      length_ratio=2.0)
    assert tokens == [A] and score == pytest.approx(math.log(0.35) - 1.0)


def test_beam_size_one_without_length_penalty_equals_greedy_on_a_random_model() -> None:
    """With length_penalty 0 an [EOS] that greedy would take ends the one beam for good (nothing
    longer can score higher). With a length penalty the search rightly goes on past it, which is
    why translators send beam_size 1 to greedy decoding."""
    torch.manual_seed(0)
    model = build_transformer(40, 40, 32, 32, d_model=32, N=2, h=2, d_ff=64, dropout=0.0).eval()
    with torch.no_grad():
        model.projection_layer.proj.bias[EOS_ID] = 2.0  # some sentences end early, others run to the limit
    src = torch.randint(4, 40, (8, 9))
    src[:, 0] = SOS_ID
    for row, length in enumerate([9, 8, 7, 5, 9, 4, 6, 3]):
        src[row, length - 1] = EOS_ID
        src[row, length:] = PAD_ID
    src_mask = (src != PAD_ID)[:, None, None, :]
    greedy = greedy_decode(model, src, src_mask, 12, length_penalty=0.0)
    beam = [hypotheses[0] for hypotheses in beam_search(model, src, src_mask, 12, 1, length_penalty=0.0)]
    assert tokens_of(beam) == tokens_of(greedy)
    assert_close(scores_of(beam), scores_of(greedy), rtol=1e-5, atol=1e-6)
    assert len({len(tokens) for tokens, _ in greedy}) > 1, "the case should mix finished and unfinished sentences"


def test_beam_search_returns_ranked_distinct_hypotheses(toy_translator, mixed_lengths: list[str]) -> None:
    src, src_mask = source_batch(toy_translator, mixed_lengths[:6])
    results = beam_search(toy_translator.model, src, src_mask, max_tokens=20, beam_size=4, n_best=3)
    greedy = greedy_decode(toy_translator.model, src, src_mask, max_tokens=20)
    for hypotheses, (best_greedy, _) in zip(results, greedy):
        assert len(hypotheses) == 3
        scores = [score for _, score in hypotheses]
        assert scores == sorted(scores, reverse=True)
        assert len({tuple(tokens) for tokens, _ in hypotheses}) == 3
        assert hypotheses[0][0] == best_greedy  # a confident model: the wider search agrees
    with pytest.raises(ValueError, match="n_best"):
        beam_search(toy_translator.model, src, src_mask, 20, beam_size=2, n_best=3)


def test_finished_sentences_leave_the_batch(toy_translator, mixed_lengths: list[str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows decoded per step shrink as sentences finish; cross-attention entries are only ever
    dropped with their sentence, never copied per step."""
    model = toy_translator.model
    src, src_mask = source_batch(toy_translator, mixed_lengths[:8])
    rows_per_step: list[int] = []
    kept: list[int] = []
    real_decode, real_keep = model.decode, KVCache.keep_sentences

    def counting_decode(memory, mask, tgt, tgt_mask, cache=None):
        rows_per_step.append(tgt.size(0))
        return real_decode(memory, mask, tgt, tgt_mask, cache)

    def counting_keep(cache, index):
        kept.append(index.numel())
        real_keep(cache, index)

    monkeypatch.setattr(model, "decode", counting_decode)
    monkeypatch.setattr(KVCache, "keep_sentences", counting_keep)
    beam_search(model, src, src_mask, max_tokens=20, beam_size=3)
    assert rows_per_step[0] == 8 * 3 and rows_per_step[-1] < rows_per_step[0]
    assert rows_per_step == sorted(rows_per_step, reverse=True)
    assert len(kept) < len(rows_per_step) and kept == sorted(kept, reverse=True) and all(n < 8 for n in kept)


# ---------------------------------------------------------------------------- repeated n-grams

def test_block_repeats_forbids_exactly_the_tokens_that_repeat_an_ngram() -> None:
    history = torch.tensor([[4, 5, 6, 4, 5], [4, 5, 6, 4, 5]])
    scores = torch.zeros(2, VOCAB)
    for n, banned in ((3, {6}), (2, {6}), (1, {4, 5, 6}), (6, set())):
        blocked = block_repeats(scores, history, n)
        assert {int(t) for t in (blocked[0] == float("-inf")).nonzero().squeeze(1)} == banned, n
        assert torch.equal(blocked[0], blocked[1])
    assert block_repeats(scores, history, 0) is scores


class LoopingModel(StubModel):
    """A model stuck on A: every prefix gives A 0.6, B 0.3, [EOS] 0.1."""

    def __init__(self) -> None:
        super().__init__({})

    def project(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = torch.full((*hidden.shape[:-1], VOCAB), float("-inf"))
        logits[..., A], logits[..., B], logits[..., EOS_ID] = math.log(0.6), math.log(0.3), math.log(0.1)
        return logits


def test_the_models_repeat_limit_is_the_smallest_ngram_size_from_3_that_almost_no_target_repeats() -> None:
    """Under 1 in 100 targets: 9 of 999 repeating a trigram ban trigrams; 10 of 1,000 do not, and
    then 4-grams, which none repeats. Bigrams are never considered; nothing that rare: no ban."""
    plain, trigram_twice = [1, 2, 3, 4, 5], [1, 2, 3, 1, 2, 3]
    assert repeat_free_ngram_size([plain] * 990 + [trigram_twice] * 9) == 3
    assert repeat_free_ngram_size([plain] * 990 + [trigram_twice] * 10) == 4
    assert repeat_free_ngram_size([[1, 2, 1, 2, 5]] * 1000) == 3  # bigrams repeat in all: still 3
    assert repeat_free_ngram_size([[7] * 12] * 99 + [plain]) == 0  # every size up to 6 repeats
    assert repeat_free_ngram_size([]) == 0


def test_no_repeat_ngram_size_breaks_repetition_loops() -> None:
    """Greedy repeats A to the limit; with bigrams never repeated it must take A A B A, and then
    only [EOS] is left (A A and A B both seen)."""
    [(tokens, _)] = greedy_decode(LoopingModel(), *ONE_SOURCE, 10)
    assert tokens == [A] * 10
    [(tokens, score)] = greedy_decode(LoopingModel(), *ONE_SOURCE, 10, length_penalty=0.0, no_repeat_ngram_size=2)
    # renormalised after a ban: B is 0.3 / 0.4 once A is banned, [EOS] is 1 once A and B are
    assert tokens == [A, A, B, A] and score == pytest.approx(math.log(0.6 * 0.6 * 0.75 * 0.6 * 1.0))
    for hypotheses in beam_search(LoopingModel(), *ONE_SOURCE, 10, 3, 1.0, 3, no_repeat_ngram_size=2):
        for hypothesis, _ in hypotheses:
            bigrams = list(zip(hypothesis, hypothesis[1:]))
            assert len(bigrams) == len(set(bigrams)), hypothesis
    drawn = sample(LoopingModel(), *ONE_SOURCE, 10, samples=20, no_repeat_ngram_size=2,
                   generator=torch.Generator().manual_seed(0))[0]
    for hypothesis, _ in drawn:
        bigrams = list(zip(hypothesis, hypothesis[1:]))
        assert len(bigrams) == len(set(bigrams)) and len(hypothesis) <= 5, hypothesis


# ---------------------------------------------------------------------------- sampling

def test_sampling_is_reproducible_and_follows_its_cuts() -> None:
    table = {(): {A: 0.5, B: 0.3, C: 0.2}, (A,): {EOS_ID: 1.0}, (B,): {EOS_ID: 1.0}, (C,): {EOS_ID: 1.0}}
    model = StubModel(table)

    def draw(seed: int, **cuts) -> list[tuple[list[int], float]]:
        generator = torch.Generator().manual_seed(seed)
        return sample(model, *ONE_SOURCE, 10, samples=60, length_penalty=0.0, generator=generator, **cuts)[0]

    free = draw(1)
    assert draw(1) == free and draw(2) != free
    assert {tuple(t) for t, _ in free} == {(A,), (B,), (C,)}
    for tokens, score in free:  # the model's own log-probability, whatever the cut
        assert score == pytest.approx(math.log(table[()][tokens[0]]))
    assert [score for _, score in free] == sorted((score for _, score in free), reverse=True)
    assert {tuple(t) for t, _ in draw(3, topk=2)} == {(A,), (B,)}
    assert {tuple(t) for t, _ in draw(3, topp=0.6)} == {(A,), (B,)}  # A alone (0.5) does not reach 0.6
    assert {tuple(t) for t, _ in draw(3, topp=0.4)} == {(A,)}
    assert {tuple(t) for t, _ in draw(3, topk=1)} == {(A,)}


def test_sampling_with_top_one_is_greedy(toy_translator, mixed_lengths: list[str]) -> None:
    src, src_mask = source_batch(toy_translator, mixed_lengths)
    greedy = greedy_decode(toy_translator.model, src, src_mask, max_tokens=20)
    samples = sample(toy_translator.model, src, src_mask, 20, samples=2, topk=1,
                     generator=torch.Generator().manual_seed(0))
    for drawn, (tokens, score) in zip(samples, greedy):
        assert tokens_of(drawn) == [tokens, tokens]
        assert_close(scores_of(drawn), torch.tensor([score, score], dtype=torch.float64), rtol=1e-5, atol=1e-6)


def test_max_output_tokens() -> None:
    assert max_output_tokens(5, 256) == 20  # twice the source plus 10
    assert max_output_tokens(200, 256) == 255  # the decoder holds seq_len positions including [SOS]
    assert max_output_tokens(0, 2) == 1


class HostReads(torch.overrides.TorchFunctionMode):
    """Counts the reads of tensor values back to the host (on CUDA each one waits for the device)."""

    READS = {torch.Tensor.tolist, torch.Tensor.item, torch.Tensor.__bool__, torch.Tensor.__int__,
             torch.Tensor.__float__, torch.Tensor.numpy, torch.Tensor.cpu}

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.count += func in self.READS
        return func(*args, **(kwargs or {}))


def test_beam_search_reads_one_flag_per_step_back_from_the_device() -> None:
    """The finished hypotheses stay on the device: one read per step (which sentences can still
    improve) plus a fixed few, however long the search; [EOS] suppressed, so it runs every step."""
    torch.manual_seed(0)
    model = build_transformer(30, 20, 32, 32, d_model=16, N=1, h=2, d_ff=32).eval()
    with torch.no_grad():
        model.projection_layer.proj.bias[EOS_ID] = -1e9
    src = torch.randint(4, 30, (3, 6))
    src_mask = (src != PAD_ID)[:, None, None, :]
    for steps in (5, 20):
        with HostReads() as reads:
            hypotheses = beam_search(model, src, src_mask, steps, 4, n_best=2, brevity_penalty=0.2, length_ratio=1.0)
        assert all(len(tokens) == steps for tokens, _ in hypotheses[0])
        assert reads.count <= steps + 4, f"{reads.count} reads in {steps} steps"


def test_sampling_reads_one_flag_per_step_back_from_the_device() -> None:
    """Finished samples stay on the device as in beam search: one read per step (which sentences
    still have an open sample) plus a fixed few, however many steps sentences finish at."""
    torch.manual_seed(0)
    model = build_transformer(30, 20, 32, 32, d_model=16, N=1, h=2, d_ff=32).eval()
    with torch.no_grad():
        model.projection_layer.proj.bias[EOS_ID] = 2.0  # samples end after a few tokens, each at its own step
    src = torch.randint(4, 30, (6, 5))
    src_mask = (src != PAD_ID)[:, None, None, :]
    steps = []
    decode = model.decode
    model.decode = lambda *args, **kwargs: steps.append(1) or decode(*args, **kwargs)
    with HostReads() as reads:
        drawn = sample(model, src, src_mask, 30, samples=3, generator=torch.Generator().manual_seed(0))
    longest = [max(len(tokens) for tokens, _ in hypotheses) for hypotheses in drawn]
    assert len(set(longest)) >= 3 and max(longest) < 29, longest  # sentences finished at several steps
    assert reads.count <= len(steps) + 3, f"{reads.count} reads in {len(steps)} steps"


# ---------------------------------------------------------------------------- hypotheses' features

def test_hypotheses_carry_their_log_probability_length_and_lowest_token() -> None:
    """What confidence.py reads, untouched by the length penalty: with length_penalty 0 the score
    is the log-probability; the length counts [EOS] when it ended."""
    table = {(): {A: 0.6, B: 0.4}, (A,): {EOS_ID: 0.4, A: 0.3, B: 0.3}, (B,): {EOS_ID: 0.9, A: 0.05, B: 0.05}}
    [beam] = beam_search(StubModel(table), *ONE_SOURCE, 10, 2, 1.0, n_best=2)
    [greedy] = greedy_decode(StubModel(table), *ONE_SOURCE, 10, length_penalty=1.0)
    drawn = sample(StubModel(table), *ONE_SOURCE, 10, samples=8, generator=torch.Generator().manual_seed(0))[0]
    for hypothesis in [*beam, greedy, *drawn]:
        tokens, score = hypothesis
        probabilities = [table.get(tuple(tokens[:i]), {EOS_ID: 1.0})[token]
                         for i, token in enumerate([*tokens, EOS_ID])]
        assert hypothesis.length == len(tokens) + 1 and hypothesis.complete
        assert hypothesis.log_prob == pytest.approx(sum(map(math.log, probabilities)))
        assert hypothesis.lowest == pytest.approx(math.log(min(probabilities)))
        assert score == pytest.approx(hypothesis.log_prob / hypothesis.length)
        assert pickle.loads(pickle.dumps(hypothesis)).lowest == hypothesis.lowest
    [[cut]] = beam_search(LoopingModel(), *ONE_SOURCE, 3, 2, 0.0)  # cut off at max_tokens: no [EOS] counted
    assert cut == ([A, A, A], pytest.approx(3 * math.log(0.6))) and cut.length == 3


# ---------------------------------------------------------------------------- constraints

SYNONYMS = {"two": "coppia", "five": "mano aperta"}  # one translation in ten: learned, never preferred


def synonym_pairs(count: int, seed: int) -> list[tuple[str, str]]:
    """The toy pairs, with "two" and "five" translated by their SYNONYMS one time in ten."""
    rng = random.Random(seed)
    pairs = []
    for _ in range(count):
        words = [TOY_SOURCE[rng.randrange(len(TOY_SOURCE))] for _ in range(rng.randint(3, 6))]
        target = [SYNONYMS[w] if w in SYNONYMS and rng.random() < 0.1 else TOY_TARGET[TOY_SOURCE.index(w)]
                  for w in words]
        pairs.append((" ".join(words) + ".", " ".join(reversed(target)) + "."))
    return pairs


@pytest.fixture(scope="module")
def synonym_toy():
    """The toy model of the synonym pairs (400 steps, about 4 s on 2 cores)."""
    return train_toy(synonym_pairs(2000, seed=1), 400)


def test_glossary_terms_are_used_in_place(synonym_toy) -> None:
    """Each sentence holds "two" or "five" once (or both): free search never writes their synonyms,
    constrained search writes each in place of the usual translation, never after the end."""
    rng = random.Random(11)
    sentences = []
    for index in range(12):
        words = [rng.choice(["one", "three", "four", "six", "seven", "eight"]) for _ in range(rng.randint(3, 5))]
        for term in (["two"], ["five"], ["two", "five"])[index % 3]:
            words.insert(rng.randrange(len(words) + 1), term)
        sentences.append(" ".join(words) + ".")
    src, src_mask = source_batch(synonym_toy, sentences)
    terms = [[t for w, t in SYNONYMS.items() if w in sentence.split()] for sentence in sentences]
    constraints = [[encode_ids(synonym_toy.tok_tgt, t) for t in sentence_terms] for sentence_terms in terms]
    free = beam_search(synonym_toy.model, src, src_mask, 20, 5)
    found = beam_search(synonym_toy.model, src, src_mask, 20, 5, constraints=constraints)
    in_place = 0
    for sentence_terms, [(plain, _)], [(tokens, _)] in zip(terms, free, found):
        plain, text = synonym_toy.tok_tgt.decode(plain), synonym_toy.tok_tgt.decode(tokens)
        assert not any(t in plain for t in SYNONYMS.values()), "premise: the model never chooses them"
        assert all(f" {t} " in f" {text} "[:f" {text} ".index(".")] + " " for t in sentence_terms), text
        expected = " " + plain
        for source_word, term in SYNONYMS.items():
            if term in sentence_terms:
                expected = expected.replace(f" {TOY_TARGET[TOY_SOURCE.index(source_word)]}", f" {term}")
        in_place += text == expected.strip()
    assert in_place >= 10, f"{in_place} of 12 exactly in place"


@pytest.fixture(scope="module")
def mixed_batch(toy_translator, mixed_lengths: list[str]):
    """Twelve toy sentences, every other one with constraints the model would never write for it:
    the translation of a number word it does not hold (of two such words, every fourth sentence)."""
    sentences = mixed_lengths[:12]
    constraints = []
    for index, sentence in enumerate(sentences):
        absent = [t for s, t in zip(TOY_SOURCE, TOY_TARGET) if s not in sentence.rstrip(".").split()]
        constraints.append([encode_ids(toy_translator.tok_tgt, t) for t in absent[:1 + (index % 4 == 0)]]
                           if index % 2 == 0 else None)
    return (*source_batch(toy_translator, sentences), constraints)


def test_free_sentences_of_a_mixed_batch_are_bit_identical(toy_translator, mixed_batch) -> None:
    src, src_mask, constraints = mixed_batch
    options = dict(max_tokens=20, beam_size=4, length_penalty=1.0, n_best=2, brevity_penalty=0.5, length_ratio=1.0)
    free = beam_search(toy_translator.model, src, src_mask, **options)
    mixed = beam_search(toy_translator.model, src, src_mask, **options, constraints=constraints)
    assert beam_search(toy_translator.model, src, src_mask, **options, constraints=[[]] * len(constraints)) == free
    for row, wanted in enumerate(constraints):
        if wanted is None:
            assert [(h, h.log_prob, h.length, h.lowest) for h in mixed[row]] == \
                [(h, h.log_prob, h.length, h.lowest) for h in free[row]]
        else:
            for tokens, _ in mixed[row]:
                assert all(any(tokens[i:i + len(p)] == p for i in range(len(tokens))) for p in wanted), tokens
            assert mixed[row] != free[row]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_cuda_in_its_autocast_free_sentences_stay_bit_identical(toy_translator, mixed_batch) -> None:
    """The same on the GPU, in the dtype translator.py decodes in there."""
    import copy

    from nmt.precision import autocast_context, inference_dtype
    device = torch.device("cuda")
    model = copy.deepcopy(toy_translator.model).to(device)
    src, src_mask, constraints = mixed_batch
    with autocast_context(device, inference_dtype(device)):
        free = beam_search(model, src.to(device), src_mask.to(device), 20, 5, n_best=2)
        mixed = beam_search(model, src.to(device), src_mask.to(device), 20, 5, n_best=2, constraints=constraints)
    for row, wanted in enumerate(constraints):
        if wanted is None:
            assert [(h, h.log_prob, h.lowest) for h in mixed[row]] == [(h, h.log_prob, h.lowest) for h in free[row]]
        else:
            for tokens, _ in mixed[row]:
                assert all(any(tokens[i:i + len(p)] == p for i in range(len(tokens))) for p in wanted), tokens


def test_constrained_search_with_and_without_the_cache_and_n_best(toy_translator, mixed_batch) -> None:
    """The cache reordered by the chosen beams gives what decoding every position again gives; all
    n_best hypotheses hold every constraint, distinct and ranked."""
    src, src_mask, constraints = mixed_batch
    cached = beam_search(toy_translator.model, src, src_mask, 20, 5, n_best=3, no_repeat_ngram_size=3,
                         constraints=constraints)
    uncached = beam_search(toy_translator.model, src, src_mask, 20, 5, n_best=3, no_repeat_ngram_size=3,
                           constraints=constraints, use_cache=False)
    assert [tokens_of(h) for h in cached] == [tokens_of(h) for h in uncached]
    assert_close(torch.cat([scores_of(h) for h in cached]), torch.cat([scores_of(h) for h in uncached]),
                 rtol=1e-5, atol=1e-5)
    for hypotheses, wanted in zip(cached, constraints):
        assert len(hypotheses) == 3 and len({tuple(t) for t, _ in hypotheses}) == 3
        assert scores_of(hypotheses).tolist() == sorted(scores_of(hypotheses).tolist(), reverse=True)
        for tokens, _ in hypotheses if wanted else []:
            assert all(any(tokens[i:i + len(p)] == p for i in range(len(tokens))) for p in wanted), tokens


ALMOST_ALWAYS_AAAB = {(): {A: 0.85, C: 0.05, EOS_ID: 0.1}, (A,): {A: 0.85, B: 0.1, C: 0.05},
                      (A, A): {A: 0.85, B: 0.1, C: 0.05}, (A, A, A): {B: 0.9, A: 0.05, C: 0.05},
                      (A, A, A, B): {EOS_ID: 0.9, A: 0.05, C: 0.05}}
ANYTHING = {A: 0.3, B: 0.3, C: 0.3, EOS_ID: 0.1}


def constrained(constraints, beam_size: int = 3, n_best: int = 1, max_tokens: int = 10):
    model = StubModel(ALMOST_ALWAYS_AAAB, ANYTHING)
    return beam_search(model, *ONE_SOURCE, max_tokens, beam_size, 0.0, n_best, constraints=[constraints])[0]


def test_a_sentence_that_leaves_the_batch_takes_its_constraints_with_it() -> None:
    """Two sentences; the free one ends at once. The other must hold A B C, and the model prefers
    A B B C: with the free sentence's (empty) phrase in its place, B B would count as the A B of
    A B C continuing, and A B B C as holding it."""
    table = {(): {EOS_ID: 0.6, A: 0.4}, (A,): {B: 0.9, C: 0.1}, (A, B): {B: 0.9, C: 0.1},
             (A, B, B): {C: 0.9, A: 0.1}, (A, B, B, C): {EOS_ID: 0.9, A: 0.1}}
    two = (torch.tensor([[SOS_ID, 9, EOS_ID]] * 2), torch.ones(2, 1, 1, 3, dtype=torch.bool))
    free, bound = beam_search(StubModel(table, ANYTHING), *two, 10, 3, 0.0, constraints=[None, [[A, B, C]]])
    assert tokens_of(free) == [[]]
    [(tokens, _)] = bound
    assert any(tokens[i:i + 3] == [A, B, C] for i in range(len(tokens))), tokens


def test_a_broken_phrase_starts_again_and_eos_waits_for_every_constraint() -> None:
    """The model writes A A A B: the phrase A A B, broken off by the third A, is met all the same
    (its match falls back to the A A it ends with), as is either alternative of a constraint.
    With C also required, [EOS] waits until C is written too."""
    assert tokens_of(constrained(None)) == [[A, A, A, B]]
    assert tokens_of(constrained([[A, A, B]])) == [[A, A, A, B]]
    assert tokens_of(constrained([[[C, C], [A, A, B]]])) == [[A, A, A, B]]  # alternatives: either will do
    for tokens, _ in constrained([[A, A, B], [C]], beam_size=4, n_best=2):
        assert C in tokens and any(tokens[i:i + 3] == [A, A, B] for i in range(len(tokens))), tokens


def test_out_of_tokens_a_hypothesis_that_missed_a_constraint_comes_last() -> None:
    """When max_tokens ends the search, hypotheses that hold all their constraints rank first; the
    others are returned (complete False) only to fill n_best, or when no hypothesis could hold them."""
    hypotheses = constrained([[B]], beam_size=4, n_best=4, max_tokens=3)
    completeness = [h.complete for h in hypotheses]
    assert completeness == sorted(completeness, reverse=True) and any(completeness)
    assert all((B in tokens) == h.complete for h, (tokens, _) in zip(hypotheses, hypotheses))
    cut = constrained([[B, B, B]], beam_size=2, n_best=2, max_tokens=2)  # three tokens cannot fit in two
    assert [h.complete for h in cut] == [False, False] and cut[0][1] >= cut[1][1]


def test_bad_constraints_are_refused() -> None:
    for constraints, message in (([[[]]], "non-empty phrase"), ([[[A, EOS_ID]]], "ordinary tokens"),
                                 ([[[A]], [[B]]], "2 constraint lists for 1 sentences"),
                                 ([[[A, 99]]], "token 99 is outside the model's vocabulary of 7")):
        with pytest.raises(ValueError, match=message):
            beam_search(StubModel(ALMOST_ALWAYS_AAAB, ANYTHING), *ONE_SOURCE, 10, 2, constraints=constraints)


def test_constrained_search_reads_one_flag_per_step_back_from_the_device() -> None:
    torch.manual_seed(0)
    model = build_transformer(30, 20, 32, 32, d_model=16, N=1, h=2, d_ff=32).eval()
    src = torch.randint(4, 30, (3, 6))
    src_mask = (src != PAD_ID)[:, None, None, :]
    with HostReads() as reads:
        beam_search(model, src, src_mask, 12, 4, n_best=2, constraints=[[[5, 6]], None, [[7], [8, 9, 10]]])
    assert reads.count <= 12 + 4, f"{reads.count} reads in at most 12 steps"


# ---------------------------------------------------------------------------- forbidden words

WORD_STARTS = torch.tensor([False] * 4 + [True, False, True])  # A and C begin a word, B continues one


def forbidding(constraints, forbidden, beam_size: int = 3, n_best: int = 1):
    model = StubModel(ALMOST_ALWAYS_AAAB, ANYTHING)
    return beam_search(model, *ONE_SOURCE, 10, beam_size, 0.0, n_best, word_starts=WORD_STARTS,
                       constraints=[SentenceConstraints(constraints, forbidden)])[0]


def test_a_forbidden_word_that_no_constraint_holds_is_never_written() -> None:
    """The model writes A A A B; C is required and A forbidden: no hypothesis holds an A, all hold C."""
    assert A in tokens_of(forbidding([[C]], []))[0]
    for tokens, _ in forbidding([[C]], [[A]], beam_size=4, n_best=3):
        assert A not in tokens and C in tokens, tokens


def test_a_forbidden_word_that_begins_the_term_is_only_ever_continued() -> None:
    """The term A B (one word: B continues it) begins with the forbidden word A: A may be written,
    but never ended (followed by A, C or [EOS]; a hypothesis cut off at max_tokens may stop on it),
    and the term is still met."""
    assert tokens_of(forbidding([[A, B]], [])) == [[A, A, A, B]]
    for hypothesis in forbidding([[A, B]], [[A]], beam_size=4, n_best=3):
        tokens, ended = hypothesis[0], hypothesis.length == len(hypothesis[0]) + 1
        assert any(tokens[i:i + 2] == [A, B] for i in range(len(tokens))), tokens
        assert all(tokens[i + 1:i + 2] == [B] for i, token in enumerate(tokens) if token == A and
                   (ended or i < len(tokens) - 1)), tokens


def test_a_term_once_written_is_not_continued_into_a_longer_word() -> None:
    """The model writes A A A B (B continues a word): with the word A required, no A is followed by
    B, so the term is never glued into "AB" (but where max_tokens cuts a hypothesis off)."""
    model = StubModel(ALMOST_ALWAYS_AAAB, ANYTHING)
    plain = beam_search(model, *ONE_SOURCE, 10, 3, 0.0, 1, constraints=[[[A]]])[0]
    assert any(t[i:i + 2] == [A, B] for t, _ in plain for i in range(len(t)))
    for tokens, _ in forbidding([[A]], [], beam_size=4, n_best=3):
        assert A in tokens and not any(tokens[i:i + 2] == [A, B] for i in range(len(tokens))), tokens


def test_a_forbidden_word_that_is_the_term_is_not_forbidden() -> None:
    """Forbidding A where A itself is required would make the constraint impossible: the guarantee
    wins, A is written."""
    for tokens, _ in forbidding([[A]], [[A]], beam_size=3, n_best=2):
        assert A in tokens, tokens


def test_forbidden_words_leave_a_free_sentence_of_the_batch_alone(toy_translator, mixed_batch) -> None:
    src, src_mask, constraints = mixed_batch
    vocab = toy_translator.tok_tgt.get_vocab_size()
    banned = [encode_ids(toy_translator.tok_tgt, word)[0] for word in TOY_TARGET[:4]]
    with_words = [None if c is None else SentenceConstraints(c, [[token] for token in banned]) for c in constraints]
    free = beam_search(toy_translator.model, src, src_mask, 20, 4, n_best=2)
    found = beam_search(toy_translator.model, src, src_mask, 20, 4, n_best=2, constraints=with_words,
                        word_starts=torch.ones(vocab, dtype=torch.bool))
    for row, wanted in enumerate(constraints):
        if wanted is None:
            assert [(h, h.log_prob, h.lowest) for h in found[row]] == [(h, h.log_prob, h.lowest) for h in free[row]]
        else:
            required = {token for phrase in wanted for token in phrase}
            for tokens, _ in found[row]:
                assert not (set(banned) - required) & set(tokens), tokens


def test_forbidden_words_without_a_constraint_or_word_starts_are_refused() -> None:
    model = StubModel(ALMOST_ALWAYS_AAAB, ANYTHING)
    for constraints, starts, message in (([SentenceConstraints([], [[A]])], WORD_STARTS, "come with the constraint"),
                                         ([SentenceConstraints([[C]], [[A]])], None, "need word_starts")):
        with pytest.raises(ValueError, match=message):
            beam_search(model, *ONE_SOURCE, 10, 2, constraints=constraints, word_starts=starts)
