"""Turning source sentences into translations, shared by train.py, translate.py and evaluate.py.

`greedy_decode` and `beam_search` work on a padded batch of sentences and use the model's KV
cache: each step feeds only the newest token. Greedy drops finished sentences from the batch;
beam search keeps finished hypotheses aside (never extended) and ranks them by
score / ((5 + length) / 6) ** length_penalty (GNMT). `translate_sentences` handles raw text:
tokenize, truncate to what the model accepts, batch by length, decode, detokenize.
"""
from __future__ import annotations

import sys
from typing import Sequence

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer

from model import Transformer, causal_mask
from tokenizer import EOS_ID, PAD_ID, SOS_ID, decode_ids


def max_output_tokens(src_len: int, seq_len: int) -> int:
    """Generated tokens allowed for a source of `src_len` tokens: the decoder holds seq_len
    positions, and translations more than twice as long as their source are runaways."""
    return max(1, min(seq_len - 1, 2 * src_len + 10))


@torch.no_grad()
def greedy_decode(model: Transformer, src: torch.Tensor, src_mask: torch.Tensor, max_tokens: int,
                  use_cache: bool = True) -> list[list[int]]:
    """Most likely next token at each step, for each row of `src` (B, S); EOS not included."""
    memory = model.encode(src, src_mask)
    cache = model.new_cache() if use_cache else None
    rows = torch.arange(src.size(0), device=src.device)  # original row of each sentence still decoding
    ys = torch.full((src.size(0), 1), SOS_ID, dtype=torch.long, device=src.device)
    outputs: list[list[int]] = [[] for _ in range(src.size(0))]
    for _ in range(max_tokens):
        if cache is not None:
            hidden = model.decode(memory, src_mask, ys[:, -1:], None, cache)
        else:
            hidden = model.decode(memory, src_mask, ys, causal_mask(ys.size(1), ys.device).unsqueeze(0))
        next_token = model.project(hidden[:, -1]).argmax(dim=-1)
        ys = torch.cat([ys, next_token.unsqueeze(1)], dim=1)
        finished = next_token == EOS_ID
        if bool(finished.any()):  # one sync per step: the batch shrinks as sentences end
            for row, tokens in zip(rows[finished].tolist(), ys[finished, 1:-1].tolist()):
                outputs[row] = tokens
            keep = (~finished).nonzero().squeeze(1)
            rows, ys, memory, src_mask = rows[keep], ys[keep], memory[keep], src_mask[keep]
            if cache is not None:
                cache.select(keep)
            if rows.numel() == 0:
                break
    for row, tokens in zip(rows.tolist(), ys[:, 1:].tolist()):
        outputs[row] = tokens
    return outputs


def length_normalised(score: float, length: int, length_penalty: float) -> float:
    return score / (((5.0 + length) / 6.0) ** length_penalty)


@torch.no_grad()
def beam_search(model: Transformer, src: torch.Tensor, src_mask: torch.Tensor, max_tokens: int,
                beam_size: int, length_penalty: float = 1.0, n_best: int = 1) -> list[list[tuple[list[int], float]]]:
    """The `n_best` hypotheses (tokens without EOS, normalised score) of each row of `src`.

    A sentence is done once `beam_size` hypotheses have ended with EOS; hypotheses still open at
    `max_tokens` are ranked with the finished ones."""
    batch, k = src.size(0), beam_size
    memory = model.encode(src, src_mask).repeat_interleave(k, dim=0)
    src_mask = src_mask.repeat_interleave(k, dim=0)
    cache = model.new_cache()
    tokens = torch.full((batch * k, 1), SOS_ID, dtype=torch.long, device=src.device)
    scores = torch.full((batch, k), float("-inf"), device=src.device)
    scores[:, 0] = 0.0  # all beams start identical: expand only the first
    finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(batch)]
    done = [False] * batch
    for step in range(max_tokens):
        logits = model.project(model.decode(memory, src_mask, tokens[:, -1:], None, cache))[:, -1]
        log_probs = F.log_softmax(logits.float(), dim=-1)
        vocab = log_probs.size(-1)
        candidates = (scores.view(-1, 1) + log_probs).view(batch, k * vocab)
        top_scores, top_index = candidates.topk(min(2 * k, k * vocab), dim=1)
        next_scores = torch.full((batch, k), float("-inf"), device=src.device)
        origin = torch.arange(batch * k, device=src.device).view(batch, k).clone()
        next_tokens = torch.full((batch, k), PAD_ID, dtype=torch.long, device=src.device)
        cand_scores, cand_index = top_scores.tolist(), top_index.tolist()
        for b in range(batch):
            if done[b]:
                continue
            filled = 0
            for score, index in zip(cand_scores[b], cand_index[b]):
                if score == float("-inf") or filled == k:
                    break
                beam, token = divmod(index, vocab)
                if token == EOS_ID:
                    hypothesis = tokens[b * k + beam, 1:].tolist()
                    finished[b].append((length_normalised(score, step + 1, length_penalty), hypothesis))
                    continue
                next_scores[b, filled] = score
                origin[b, filled] = b * k + beam
                next_tokens[b, filled] = token
                filled += 1
            done[b] = len(finished[b]) >= k or filled == 0
        if all(done):
            break
        flat_origin = origin.view(-1)
        cache.select(flat_origin)
        tokens = torch.cat([tokens[flat_origin], next_tokens.view(-1, 1)], dim=1)
        scores = next_scores
    else:
        # Out of steps: open hypotheses compete with the finished ones as they are.
        open_scores = scores.tolist()
        for b in range(batch):
            if not done[b]:
                for beam in range(k):
                    if open_scores[b][beam] != float("-inf"):
                        hypothesis = tokens[b * k + beam, 1:].tolist()
                        finished[b].append((length_normalised(open_scores[b][beam], len(hypothesis),
                                                              length_penalty), hypothesis))
    results = []
    for hypotheses in finished:
        ranked = sorted(hypotheses, key=lambda item: item[0], reverse=True)[:n_best]
        results.append([(tokens_, score) for score, tokens_ in ranked])
    return results


def encode_sources(tok_src: Tokenizer, sentences: Sequence[str], seq_len: int) -> list[list[int]]:
    """Token ids with [SOS]/[EOS]; longer sources are truncated to seq_len, with a warning."""
    encoded = [e.ids for e in tok_src.encode_batch(list(sentences), add_special_tokens=False)]
    too_long = [i for i, ids in enumerate(encoded) if len(ids) + 2 > seq_len]
    if too_long:
        print(f"warning: truncated {len(too_long)} source sentence(s) to the model's limit of "
              f"{seq_len - 2} tokens", file=sys.stderr, flush=True)
    return [[SOS_ID, *ids[:seq_len - 2], EOS_ID] for ids in encoded]


def translate_sentences(model: Transformer, tok_src: Tokenizer, tok_tgt: Tokenizer, sentences: Sequence[str],
                        seq_len: int, batch_size: int = 64, beam_size: int = 1,
                        length_penalty: float = 1.0) -> list[str]:
    """Translate raw sentences in length-sorted batches; returns them in the input order."""
    device = next(model.parameters()).device
    sources = encode_sources(tok_src, sentences, seq_len)
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]), reverse=True)
    translations = [""] * len(sources)
    was_training = model.training
    model.eval()
    try:
        for start in range(0, len(order), batch_size):
            chunk = order[start:start + batch_size]
            longest = len(sources[chunk[0]])
            src = torch.full((len(chunk), longest), PAD_ID, dtype=torch.long)
            for row, index in enumerate(chunk):
                src[row, :len(sources[index])] = torch.tensor(sources[index])
            src = src.to(device)
            src_mask = (src != PAD_ID)[:, None, None, :]
            max_tokens = max_output_tokens(longest - 2, seq_len)
            if beam_size == 1:
                outputs = greedy_decode(model, src, src_mask, max_tokens)
            else:
                outputs = [hyps[0][0] for hyps in beam_search(model, src, src_mask, max_tokens, beam_size,
                                                                length_penalty)]
            for index, ids in zip(chunk, outputs):
                translations[index] = decode_ids(tok_tgt, ids)
    finally:
        model.train(was_training)
    return translations
