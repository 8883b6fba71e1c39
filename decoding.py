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
confident repetition loops ("il re re re ..."), which this rules out.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from model import Transformer
from tokenizer import EOS_ID, SOS_ID

Hypotheses = list[tuple[list[int], float]]  # (tokens without [SOS]/[EOS], score), best first


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
                  brevity_penalty: float = 0.0, length_ratio: float = 0.0) -> list[tuple[list[int], float]]:
    """The most likely next token at each step, for each row of `src` (B, S): (tokens without
    [EOS], score) per row."""
    expected = expected_length(source_token_counts(src_mask), length_ratio).tolist()
    memory = model.encode(src, src_mask)
    cache = model.new_cache() if use_cache else None
    rows = torch.arange(src.size(0), device=src.device)  # original row of each sentence still decoding
    ys = torch.full((src.size(0), 1), SOS_ID, dtype=torch.long, device=src.device)
    log_prob = torch.zeros(src.size(0), device=src.device)
    outputs: list[tuple[list[int], float]] = [([], 0.0)] * src.size(0)
    for step in range(max_tokens):
        if cache is not None:
            hidden = model.decode(memory, src_mask, ys[:, -1:], None, cache)
        else:
            hidden = model.decode(memory, src_mask, ys)  # no tgt_mask: causal
        logits = block_repeats(model.project(hidden[:, -1]).float(), ys[:, 1:], no_repeat_ngram_size)
        next_token = logits.argmax(dim=-1)
        log_prob += logits.gather(1, next_token[:, None]).squeeze(1) - logits.logsumexp(dim=-1)
        ys = torch.cat([ys, next_token.unsqueeze(1)], dim=1)
        finished = next_token == EOS_ID
        if bool(finished.any()):  # one sync per step: the batch shrinks as sentences end
            for row, tokens, score in zip(rows[finished].tolist(), ys[finished, 1:-1].tolist(),
                                          log_prob[finished].tolist()):
                outputs[row] = (tokens, hypothesis_score(score, step + 1, length_penalty, expected[row],
                                                         brevity_penalty))
            keep = (~finished).nonzero().squeeze(1)
            rows, ys, log_prob, memory, src_mask = rows[keep], ys[keep], log_prob[keep], memory[keep], src_mask[keep]
            if cache is not None:
                _drop_finished(cache, keep, 1)
            if rows.numel() == 0:
                break
    for row, tokens, score in zip(rows.tolist(), ys[:, 1:].tolist(), log_prob.tolist()):
        outputs[row] = (tokens, hypothesis_score(score, len(tokens), length_penalty, expected[row], brevity_penalty))
    return outputs


@torch.no_grad()
def beam_search(model: Transformer, src: torch.Tensor, src_mask: torch.Tensor, max_tokens: int,
                beam_size: int, length_penalty: float = 1.0, n_best: int = 1, no_repeat_ngram_size: int = 0,
                brevity_penalty: float = 0.0, length_ratio: float = 0.0) -> list[Hypotheses]:
    """The `n_best` best hypotheses of each row of `src` (see the module docstring).

    The search's state stays on the device: each sentence's `n_best` finished hypotheses (scores,
    tokens, lengths), merged with each step's finished ones by a stable sort, in float64 so that
    their scores are bit for bit `hypothesis_score`'s. The host reads one flag per sentence each
    step (whether it can still improve), and the finished hypotheses once, at the end."""
    if not 1 <= n_best <= beam_size:
        raise ValueError(f"n_best must be between 1 and beam_size {beam_size}, got {n_best}")
    k, device, count = beam_size, src.device, src.size(0)
    expected = expected_length(source_token_counts(src_mask), length_ratio)
    memory = model.encode(src, src_mask)
    cache = model.new_cache()
    sentences = torch.arange(count, device=device)  # original row of each sentence still searching
    tokens = torch.full((count * k, 1), SOS_ID, dtype=torch.long, device=device)
    log_probs_so_far = torch.full((count, k), float("-inf"), device=device)
    log_probs_so_far[:, 0] = 0.0  # the beams start identical: extend only the first
    finished = FinishedHypotheses(count, n_best, max_tokens, device)
    best_reachable_divisor = max_tokens ** length_penalty
    for step in range(max_tokens):
        logits = model.project(model.decode(memory, src_mask, tokens[:, -1:], None, cache))[:, -1]
        log_probs = F.log_softmax(block_repeats(logits.float(), tokens[:, 1:], no_repeat_ngram_size), dim=-1)
        vocab = log_probs.size(-1)
        candidates = (log_probs_so_far.view(-1, 1) + log_probs).view(-1, k * vocab)
        top_scores, top_index = candidates.topk(min(2 * k, k * vocab), dim=1)
        top_beam, top_token = top_index // vocab, top_index % vocab
        ends = (top_token == EOS_ID) & torch.isfinite(top_scores)
        # The first k extensions that do not end stay open, in order of their log-probability.
        positions = torch.arange(top_scores.size(1), device=device)
        open_order = (ends.long() * top_scores.size(1) + positions).argsort(dim=1)[:, :k]
        next_scores = top_scores.gather(1, open_order)
        origin = top_beam.gather(1, open_order) + torch.arange(len(sentences), device=device)[:, None] * k
        next_tokens = top_token.gather(1, open_order)

        # Those of the first k extensions that end are finished: their tokens are their beam's so far.
        history = tokens[:, 1:].view(len(sentences), k, step)
        ended = history.gather(1, top_beam[:, :k, None].expand(-1, -1, step))
        divisor = (step + 1) ** length_penalty
        terms = brevity_term(step + 1, expected[sentences], brevity_penalty)[:, None]
        ended_scores = torch.where(ends[:, :k], top_scores[:, :k].double() / divisor + terms, float("-inf"))
        finished.add(sentences, ended_scores, ended, step)
        open_best = next_scores[:, 0].double()
        can_improve = torch.isfinite(open_best) & (open_best / best_reachable_divisor > finished.worst(sentences))
        if step == max_tokens - 1:
            # Out of steps: the open hypotheses compete with the finished ones as they are.
            grown = torch.cat([tokens[:, 1:][origin.reshape(-1)].view(len(sentences), k, step),
                               next_tokens[:, :, None]], dim=2)
            open_scores = torch.where(can_improve[:, None], next_scores.double() / divisor + terms, float("-inf"))
            finished.add(sentences, open_scores, grown, step + 1)
            break
        keep = [b for b, improvable in enumerate(can_improve.tolist()) if improvable]  # the step's one read
        if not keep:
            break
        if len(keep) < len(sentences):
            kept = torch.tensor(keep, device=device)
            sentences, memory, src_mask = sentences[kept], memory[kept], src_mask[kept]
            cache.keep_sentences(kept)
            next_scores, origin, next_tokens = next_scores[kept], origin[kept], next_tokens[kept]
        flat_origin = origin.reshape(-1)
        cache.reorder_hypotheses(flat_origin)
        tokens = torch.cat([tokens[flat_origin], next_tokens.reshape(-1, 1)], dim=1)
        log_probs_so_far = next_scores
    return finished.ranked()


class FinishedHypotheses:
    """Each sentence's `n_best` best finished hypotheses, best first, on the device: scores (-inf in
    a slot not yet filled), tokens (without [SOS]/[EOS]) and their lengths."""

    def __init__(self, sentences: int, n_best: int, max_tokens: int, device: torch.device) -> None:
        self.scores = torch.full((sentences, n_best), float("-inf"), dtype=torch.float64, device=device)
        self.tokens = torch.zeros((sentences, n_best, max_tokens), dtype=torch.long, device=device)
        self.lengths = torch.zeros((sentences, n_best), dtype=torch.long, device=device)

    def worst(self, sentences: torch.Tensor) -> torch.Tensor:
        """The n_best-th finished score of each of `sentences` (-inf while fewer have finished)."""
        return self.scores[sentences, -1]

    def add(self, sentences: torch.Tensor, scores: torch.Tensor, tokens: torch.Tensor, length: int) -> None:
        """Merge candidates (their `scores` -inf where they did not finish; `tokens` (rows, k, length))
        into `sentences`' finished ones. The stable sort keeps earlier ones first on a tie, as a list
        sorted on the host would."""
        rows, n_best = len(sentences), self.scores.size(1)
        padded = torch.zeros((rows, tokens.size(1), self.tokens.size(2)), dtype=torch.long, device=tokens.device)
        padded[:, :, :length] = tokens
        all_scores = torch.cat([self.scores[sentences], scores], dim=1)
        order = all_scores.sort(dim=1, descending=True, stable=True).indices[:, :n_best]
        lengths = torch.cat([self.lengths[sentences], torch.full_like(scores, length, dtype=torch.long)], dim=1)
        all_tokens = torch.cat([self.tokens[sentences], padded], dim=1)
        self.scores[sentences] = all_scores.gather(1, order)
        self.lengths[sentences] = lengths.gather(1, order)
        self.tokens[sentences] = all_tokens.gather(1, order[:, :, None].expand(-1, -1, all_tokens.size(2)))

    def ranked(self) -> list[Hypotheses]:
        """Every sentence's finished hypotheses, best first, read back once."""
        scores, lengths, tokens = self.scores.tolist(), self.lengths.tolist(), self.tokens.tolist()
        return [[(row_tokens[slot][:row_lengths[slot]], score) for slot, score in enumerate(row_scores)
                 if math.isfinite(score)]
                for row_scores, row_lengths, row_tokens in zip(scores, lengths, tokens)]


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
    alive = torch.ones(count * samples, dtype=torch.bool, device=device)
    finished = FinishedSamples(count * samples, max_tokens, device)
    for step in range(max_tokens):
        logits = model.project(model.decode(memory, src_mask, tokens[:, -1:], None, cache))[:, -1].float()
        logits = block_repeats(logits, tokens[:, 1:], no_repeat_ngram_size)
        model_log_probs = F.log_softmax(logits, dim=-1)
        drawn = torch.multinomial(_cut(logits / temperature, topk, topp).softmax(dim=-1), 1,
                                  generator=generator).squeeze(1)
        drawn = torch.where(alive, drawn, EOS_ID)
        log_prob += torch.where(alive, model_log_probs.gather(1, drawn[:, None]).squeeze(1), 0.0)
        tokens = torch.cat([tokens, drawn[:, None]], dim=1)
        alive &= drawn != EOS_ID
        if step == max_tokens - 1:
            finished.add(sentences, samples, tokens[:, 1:], log_prob)
            break
        open_sentences = alive.view(len(sentences), samples).any(dim=1).tolist()  # the step's one read
        keep = [b for b, still_open in enumerate(open_sentences) if still_open]
        if len(keep) == len(sentences):
            continue
        done = [b for b, still_open in enumerate(open_sentences) if not still_open]
        rows = _sample_rows(done, samples, device)
        finished.add([sentences[b] for b in done], samples, tokens[rows, 1:], log_prob[rows])
        if not keep:
            break
        rows, kept = _sample_rows(keep, samples, device), torch.tensor(keep, device=device)
        sentences, memory, src_mask = [sentences[b] for b in keep], memory[kept], src_mask[kept]
        tokens, log_prob, alive = tokens[rows], log_prob[rows], alive[rows]
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
    """Every sample's tokens after [SOS] (filled with [EOS] past its end) and log-probability, by
    original row (sentence x samples + sample), on the device until `ranked` reads them once."""

    def __init__(self, rows: int, max_tokens: int, device: torch.device) -> None:
        self.tokens = torch.full((rows, max_tokens), EOS_ID, dtype=torch.long, device=device)
        self.log_probs = torch.zeros(rows, device=device)

    def add(self, sentences: list[int], samples: int, tokens: torch.Tensor, log_probs: torch.Tensor) -> None:
        """The samples of `sentences` (original rows), their `tokens` (rows, length) and `log_probs`."""
        rows = _sample_rows(sentences, samples, tokens.device)
        self.tokens[rows, :tokens.size(1)] = tokens
        self.log_probs[rows] = log_probs

    def ranked(self, samples: int, length_penalty: float, expected: list[float],
               brevity_penalty: float) -> list[Hypotheses]:
        """Each sentence's samples without [EOS], scored (its [EOS] counted where it has one), best
        first; the samples of one score in drawing order."""
        results: list[Hypotheses] = []
        for sentence, (histories, log_probs) in enumerate(zip(self.tokens.view(-1, samples, self.tokens.size(1))
                                                               .tolist(), self.log_probs.view(-1, samples).tolist())):
            found = []
            for history, log_prob in zip(histories, log_probs):
                ended = EOS_ID in history
                hypothesis = history[:history.index(EOS_ID)] if ended else history
                found.append((hypothesis, hypothesis_score(log_prob, len(hypothesis) + ended, length_penalty,
                                                           expected[sentence], brevity_penalty)))
            results.append(sorted(found, key=lambda item: item[1], reverse=True))
        return results
