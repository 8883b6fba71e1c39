"""Greedy decoding, beam search and sampling over the model and its KV cache.

All three work on a padded batch of sources (B, S) and feed the decoder only the newest token of
each hypothesis per step. A sentence whose work is done leaves the batch at once, so the rest of
the batch decodes without it; the hypotheses of one sentence (beams, samples) share its
cross-attention keys and values (model.KVCache).

Scores are what fairseq and CTranslate2 report: the sum of the model's log-probabilities of the
hypothesis's tokens, its [EOS] included, divided by length ** length_penalty, the length counting
that [EOS] (a hypothesis cut off at `max_tokens` has no [EOS] and counts its tokens). So with
`length_penalty` 0 a score is the log-probability of the hypothesis, with 1 its mean per token.

Beam search (`beam_search`) keeps `beam_size` open hypotheses per sentence, ranked by their raw
log-probability. Of each step's 2 x beam_size best extensions, those among the first beam_size
that end with [EOS] are finished (as in fairseq and CTranslate2) and the first beam_size others
stay open. A sentence is done when no open hypothesis can still beat its `n_best`-th finished one:
an open hypothesis's log-probability only falls as it grows, so the best score it can still reach
is its log-probability divided by the longest length it may reach (`max_tokens`) ** length_penalty.
At `max_tokens` the open hypotheses compete with the finished ones as they are. The finished
hypotheses stay on the device (`FinishedHypotheses`); the host reads one flag per sentence and step.

A `brevity_penalty` λ > 0 adds λ times the logarithm of BLEU's brevity penalty,
min(0, 1 - expected / length), to a hypothesis's score, as Sockeye's constant brevity penalty does:
the expected length is the model's `length_ratio` (target over source tokens in its training data,
both counting [EOS]) times the source's length. It lowers only hypotheses shorter than expected
and never rewards length beyond it, so it cannot favour runaways the way a length penalty above 1
does, and the stopping bound above still holds (the term is never positive).

`no_repeat_ngram_size` n > 0 forbids every decoder to produce an n-gram its hypothesis already
holds. As in CTranslate2, the forbidden tokens are removed from the logits, so the model's
distribution is renormalised over the allowed ones and scores are taken from that (fairseq masks
log-probabilities instead). A search that stops only when nothing better can come finds whatever a
score over length ** length_penalty rewards most; with length penalties above 1 that includes long,
confident repetition loops ("il re re re ..."), which this rules out. Its default, -1, is the
model's own: train.py picks it from the training targets (`repeat_free_ngram_size`), the smallest
n from 3 that almost no target repeats, so that the ban forbids what the data almost never does.

Constraints (`beam_search(..., constraints=...)`): each sentence may name phrases of target token
ids that its translation must hold, in any order, each phrase alone or as a set of alternatives
(glossary.py makes them from a glossary). The search is lexically constrained decoding with
dynamic beam allocation (Post & Vilar 2018), in the vectorised form of Hu et al. 2019 that fairseq
and Sockeye use, on the device and over the same KV cache (ConstraintBanks): [EOS] is forbidden to
a hypothesis until it holds all its phrases, and the beam is shared out between hypotheses by how
many constraint tokens they have produced. A sentence without constraints, in a batch with
constrained ones, gets bit for bit what the search gives it without any. Every finished
hypothesis holds all its phrases, unless `max_tokens` ends the search first: then the open
hypotheses compete as they are, those holding all their phrases ranked before those that do not
(`Hypothesis.complete` False), which are returned only so that every sentence gets n_best. The
beam should have more slots than a sentence has constraint tokens (one per bank), or the
furthest-along hypotheses take it all. Greedy decoding and sampling take no constraints.
A sentence's constraints may also name words its translation must not hold (SentenceConstraints:
a glossary forbids what its term replaces), kept out by ForbiddenWords in a way that never makes a
constraint impossible.

Every hypothesis also carries what confidence.py needs, read back with it at the end:
`Hypothesis.log_prob`, `length` and `lowest`, none touched by the length or brevity penalty.
"""
from __future__ import annotations

import math
from typing import Any, NamedTuple, Sequence

import torch
import torch.nn.functional as F

from model import Transformer
from nmt.corpora.tokenizer import EOS_ID, SOS_ID, SPECIAL_TOKENS

# Per sentence (None: free): its constraints, each a phrase of token ids or a list of alternative phrases
# (a SentenceConstraints also names the words its translation must not hold).
Constraints = Sequence[Sequence[Sequence[int] | Sequence[Sequence[int]]] | None]


class SentenceConstraints(list):
    """One sentence's constraints, as a list of them (each a phrase or a list of alternative
    phrases), carrying the words its translation must not hold: `forbidden`, each a phrase of token
    ids spelling one whole word (ForbiddenWords says how they are kept out)."""

    forbidden: list[list[int]]

    def __init__(self, constraints: Sequence = (), forbidden: Sequence[Sequence[int]] = ()) -> None:
        super().__init__(constraints)
        self.forbidden = [[int(token) for token in phrase] for phrase in forbidden]


class ScoredPair(tuple):
    """A (value, score) pair that unpacks and compares as two and carries what a confidence model
    reads of it (confidence.py), none of it touched by the length or brevity penalty: `log_prob`, the
    sum of its tokens' log-probabilities ([EOS] included when it ended); `length`, how many tokens
    that sum counts; `lowest`, its least likely token's log-probability; and whatever else a
    subclass names in FIELDS, each given to __new__ in that order after the pair."""

    FIELDS: tuple[str, ...] = ("log_prob", "length", "lowest")
    log_prob: float
    length: int
    lowest: float

    def __new__(cls, value: Any, score: float, *fields: Any) -> "ScoredPair":
        pair = super().__new__(cls, (value, score))
        for name, field_value in zip(cls.FIELDS, fields, strict=True):
            setattr(pair, name, field_value)
        return pair

    def __getnewargs__(self) -> tuple:  # pickling calls __new__ with these
        return (*self, *(getattr(self, name) for name in self.FIELDS))


class Hypothesis(ScoredPair):
    """One translation found: it unpacks as (tokens without [SOS]/[EOS], score), with ScoredPair's
    fields; `complete` is False only for a hypothesis cut off at max_tokens before it met all its
    constraints."""

    FIELDS = (*ScoredPair.FIELDS, "complete")
    complete: bool

    def __new__(cls, tokens: list[int], score: float, log_prob: float, length: int, lowest: float,
                complete: bool = True) -> "Hypothesis":
        return super().__new__(cls, tokens, score, log_prob, length, lowest, complete)


Hypotheses = list[Hypothesis]  # best first


def max_output_tokens(src_len: int, seq_len: int) -> int:
    """Generated tokens allowed for a source of `src_len` tokens: the decoder holds seq_len
    positions, and translations more than twice as long as their source are runaways."""
    return max(1, min(seq_len - 1, 2 * src_len + 10))


def block_repeats(scores: torch.Tensor, history: torch.Tensor, n: int) -> torch.Tensor:
    """`scores` (rows, vocab) with -inf for every next token that would repeat an n-gram already in
    that row of `history` (rows, length: the tokens after [SOS]); unchanged when n is 0."""
    if n <= 0 or history.size(1) < n:
        return scores
    windows = history.unfold(1, n, 1)  # every n-gram of every row: (rows, length - n + 1, n)
    last = history[:, history.size(1) - n + 1:]  # the n - 1 tokens a new n-gram would start with
    matches = (windows[:, :, :-1] == last[:, None, :]).all(dim=-1)
    rows, starts = matches.nonzero(as_tuple=True)
    return scores.index_put((rows, windows[rows, starts, -1]), torch.tensor(float("-inf"), device=scores.device))


REPEAT_SHARE = 0.01  # of the training targets: an n-gram size that more repeat is not banned
REPEAT_SIZES = range(3, 7)  # the n-gram sizes `repeat_free_ngram_size` considers


def repeat_free_ngram_size(targets: Sequence[Sequence[int]]) -> int:
    """The smallest n of REPEAT_SIZES such that fewer than REPEAT_SHARE of `targets` (token ids)
    hold some n-gram twice: what `no_repeat_ngram_size` -1 bans; 0 (no ban) where none is that rare.
    A young model loops ("la la la ..."), which the ban mends (docs/quality.md measures it); an
    n-gram the training targets themselves often repeat is not banned, as that would cut
    legitimate repeats."""
    def repeats(ids: Sequence[int], n: int) -> bool:
        grams = [tuple(ids[i:i + n]) for i in range(len(ids) - n + 1)]
        return len(set(grams)) < len(grams)

    for n in REPEAT_SIZES:
        if sum(repeats(ids, n) for ids in targets) < REPEAT_SHARE * len(targets):
            return n
    return 0


def hypothesis_score(log_prob: float, length: int, length_penalty: float, expected_length: float = 0.0,
                     brevity_penalty: float = 0.0) -> float:
    """A hypothesis's score: its log-probability over length ** length_penalty, plus the brevity
    penalty's term when it is shorter than `expected_length` (lengths count [EOS])."""
    return log_prob / (length ** length_penalty) + brevity_term(length, expected_length, brevity_penalty)


def brevity_term(length: int, expected_length: float | torch.Tensor,
                 brevity_penalty: float) -> float | torch.Tensor:
    """brevity_penalty x log of BLEU's brevity penalty for `length` against `expected_length`: 0
    from the expected length on, negative below it. For one hypothesis (a number), or for one length
    against every sentence's expected length at once (a float64 tensor: a step of beam search, whose
    scores stay on the device), with the same operations, so both give the same bits."""
    tensor = isinstance(expected_length, torch.Tensor)
    if not brevity_penalty:
        return torch.zeros_like(expected_length) if tensor else 0.0
    shortfall = 1.0 - expected_length / length
    return brevity_penalty * (shortfall.clamp(max=0.0) if tensor else min(0.0, shortfall))


def expected_length(source_tokens: int | torch.Tensor, length_ratio: float) -> float | torch.Tensor:
    """The output length the brevity penalty expects for a source of `source_tokens` tokens (no
    special tokens): length_ratio times its length, [EOS] counted on both sides. A number, or a
    float64 tensor of each row's (`source_token_counts(src_mask)`)."""
    return length_ratio * (source_tokens + 1)


def source_token_counts(src_mask: torch.Tensor) -> torch.Tensor:
    """The tokens of each source row of a batch, its [SOS] and [EOS] and padding not counted, in
    float64 (exact, and the precision of the scores they go into)."""
    return src_mask.reshape(src_mask.size(0), -1).sum(dim=1).double() - 2


def _drop_finished(cache, keep: torch.Tensor, per_sentence: int) -> None:
    """Keep only sentences `keep` in the cache (with their `per_sentence` hypothesis rows each)."""
    rows = (keep[:, None] * per_sentence + torch.arange(per_sentence, device=keep.device)).reshape(-1)
    cache.reorder_hypotheses(rows)
    cache.keep_sentences(keep)


@torch.no_grad()
def greedy_decode(model: Transformer, src: torch.Tensor, src_mask: torch.Tensor, max_tokens: int,
                  length_penalty: float = 1.0, use_cache: bool = True, no_repeat_ngram_size: int = 0,
                  brevity_penalty: float = 0.0, length_ratio: float = 0.0) -> list[Hypothesis]:
    """The most likely next token at each step, for each row of `src` (B, S): one hypothesis per
    row. It takes no constraints: a sentence that has some needs beam_search's banks."""
    expected = expected_length(source_token_counts(src_mask), length_ratio).tolist()
    memory = model.encode(src, src_mask)
    cache = model.new_cache() if use_cache else None
    rows = torch.arange(src.size(0), device=src.device)  # original row of each sentence still decoding
    ys = torch.full((src.size(0), 1), SOS_ID, dtype=torch.long, device=src.device)
    log_prob = torch.zeros(src.size(0), device=src.device)
    lowest = torch.zeros(src.size(0), device=src.device)
    outputs: list[Hypothesis] = [Hypothesis([], 0.0, 0.0, 0, 0.0)] * src.size(0)
    for step in range(max_tokens):
        if cache is not None:
            hidden = model.decode(memory, src_mask, ys[:, -1:], None, cache)
        else:
            hidden = model.decode(memory, src_mask, ys)  # no tgt_mask: causal
        logits = block_repeats(model.project(hidden[:, -1]).float(), ys[:, 1:], no_repeat_ngram_size)
        next_token = logits.argmax(dim=-1)
        token_log_prob = logits.gather(1, next_token[:, None]).squeeze(1) - logits.logsumexp(dim=-1)
        log_prob += token_log_prob
        lowest = torch.minimum(lowest, token_log_prob)
        ys = torch.cat([ys, next_token.unsqueeze(1)], dim=1)
        finished = next_token == EOS_ID
        if bool(finished.any()):  # one sync per step: the batch shrinks as sentences end
            for row, tokens, score, low in zip(rows[finished].tolist(), ys[finished, 1:-1].tolist(),
                                               log_prob[finished].tolist(), lowest[finished].tolist()):
                outputs[row] = Hypothesis(tokens, hypothesis_score(score, step + 1, length_penalty, expected[row],
                                                                   brevity_penalty), score, step + 1, low)
            keep = (~finished).nonzero().squeeze(1)
            rows, ys, log_prob, lowest = rows[keep], ys[keep], log_prob[keep], lowest[keep]
            memory, src_mask = memory[keep], src_mask[keep]
            if cache is not None:
                _drop_finished(cache, keep, 1)
            if rows.numel() == 0:
                break
    for row, tokens, score, low in zip(rows.tolist(), ys[:, 1:].tolist(), log_prob.tolist(), lowest.tolist()):
        outputs[row] = Hypothesis(tokens, hypothesis_score(score, len(tokens), length_penalty, expected[row],
                                                           brevity_penalty), score, len(tokens), low)
    return outputs


class Extensions(NamedTuple):
    """Candidate extensions of each sentence's beams, (sentences, width) each, in the order the
    search takes them: `scores` their log-probabilities, `beam` and `token` what they extend and
    with, `lowest` their least likely token's log-probability; with constraints, each one's state
    (`met`, `progress`: (sentences, width, constraints), ConstraintBanks)."""

    scores: torch.Tensor
    beam: torch.Tensor
    token: torch.Tensor
    lowest: torch.Tensor
    met: torch.Tensor | None = None
    progress: torch.Tensor | None = None

    def take(self, order: torch.Tensor) -> "Extensions":
        """The extensions at `order` (sentences, n) of each sentence."""
        return Extensions(*(None if part is None else
                            part.gather(1, order if part.dim() == 2 else order[:, :, None].expand(-1, -1, part.size(2)))
                            for part in self))

    def sentences(self, kept: torch.Tensor) -> "Extensions":
        return Extensions(*(None if part is None else part[kept] for part in self))


@torch.no_grad()
def beam_search(model: Transformer, src: torch.Tensor, src_mask: torch.Tensor, max_tokens: int,
                beam_size: int, length_penalty: float = 1.0, n_best: int = 1, no_repeat_ngram_size: int = 0,
                brevity_penalty: float = 0.0, length_ratio: float = 0.0, constraints: Constraints | None = None,
                use_cache: bool = True, word_starts: torch.Tensor | None = None) -> list[Hypotheses]:
    """The `n_best` best hypotheses of each row of `src` (see the module docstring); `constraints`
    gives each row the token-id phrases it must hold (None or [] for a free row), and the words it
    must not (SentenceConstraints; `word_starts`: which token ids begin a word, ForbiddenWords).

    The search's state stays on the device: each sentence's `n_best` finished hypotheses (scores,
    tokens, lengths), merged with each step's finished ones by a stable sort, in float64 so that
    their scores are bit for bit `hypothesis_score`'s. The host reads one flag per sentence each
    step (whether it can still improve), and the finished hypotheses once, at the end."""
    if not 1 <= n_best <= beam_size:
        raise ValueError(f"n_best must be between 1 and beam_size {beam_size}, got {n_best}")
    k, device, count = beam_size, src.device, src.size(0)
    banks = ConstraintBanks.of(constraints, count, k, device, word_starts)
    expected = expected_length(source_token_counts(src_mask), length_ratio)
    memory = model.encode(src, src_mask)
    cache = model.new_cache() if use_cache else None
    sentences = torch.arange(count, device=device)  # original row of each sentence still searching
    tokens, log_probs_so_far, lowest_so_far = _start_beams(count, k, device)
    finished = FinishedHypotheses(count, n_best, max_tokens, device)
    best_reachable_divisor = max_tokens ** length_penalty
    for step in range(max_tokens):
        log_probs = _next_log_probs(model, memory, src_mask, tokens, cache, k, no_repeat_ngram_size)
        if banks is not None:
            log_probs = banks.restrict(log_probs, tokens)
        extensions = _extensions(log_probs_so_far, lowest_so_far, log_probs, banks)
        ends = (extensions.token == EOS_ID) & torch.isfinite(extensions.scores)
        # The first k extensions that do not end stay open, in the order the search takes them.
        positions = torch.arange(ends.size(1), device=device)
        opened = extensions.take((ends.long() * ends.size(1) + positions).argsort(dim=1)[:, :k])
        origin = opened.beam + torch.arange(len(sentences), device=device)[:, None] * k

        divisor = (step + 1) ** length_penalty
        terms = brevity_term(step + 1, expected[sentences], brevity_penalty)[:, None]
        # Those of the first k extensions that end are finished: their tokens are their beam's so far.
        first = extensions.take(positions[:k].expand(len(sentences), -1))
        finished.add(sentences, torch.where(ends[:, :k], first.scores.double() / divisor + terms, float("-inf")),
                     tokens[:, 1:].view(len(sentences), k, step).gather(1, first.beam[:, :, None].expand(-1, -1, step)),
                     step, _features(first, step + 1))
        open_best = opened.scores.amax(dim=1).double()
        can_improve = torch.isfinite(open_best) & (open_best / best_reachable_divisor > finished.worst(sentences))
        if step == max_tokens - 1:  # out of steps: the open hypotheses compete with the finished ones as they are
            _add_open(finished, sentences, tokens, origin, opened, can_improve, divisor, terms, banks)
            break
        keep = [b for b, improvable in enumerate(can_improve.tolist()) if improvable]  # the step's one read
        if not keep:
            break
        if len(keep) < len(sentences):
            sentences, memory, src_mask, opened, origin = _keep_sentences(torch.tensor(keep, device=device), sentences,
                                                                          memory, src_mask, opened, origin, cache, banks)
        flat_origin = origin.reshape(-1)
        if cache is not None:
            cache.reorder_hypotheses(flat_origin)
        tokens = torch.cat([tokens[flat_origin], opened.token.reshape(-1, 1)], dim=1)
        log_probs_so_far, lowest_so_far = opened.scores, opened.lowest
        if banks is not None:
            banks.advance(opened.met, opened.progress)
    return finished.ranked()


def _start_beams(count: int, k: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`k` beams of each of `count` sentences at [SOS]: their tokens, log-probabilities so far (the
    beams start identical: only the first is extended) and least likely token's log-probability."""
    log_probs_so_far = torch.full((count, k), float("-inf"), device=device)
    log_probs_so_far[:, 0] = 0.0
    return (torch.full((count * k, 1), SOS_ID, dtype=torch.long, device=device), log_probs_so_far,
            torch.zeros((count, k), device=device))


def _add_open(finished: "FinishedHypotheses", sentences: torch.Tensor, tokens: torch.Tensor, origin: torch.Tensor,
              opened: Extensions, can_improve: torch.Tensor, divisor: float, terms: torch.Tensor, banks) -> None:
    """The open hypotheses at the last step, as finished ones (those of sentences that can improve),
    scored with the step's length `divisor` and brevity `terms`; with constraints, those that meet them."""
    count, k, step = len(sentences), opened.token.size(1), tokens.size(1) - 1
    grown = torch.cat([tokens[:, 1:][origin.reshape(-1)].view(count, k, step), opened.token[:, :, None]], dim=2)
    open_scores = torch.where(can_improve[:, None], opened.scores.double() / divisor + terms, float("-inf"))
    finished.add(sentences, open_scores, grown, step + 1, _features(opened, step + 1),
                 None if banks is None else opened.met.all(dim=2))


def _keep_sentences(kept: torch.Tensor, sentences: torch.Tensor, memory: torch.Tensor, src_mask: torch.Tensor,
                    opened: Extensions, origin: torch.Tensor, cache, banks) -> tuple:
    """The search's state of the sentences at `kept` alone (the others can no longer improve):
    their rows, encoder output, mask, open extensions and their origins, cache and banks."""
    if cache is not None:
        cache.keep_sentences(kept)
    if banks is not None:
        banks.keep_sentences(kept)
    return sentences[kept], memory[kept], src_mask[kept], opened.sentences(kept), origin[kept]


def _next_log_probs(model: Transformer, memory: torch.Tensor, src_mask: torch.Tensor, tokens: torch.Tensor,
                    cache, per_sentence: int, no_repeat_ngram_size: int) -> torch.Tensor:
    """Log-probabilities (rows, vocab) of the next token of each hypothesis row of `tokens`: from
    the newest token and the KV cache, or (cache None) from all of them again."""
    if cache is not None:
        logits = model.project(model.decode(memory, src_mask, tokens[:, -1:], None, cache))[:, -1]
    else:  # each hypothesis row with its sentence's encoder output; no tgt_mask: causal
        hidden = model.decode(memory.repeat_interleave(per_sentence, 0), src_mask.repeat_interleave(per_sentence, 0),
                              tokens)
        logits = model.project(hidden[:, -1:])[:, -1]
    return F.log_softmax(block_repeats(logits.float(), tokens[:, 1:], no_repeat_ngram_size), dim=-1)


def _extensions(log_probs_so_far: torch.Tensor, lowest_so_far: torch.Tensor, log_probs: torch.Tensor,
                banks: "ConstraintBanks | None") -> Extensions:
    """Each sentence's 2 x beam_size best extensions of its beams (sentences, beams), by
    log-probability; for a sentence with constraints, in the banks' order instead."""
    count, k = log_probs_so_far.shape
    vocab = log_probs.size(-1)
    candidates = (log_probs_so_far.view(-1, 1) + log_probs).view(count, k * vocab)
    scores, index = candidates.topk(min(2 * k, k * vocab), dim=1)
    met = progress = None
    if banks is not None:
        scores, index, met, progress = banks.choose(candidates, log_probs, scores, index)
    beam = index // vocab
    lowest = torch.minimum(lowest_so_far.gather(1, beam), log_probs.view(count, k * vocab).gather(1, index))
    return Extensions(scores, beam, index % vocab, lowest, met, progress)


def _features(extensions: Extensions, length: int) -> torch.Tensor:
    """What Hypothesis carries for a confidence model, (sentences, n, 3) in float64: log-probability,
    lowest token log-probability, length."""
    return torch.stack([extensions.scores.double(), extensions.lowest.double(),
                        torch.full_like(extensions.scores, length, dtype=torch.float64)], dim=2)


class FinishedHypotheses:
    """Each sentence's `n_best` best finished hypotheses, best first, on the device: scores (-inf in
    a slot not yet filled), tokens (without [SOS]/[EOS]), their lengths, what `Hypothesis` carries
    for confidence (`features`: log-probability, lowest token log-probability, length scored) and
    whether they met their constraints."""

    def __init__(self, sentences: int, n_best: int, max_tokens: int, device: torch.device) -> None:
        self.scores = torch.full((sentences, n_best), float("-inf"), dtype=torch.float64, device=device)
        self.tokens = torch.zeros((sentences, n_best, max_tokens), dtype=torch.long, device=device)
        self.lengths = torch.zeros((sentences, n_best), dtype=torch.long, device=device)
        self.features = torch.zeros((sentences, n_best, 3), dtype=torch.float64, device=device)
        self.complete = torch.ones((sentences, n_best), dtype=torch.bool, device=device)

    def worst(self, sentences: torch.Tensor) -> torch.Tensor:
        """The n_best-th finished score of each of `sentences` (-inf while fewer have finished)."""
        return self.scores[sentences, -1]

    def add(self, sentences: torch.Tensor, scores: torch.Tensor, tokens: torch.Tensor, length: int,
            features: torch.Tensor, complete: torch.Tensor | None = None) -> None:
        """Merge candidates (their `scores` -inf where they did not finish; `tokens` (rows, k, length);
        `features` (rows, k, 3)) into `sentences`' finished ones. The stable sort keeps earlier ones
        first on a tie, as a list sorted on the host would. Candidates with `complete` False (cut
        off before meeting their constraints) rank after every complete one, whatever their score."""
        rows, n_best = len(sentences), self.scores.size(1)
        padded = torch.zeros((rows, tokens.size(1), self.tokens.size(2)), dtype=torch.long, device=tokens.device)
        padded[:, :, :length] = tokens
        all_scores = torch.cat([self.scores[sentences], scores], dim=1)
        order = all_scores.sort(dim=1, descending=True, stable=True).indices
        all_complete = torch.cat([self.complete[sentences], torch.ones_like(scores, dtype=torch.bool)
                                  if complete is None else complete], dim=1)
        if complete is not None:
            behind = ~(all_complete & torch.isfinite(all_scores))
            order = order.gather(1, behind.gather(1, order).long().argsort(dim=1, stable=True))
        order = order[:, :n_best]
        lengths = torch.cat([self.lengths[sentences], torch.full_like(scores, length, dtype=torch.long)], dim=1)
        all_tokens = torch.cat([self.tokens[sentences], padded], dim=1)
        all_features = torch.cat([self.features[sentences], features], dim=1)
        self.scores[sentences] = all_scores.gather(1, order)
        self.lengths[sentences] = lengths.gather(1, order)
        self.complete[sentences] = all_complete.gather(1, order)
        self.features[sentences] = all_features.gather(1, order[:, :, None].expand(-1, -1, 3))
        self.tokens[sentences] = all_tokens.gather(1, order[:, :, None].expand(-1, -1, all_tokens.size(2)))

    def ranked(self) -> list[Hypotheses]:
        """Every sentence's finished hypotheses, best first, read back once."""
        # Two reads: the tokens, and the rest side by side in float64 (which holds lengths exactly).
        slots = torch.cat([self.scores[:, :, None], self.lengths[:, :, None].double(), self.features,
                           self.complete[:, :, None].double()], dim=2).tolist()
        tokens = self.tokens.tolist()
        return [[Hypothesis(row_tokens[slot][:int(length)], score, log_prob, int(scored), lowest, bool(complete))
                 for slot, (score, length, log_prob, lowest, scored, complete) in enumerate(row_slots)
                 if math.isfinite(score)]
                for row_slots, row_tokens in zip(slots, tokens)]


class ConstraintBanks:
    """Lexically constrained beam search's state, on the device. Each sentence has constraints, in
    any order, each a set of alternative phrases (token ids) of which one must appear: a term with
    its spellings, such as "▁acqua" and "'acqua" (after an elision: dell'acqua). Each hypothesis
    row holds which constraints it has met (`met`) and how far it is into each alternative of the
    others (`progress`: the longest end of the hypothesis that begins the phrase, so a phrase broken
    off starts again, from wherever its own beginning recurs: a token extends the longest of the
    prefixes matched so far that it fits, found through the phrase's borders as in Knuth-Morris-Pratt,
    in memory linear in the phrase's length).

    A candidate extension's bank counts the constraint tokens it has produced: for each constraint
    met, the length of its longest alternative; plus its progress into the phrase it is furthest
    into. Dynamic beam allocation (Post & Vilar 2018) in its vectorised form (Hu et al. 2019): each
    step a sentence's candidates are the 2 x beam_size best overall, each beam's best token, its
    [EOS] and its next token of every alternative of a constraint it has not met; duplicates dropped,
    they are ranked by score within their bank and taken round robin over the banks, the highest
    first (rank 0 of every bank, then rank 1, ...). [EOS] is forbidden to a hypothesis until it has
    met all its constraints; then it finishes the hypothesis when it is among the beam_size best
    of its bank (the plain search's rule, for the one bank it has). Sentences without constraints
    keep exactly the plain search's candidates."""

    def __init__(self, constraints: list[list[list[list[int]]]], beam_size: int, device: torch.device) -> None:
        groups = max(len(sentence) for sentence in constraints)
        phrases = [[phrase for constraint in sentence for phrase in constraint] for sentence in constraints]
        width, longest = max(map(len, phrases)), max(len(phrase) for sentence in phrases for phrase in sentence)
        self.largest_id = max(max(phrase) for sentence in phrases for phrase in sentence)
        padded = [sentence + [[]] * (width - len(sentence)) for sentence in phrases]
        self.phrases = torch.tensor([[phrase + [-1] * (longest - len(phrase)) for phrase in sentence]
                                     for sentence in padded], dtype=torch.long, device=device)
        self.lengths = torch.tensor([[len(phrase) for phrase in sentence] for sentence in padded], dtype=torch.long,
                                    device=device)  # (sentences, alternatives); 0: an empty slot
        # borders[s, p, a, b]: the first b tokens of phrase p end its first a tokens (b <= a): the
        # prefixes a hypothesis that has matched a tokens of the phrase has matched too (KMP's borders).
        self.borders = torch.tensor([[[[b <= a and phrase[a - b:a] == phrase[:b] for b in range(longest + 1)]
                                       for a in range(longest + 1)] for phrase in sentence] for sentence in padded],
                                    dtype=torch.bool, device=device)
        owners = [[c for c, constraint in enumerate(sentence) for _ in constraint] for sentence in constraints]
        self.owner = torch.tensor([[[c == o for c in range(groups)] for o in sentence] +
                                   [[False] * groups] * (width - len(sentence)) for sentence in owners],
                                  dtype=torch.bool, device=device)  # (sentences, alternatives, constraints)
        sizes = [[max(map(len, constraint)) for constraint in sentence] for sentence in constraints]
        self.sizes = torch.tensor([size + [0] * (groups - len(size)) for size in sizes], dtype=torch.long,
                                  device=device)
        self.banks = 1 + max(map(sum, sizes))
        self.beam_size = beam_size
        self.constrained = self.sizes.sum(dim=1) > 0
        self.met = (self.sizes == 0).repeat_interleave(beam_size, dim=0)  # an empty slot counts as met
        self.progress = torch.zeros((self.met.size(0), width), dtype=torch.long, device=device)
        self.spans = torch.arange(1, longest + 1, device=device)
        self.forbidden: ForbiddenWords | None = None  # the sentences' forbidden words (`of`)

    @classmethod
    def of(cls, constraints: Constraints | None, count: int, beam_size: int, device: torch.device,
           word_starts: torch.Tensor | None = None) -> "ConstraintBanks | None":
        """The banks of a batch of `count` sentences; None when no sentence has a constraint. A
        constraint is a phrase (token ids) or a list of alternative phrases; a sentence's forbidden
        words (SentenceConstraints) need `word_starts`. Raises ValueError for an empty phrase or one
        holding a special token, and for forbidden words without a constraint or `word_starts`."""
        if constraints is None:
            return None
        if len(constraints) != count:
            raise ValueError(f"{len(constraints)} constraint lists for {count} sentences")
        groups = [[[[int(token) for token in phrase] for phrase in _alternatives(constraint)]
                   for constraint in sentence or []] for sentence in constraints]
        forbidden = [getattr(sentence, "forbidden", []) for sentence in constraints]
        for phrase in (phrase for sentence in groups for constraint in sentence for phrase in constraint):
            if not phrase or min(phrase) < len(SPECIAL_TOKENS):
                raise ValueError(f"a constraint must be a non-empty phrase of ordinary tokens, got {phrase}")
        if any(words and not sentence for words, sentence in zip(forbidden, groups)):
            raise ValueError("forbidden words come with the constraint that replaces them")
        if not any(groups):
            return None
        banks = cls(groups, beam_size, device)
        if any(forbidden) and word_starts is None:
            raise ValueError("forbidden words need word_starts: which tokens begin a word")
        if word_starts is not None:
            banks.forbidden = ForbiddenWords(forbidden, groups, word_starts, device)
        return banks

    def restrict(self, log_probs: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """`log_probs` (rows, vocab) with [EOS] impossible for each hypothesis that has not met all its
        constraints, and with the tokens that would write a forbidden word impossible (ForbiddenWords;
        `tokens`: each row's tokens so far, [SOS] first). Not renormalised: the other tokens keep the
        model's log-probabilities."""
        log_probs[:, EOS_ID] = torch.where(self.met.all(dim=1), log_probs[:, EOS_ID], float("-inf"))
        return log_probs if self.forbidden is None else self.forbidden.block(log_probs, tokens, self.beam_size)

    def choose(self, candidates: torch.Tensor, log_probs: torch.Tensor, top_scores: torch.Tensor,
               top_index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Scores, indices into `candidates` (sentences, beams x vocab) and states (met, progress) of
        each sentence's extensions in the order the search takes them: the banks' order for a
        sentence with constraints, `top_scores`/`top_index` (the plain search's) for the others."""
        count, k, vocab = candidates.size(0), self.beam_size, log_probs.size(-1)
        if self.largest_id >= vocab:
            raise ValueError(f"constraint token {self.largest_id} is outside the model's vocabulary of {vocab}")
        offsets = torch.arange(k, device=candidates.device) * vocab
        best = log_probs.argmax(dim=1).view(count, k) + offsets
        phrases, owner = self.phrases.repeat_interleave(k, dim=0), self.owner.repeat_interleave(k, dim=0)
        wanted = phrases.gather(2, self.progress[:, :, None]).squeeze(2)  # each alternative's next token
        nexts = (wanted.clamp(min=0).view(count, k, -1) + offsets[:, None]).view(count, -1)
        wanting = ~(self.met[:, None, :] & owner).any(dim=2) & (self.lengths.repeat_interleave(k, dim=0) > 0)
        # [EOS] of each beam too (-inf where forbidden): ranked in its bank, it may finish the beam.
        index = torch.cat([top_index, best, (offsets + EOS_ID).expand(count, -1), nexts], dim=1)
        usable = torch.cat([torch.ones((count, top_index.size(1) + 2 * k), dtype=torch.bool, device=index.device),
                            wanting.view(count, -1)], dim=1)
        # Duplicates: the first of each (beam, token) stays. Unusable ones get keys of their own, so
        # that they never hide a usable twin.
        positions = torch.arange(index.size(1), device=index.device)
        ordered, order = torch.where(usable, index, -1 - positions).sort(dim=1, stable=True)
        repeated = torch.cat([torch.zeros_like(ordered[:, :1], dtype=torch.bool), ordered[:, 1:] == ordered[:, :-1]], 1)
        usable &= ~torch.zeros_like(repeated).scatter(1, order, repeated)
        scores = torch.where(usable, candidates.gather(1, index), float("-inf"))
        met, progress = self._states(index // vocab + torch.arange(count, device=index.device)[:, None] * k,
                                     index % vocab)
        bank = (met * self.sizes[:, None, :]).sum(dim=2) + progress.amax(dim=2)
        chosen = self._round_robin(scores, bank, index % vocab == EOS_ID)[:, :top_index.size(1)]
        take = self.constrained[:, None]
        return (torch.where(take, scores.gather(1, chosen), top_scores),
                torch.where(take, index.gather(1, chosen), top_index),
                met.gather(1, chosen[:, :, None].expand(-1, -1, met.size(2))),
                progress.gather(1, chosen[:, :, None].expand(-1, -1, progress.size(2))))

    def _states(self, rows: torch.Tensor, token: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(met, progress) of the hypothesis rows `rows` (sentences, candidates), each extended by its
        `token`: (sentences, candidates, constraints) and (..., alternatives). An alternative's new
        progress is the longest of the prefixes the row has matched (its progress and that prefix's
        borders) that `token` extends, plus one; 0 when `token` extends none."""
        progress = self.progress[rows]
        sentence = torch.arange(rows.size(0), device=rows.device)[:, None, None]
        alternative = torch.arange(progress.size(2), device=rows.device)[None, None, :]
        matched_so_far = self.borders[sentence, alternative, progress][..., :-1]  # (..., alternatives, longest)
        extends = matched_so_far & (self.phrases[:, None] == token[:, :, None, None]) \
            & (self.spans <= self.lengths[:, None, :, None])
        matched = (extends * self.spans).amax(dim=-1)
        completed = (matched == self.lengths[:, None, :]) & (self.lengths[:, None, :] > 0)
        met = self.met[rows] | (completed[:, :, :, None] & self.owner[:, None]).any(dim=2)
        settled = (met[:, :, None, :] & self.owner[:, None]).any(dim=3)  # the alternative's constraint is met
        return met, torch.where(settled, 0, matched)

    def _round_robin(self, scores: torch.Tensor, bank: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
        """Each sentence's candidates in the order the search takes them: first those that end
        ([EOS]) among the beam_size best of their bank, as the plain search finishes an [EOS] among
        its beam_size best; then the rest by rank within their bank, the higher bank first on a
        rank; impossible ones (-inf) last."""
        by_score = scores.argsort(dim=1, descending=True, stable=True)
        bank, ends = bank.gather(1, by_score), ends.gather(1, by_score)
        finite = torch.isfinite(scores.gather(1, by_score))
        rank = F.one_hot(bank, self.banks).cumsum(dim=1).gather(2, bank[:, :, None]).squeeze(2) - 1
        key = (rank * self.banks + self.banks - 1 - bank).masked_fill(~finite, scores.size(1) * self.banks)
        key = torch.where(ends & finite & (rank < self.beam_size), rank - self.beam_size, key)
        return by_score.gather(1, key.argsort(dim=1, stable=True))

    def keep_sentences(self, kept: torch.Tensor) -> None:
        """Only the sentences `kept`: every per-sentence tensor (the rows' states follow in `advance`)."""
        self.phrases, self.lengths, self.borders = self.phrases[kept], self.lengths[kept], self.borders[kept]
        self.owner, self.sizes, self.constrained = self.owner[kept], self.sizes[kept], self.constrained[kept]
        if self.forbidden is not None:
            self.forbidden.keep_sentences(kept)

    def advance(self, met: torch.Tensor, progress: torch.Tensor) -> None:
        """The states (sentences, beams, ...) of the beams the search keeps."""
        self.met, self.progress = met.reshape(-1, met.size(2)), progress.reshape(-1, progress.size(2))


WORD_RULE = -1  # ForbiddenWords.banned: after the phrase, nothing that begins a word
TERM_RULE = -2  # ForbiddenWords.banned: after the phrase (a whole constraint), nothing that continues a word


class ForbiddenWords:
    """The words each sentence's hypotheses must not write (a glossary's negative constraints), on
    the device. Each is a phrase of token ids spelling a whole word, kept out in one of two ways:
    - a phrase that no alternative of the sentence's constraints holds is banned as a sequence: its
      last token is impossible right after the rest of it (a one-token phrase: everywhere);
    - a phrase that one holds as the beginning of a longer word ("▁Tom" in "▁Tom maso", Tommaso)
      may be written, but only a token that continues the word may follow it: none of
      `word_starts` (a bool per vocabulary id: the tokens that begin a word or are punctuation),
      nor [EOS]. So the word itself is never ended (but by max_tokens cutting a hypothesis off),
      and the constraint can still be written.
    A phrase that an alternative holds as a whole word is not forbidden at all, so every constraint
    can always be met (beam search's guarantee stands). And a constraint's alternative, once
    written, is not continued into a longer word ("Tommaso" into "Tommasogliata"): after it only one
    of `word_starts` or [EOS] may follow, unless an alternative continues it so (then that rule is
    left out, and the guarantee stands)."""

    def __init__(self, forbidden: list[list[list[int]]], groups: list[list[list[list[int]]]],
                 word_starts: torch.Tensor, device: torch.device) -> None:
        ends = word_starts.to(device=device, dtype=torch.bool).clone()
        ends[EOS_ID] = True
        self.word_ends = ends  # what may not follow a phrase banned by WORD_RULE
        rules = [[rule for phrase in words if (rule := self._rule(phrase, sentence, ends)) is not None] +
                 [(phrase, TERM_RULE) for constraint in sentence for phrase in constraint
                  if all(bool(ends[token]) for token in self._followers(phrase, sentence))]
                 for words, sentence in zip(forbidden, groups)]
        width = max(1, max(map(len, rules)))
        longest = max([1] + [len(prefix) for sentence in rules for prefix, _ in sentence])
        # Prefixes right-aligned, -1 before them: matched against the last `longest` tokens of a row.
        self.prefixes = torch.tensor([[[-1] * (longest - len(prefix)) + prefix for prefix, _ in sentence] +
                                      [[-1] * longest] * (width - len(sentence)) for sentence in rules],
                                     dtype=torch.long, device=device)
        self.banned = torch.tensor([[banned for _, banned in sentence] + [0] * (width - len(sentence))
                                    for sentence in rules], dtype=torch.long, device=device)
        self.active = torch.tensor([[True] * len(sentence) + [False] * (width - len(sentence)) for sentence in rules],
                                   dtype=torch.bool, device=device)

    @staticmethod
    def _rule(phrase: list[int], alternatives: list[list[list[int]]], ends: torch.Tensor) -> tuple[list[int], int] | None:
        """How `phrase` is kept out, as (prefix, banned token or WORD_RULE); None: it cannot be."""
        if not phrase or min(phrase) < len(SPECIAL_TOKENS) or max(phrase) >= ends.numel():
            return None
        followers = ForbiddenWords._followers(phrase, alternatives)
        if not followers:
            return phrase[:-1], phrase[-1]
        return None if any(bool(ends[token]) for token in followers) else (phrase, WORD_RULE)

    @staticmethod
    def _followers(phrase: list[int], alternatives: list[list[list[int]]]) -> list[int]:
        """The token that follows each occurrence of `phrase` in the sentence's alternatives ([EOS]: at an end)."""
        return [alternative[i + len(phrase)] if i + len(phrase) < len(alternative) else EOS_ID
                for constraint in alternatives for alternative in constraint
                for i in range(len(alternative) - len(phrase) + 1) if alternative[i:i + len(phrase)] == phrase]

    def block(self, log_probs: torch.Tensor, tokens: torch.Tensor, per_sentence: int) -> torch.Tensor:
        """`log_probs` (rows, vocab: `per_sentence` rows a sentence) with -inf for every token that
        would write a forbidden word after a row's `tokens` ([SOS] first)."""
        longest = self.prefixes.size(2)
        history = F.pad(tokens[:, -longest:], (max(0, longest - tokens.size(1)), 0), value=SOS_ID)
        prefixes = self.prefixes.repeat_interleave(per_sentence, dim=0)
        banned = self.banned.repeat_interleave(per_sentence, dim=0)
        matched = ((prefixes == history[:, None, :]) | (prefixes < 0)).all(dim=2) \
            & self.active.repeat_interleave(per_sentence, dim=0)
        rows, rules = (matched & (banned >= 0)).nonzero(as_tuple=True)
        log_probs = log_probs.index_put((rows, banned[rows, rules]), torch.tensor(float("-inf"), device=log_probs.device))
        unended = (matched & (banned == WORD_RULE)).any(dim=1)
        log_probs = log_probs.masked_fill(unended[:, None] & self.word_ends[None, :], float("-inf"))
        ended = (matched & (banned == TERM_RULE)).any(dim=1)
        return log_probs.masked_fill(ended[:, None] & ~self.word_ends[None, :], float("-inf"))

    def keep_sentences(self, kept: torch.Tensor) -> None:
        self.prefixes, self.banned, self.active = self.prefixes[kept], self.banned[kept], self.active[kept]


def _alternatives(constraint: Sequence[int] | Sequence[Sequence[int]]) -> list[Sequence[int]]:
    """A constraint's alternative phrases: itself when it is one phrase (its items are ids, not lists)."""
    return list(constraint) if constraint and isinstance(constraint[0], (list, tuple)) else [constraint]


@torch.no_grad()
def sample(model: Transformer, src: torch.Tensor, src_mask: torch.Tensor, max_tokens: int, samples: int = 1,
           topk: int = 0, topp: float = 0.0, temperature: float = 1.0, length_penalty: float = 1.0,
           generator: torch.Generator | None = None, no_repeat_ngram_size: int = 0,
           brevity_penalty: float = 0.0, length_ratio: float = 0.0) -> list[Hypotheses]:
    """`samples` random translations of each row of `src`, each token drawn from the model's
    distribution divided by `temperature`, restricted to the `topk` most likely tokens (0: all)
    and to the smallest set of most likely tokens whose probability reaches `topp` (0: all).
    Scores are those of the module docstring under the model's own distribution (temperature 1,
    nothing cut off), as rescoring wants them; each sentence's samples come best first.

    As in beam search, the finished samples stay on the device (`FinishedSamples`): the host reads
    one flag per sentence each step (whether any of its samples is still open), and the finished
    samples once, at the end."""
    device, count = src.device, src.size(0)
    expected = expected_length(source_token_counts(src_mask), length_ratio).tolist()
    memory = model.encode(src, src_mask)
    cache = model.new_cache()
    sentences = list(range(count))  # original row of each sentence still sampling
    tokens = torch.full((count * samples, 1), SOS_ID, dtype=torch.long, device=device)
    log_prob = torch.zeros(count * samples, device=device)
    lowest = torch.zeros(count * samples, device=device)
    alive = torch.ones(count * samples, dtype=torch.bool, device=device)
    finished = FinishedSamples(count * samples, max_tokens, device)
    for step in range(max_tokens):
        logits = model.project(model.decode(memory, src_mask, tokens[:, -1:], None, cache))[:, -1].float()
        logits = block_repeats(logits, tokens[:, 1:], no_repeat_ngram_size)
        model_log_probs = F.log_softmax(logits, dim=-1)
        drawn = torch.multinomial(_cut(logits / temperature, topk, topp).softmax(dim=-1), 1,
                                  generator=generator).squeeze(1)
        drawn = torch.where(alive, drawn, EOS_ID)
        token_log_prob = model_log_probs.gather(1, drawn[:, None]).squeeze(1)
        log_prob += torch.where(alive, token_log_prob, 0.0)
        lowest = torch.where(alive, torch.minimum(lowest, token_log_prob), lowest)
        tokens = torch.cat([tokens, drawn[:, None]], dim=1)
        alive &= drawn != EOS_ID
        if step == max_tokens - 1:
            finished.add(sentences, samples, tokens[:, 1:], log_prob, lowest)
            break
        open_sentences = alive.view(len(sentences), samples).any(dim=1).tolist()  # the step's one read
        keep = [b for b, still_open in enumerate(open_sentences) if still_open]
        if len(keep) == len(sentences):
            continue
        done = [b for b, still_open in enumerate(open_sentences) if not still_open]
        rows = _sample_rows(done, samples, device)
        finished.add([sentences[b] for b in done], samples, tokens[rows, 1:], log_prob[rows], lowest[rows])
        if not keep:
            break
        rows, kept = _sample_rows(keep, samples, device), torch.tensor(keep, device=device)
        sentences, memory, src_mask = [sentences[b] for b in keep], memory[kept], src_mask[kept]
        tokens, log_prob, lowest, alive = tokens[rows], log_prob[rows], lowest[rows], alive[rows]
        _drop_finished(cache, kept, samples)
    return finished.ranked(samples, length_penalty, expected, brevity_penalty)


def _cut(logits: torch.Tensor, topk: int, topp: float) -> torch.Tensor:
    """`logits` with -inf outside the `topk` most likely tokens (0: all) and outside the smallest set
    of most likely tokens whose probability reaches `topp` (0: all)."""
    if topk:
        kth = logits.topk(min(topk, logits.size(-1)), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if topp:
        ordered, order = logits.sort(dim=-1, descending=True)
        probabilities = ordered.softmax(dim=-1)
        # Cut a token when the more likely ones already reach topp (so the first always stays).
        cut_in_order = probabilities.cumsum(dim=-1) - probabilities >= topp
        logits = logits.masked_fill(torch.zeros_like(cut_in_order).scatter(1, order, cut_in_order), float("-inf"))
    return logits


def _sample_rows(sentences: list[int], samples: int, device: torch.device) -> torch.Tensor:
    """The rows of `sentences`' samples (`samples` rows each, one sentence after the other)."""
    return (torch.tensor(sentences, device=device)[:, None] * samples
            + torch.arange(samples, device=device)).reshape(-1)


class FinishedSamples:
    """Every sample's tokens after [SOS] (filled with [EOS] past its end), log-probability and least
    likely token's log-probability, by original row (sentence x samples + sample), on the device
    until `ranked` reads them once."""

    def __init__(self, rows: int, max_tokens: int, device: torch.device) -> None:
        self.tokens = torch.full((rows, max_tokens), EOS_ID, dtype=torch.long, device=device)
        self.log_probs = torch.zeros((rows, 2), device=device)  # the sum, the lowest

    def add(self, sentences: list[int], samples: int, tokens: torch.Tensor, log_probs: torch.Tensor,
            lowest: torch.Tensor) -> None:
        """The samples of `sentences` (original rows): their `tokens` (rows, length), `log_probs` and
        `lowest` token log-probabilities."""
        rows = _sample_rows(sentences, samples, tokens.device)
        self.tokens[rows, :tokens.size(1)] = tokens
        self.log_probs[rows] = torch.stack([log_probs, lowest], dim=1)

    def ranked(self, samples: int, length_penalty: float, expected: list[float],
               brevity_penalty: float) -> list[Hypotheses]:
        """Each sentence's samples without [EOS], scored (its [EOS] counted where it has one), best
        first; the samples of one score in drawing order."""
        results: list[Hypotheses] = []
        histories_of = self.tokens.view(-1, samples, self.tokens.size(1)).tolist()
        for sentence, (histories, log_probs) in enumerate(zip(histories_of,
                                                               self.log_probs.view(-1, samples, 2).tolist())):
            found = []
            for history, (log_prob, lowest) in zip(histories, log_probs):
                ended = EOS_ID in history
                hypothesis = history[:history.index(EOS_ID)] if ended else history
                length = len(hypothesis) + ended
                found.append(Hypothesis(hypothesis, hypothesis_score(log_prob, length, length_penalty,
                                                                     expected[sentence], brevity_penalty),
                                        log_prob, length, lowest))
            results.append(sorted(found, key=lambda hypothesis: hypothesis[1], reverse=True))
        return results
