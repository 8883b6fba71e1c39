"""Quality features: subword tokenizers, tied embeddings, beam search, checkpoint averaging, attention plots.

The beam-search cases use a stub model whose next-token distribution is a fixed table keyed by
the prefix, so every expected hypothesis and score below is worked out by hand.
"""
from __future__ import annotations

import math

import pytest
import torch

from attention_plot import attention_figure, cross_attention_weights, save_attention_plot
from checkpoint import average_checkpoints, checkpoints_to_average, load_for_inference, save_checkpoint, CheckpointError
from config import ConfigError, get_config, validate_config
from decoding import beam_search, greedy_decode, length_normalised
from model import build_transformer
from synthetic_data import synthetic_pairs
from tokenizer import EOS_ID, PAD_ID, SOS_ID, decode_ids, encode_ids, train_tokenizer

# ---------------------------------------------------------------------------- tokenizers

ROUND_TRIP = ["The old man reads the red book.", "Big cat, small dog!", "Sees: the fish? Eats bread."]


@pytest.mark.parametrize("kind", ["bpe", "unigram"])
def test_subword_tokenizers_round_trip_and_split_words(kind: str) -> None:
    pairs = synthetic_pairs(300)
    tokenizer = train_tokenizer([text for pair in pairs for text in pair] + ROUND_TRIP, kind, 120, 1)
    assert tokenizer.get_vocab_size() <= 120
    for sentence in ROUND_TRIP + [p[1] for p in pairs[:20]]:
        ids = encode_ids(tokenizer, sentence)
        assert decode_ids(tokenizer, ids) == sentence
    # A word never seen in training is spelled out in pieces, not lost to [UNK].
    ids = encode_ids(tokenizer, "The bread cat.")
    assert decode_ids(tokenizer, ids) == "The bread cat."
    unseen = encode_ids(tokenizer, "Breadcat")
    assert len(unseen) > 1 and decode_ids(tokenizer, unseen) == "Breadcat"


# ---------------------------------------------------------------------------- tied embeddings

def test_tied_embeddings_share_one_matrix_through_training_and_loading() -> None:
    model = build_transformer(50, 50, 16, 16, d_model=16, N=1, h=2, d_ff=32, tie_embeddings=True)
    shared = model.src_embed.embedding.weight
    assert model.tgt_embed.embedding.weight is shared and model.projection_layer.proj.weight is shared
    assert sum(p.numel() for p in model.parameters()) == \
        sum(p.numel() for p in build_transformer(50, 50, 16, 16, d_model=16, N=1, h=2, d_ff=32).parameters()) - 2 * 50 * 16
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    src = torch.randint(4, 50, (2, 5))
    model(src, src, None, None).sum().backward()
    optimizer.step()
    assert model.tgt_embed.embedding.weight.data_ptr() == model.projection_layer.proj.weight.data_ptr() == \
        shared.data_ptr()
    reloaded = build_transformer(50, 50, 16, 16, d_model=16, N=1, h=2, d_ff=32, tie_embeddings=True)
    reloaded.load_state_dict(model.state_dict())
    assert reloaded.projection_layer.proj.weight is reloaded.src_embed.embedding.weight
    torch.testing.assert_close(reloaded.tgt_embed.embedding.weight, shared)


def test_tying_refuses_mismatched_vocabularies() -> None:
    with pytest.raises(ValueError, match="shared vocabulary"):
        build_transformer(50, 60, 16, 16, d_model=16, N=1, h=2, d_ff=32, tie_embeddings=True)
    config = get_config()
    config["tie_embeddings"] = True
    with pytest.raises(ConfigError, match="joint_vocab"):
        validate_config(config)
    config["joint_vocab"] = True
    validate_config(config)


# ---------------------------------------------------------------------------- beam search

A, B = 4, 5
VOCAB = 6


class StubCache:
    """Each row's tokens so far; `select` reorders rows like the real KV cache."""

    def __init__(self) -> None:
        self.history: torch.Tensor | None = None
        self.length = 0

    def select(self, index: torch.Tensor) -> None:
        self.history = self.history.index_select(0, index)


class StubModel(torch.nn.Module):
    """Next-token probabilities looked up by prefix (after [SOS]); unknown prefixes end at once.
    "Hidden states" are the prefixes themselves, so `project` can look them up."""

    def __init__(self, table: dict[tuple[int, ...], dict[int, float]]) -> None:
        super().__init__()
        self.table = table
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
            for token, probability in self.table.get(prefix, {EOS_ID: 1.0}).items():
                logits[row, token] = math.log(probability)
        return logits.view(*hidden.shape[:-1], VOCAB)


def run_beam(model: StubModel, beam_size: int, length_penalty: float, n_best: int = 3, max_tokens: int = 10):
    src = torch.tensor([[SOS_ID, 7, EOS_ID]])
    return beam_search(model, src, torch.ones(1, 1, 1, 3, dtype=torch.bool), max_tokens, beam_size,
                       length_penalty, n_best)[0]


def test_beam_search_finds_the_better_sentence_greedy_misses() -> None:
    # Greedy takes A (0.6), then the best it can do is end: p([A]) = 0.6 * 0.4 = 0.24.
    # Beam 2 also keeps B (0.4), which then ends with 0.9: p([B]) = 0.36.
    table = {(): {A: 0.6, B: 0.4}, (A,): {EOS_ID: 0.4, A: 0.3, B: 0.3}, (B,): {EOS_ID: 0.9, A: 0.05, B: 0.05}}
    src, src_mask = torch.tensor([[SOS_ID, 7, EOS_ID]]), torch.ones(1, 1, 1, 3, dtype=torch.bool)
    assert greedy_decode(StubModel(table), src, src_mask, 10) == [[A]]
    assert [tokens for tokens, _ in run_beam(StubModel(table), 1, 1.0)] == [[A]]
    # Step 1 candidates: B-EOS 0.36, A-EOS 0.24, then A-A 0.18: two finished hypotheses end the search.
    # Both have length 2 ([B] or [A] plus EOS); the GNMT penalty ((5 + 2) / 6) ** 1 divides both.
    results = run_beam(StubModel(table), 2, 1.0)
    assert [tokens for tokens, _ in results] == [[B], [A]]
    torch.testing.assert_close(torch.tensor([s for _, s in results], dtype=torch.float64),
                               torch.tensor([math.log(0.36), math.log(0.24)], dtype=torch.float64) / (7 / 6))


def test_finished_hypotheses_are_length_normalised_and_never_extended() -> None:
    # Step 0: A 0.6, B 0.4.  Step 1: A-EOS 0.36 finishes; B-B 0.3 and A-A 0.24 are the beams
    # (B-A 0.1 drops out).  Step 2: B-B-B 0.3, A-A-A 0.24.  Step 3: both end.
    # Finished: [A] p 0.36 (length 2), [B B B] p 0.3 (length 4), [A A A] p 0.24 (length 4).
    table = {(): {A: 0.6, B: 0.4}, (A,): {EOS_ID: 0.6, A: 0.4}, (B,): {B: 0.75, A: 0.25},
             (B, B): {B: 1.0}, (A, A): {A: 1.0}}
    raw = {(A,): math.log(0.36), (B, B, B): math.log(0.3), (A, A, A): math.log(0.24)}
    for penalty, expected_order in ((0.0, [(A,), (B, B, B), (A, A, A)]), (1.0, [(B, B, B), (A,), (A, A, A)])):
        model = StubModel(table)
        results = run_beam(model, 2, penalty)
        assert [tuple(tokens) for tokens, _ in results] == expected_order
        expected = [raw[h] / ((5 + len(h) + 1) / 6) ** penalty for h in expected_order]
        torch.testing.assert_close(torch.tensor([s for _, s in results], dtype=torch.float64),
                                   torch.tensor(expected, dtype=torch.float64))
        # A hypothesis that ended with EOS is never fed back to the model.
        assert all(EOS_ID not in prefix for prefix in model.queried)
        assert (A,) in model.queried and (A, A, A) in model.queried and (A, A, A, EOS_ID) not in model.queried
    assert length_normalised(-1.5, 4, 1.0) == pytest.approx(-1.0)


def test_open_hypotheses_compete_when_tokens_run_out() -> None:
    # Nothing ends within 2 steps: both open beams are ranked by their normalised scores.
    table = {(): {A: 0.7, B: 0.3}, (A,): {A: 1.0}, (B,): {B: 1.0}}
    results = run_beam(StubModel(table), 2, 1.0, max_tokens=2)
    assert [tokens for tokens, _ in results] == [[A, A], [B, B]]
    torch.testing.assert_close(torch.tensor([s for _, s in results], dtype=torch.float64),
                               torch.tensor([math.log(0.7), math.log(0.3)], dtype=torch.float64) / (7 / 6))


def test_beam_size_one_equals_greedy_on_a_random_model() -> None:
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
    greedy = greedy_decode(model, src, src_mask, 12)
    beam = [hyps[0][0] for hyps in beam_search(model, src, src_mask, 12, 1)]
    assert beam == greedy
    lengths = {len(tokens) for tokens in greedy}
    assert len(lengths) > 1, "the case should mix finished and unfinished sentences"


# ---------------------------------------------------------------------------- checkpoint averaging

def tiny_state(model: torch.nn.Module, step: int, tokenizer) -> dict:
    config = get_config()
    config.update(d_model=16, num_layers=1, num_heads=2, d_ff=32, seq_len=16, tokenizer_type="bpe",
                  joint_vocab=True, tie_embeddings=True)
    return {"model": model.state_dict(), "config": config, "epoch": step, "global_step": step,
            "tokenizers": {"src": tokenizer.to_str(), "tgt": tokenizer.to_str()}}


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer([t for p in synthetic_pairs(200) for t in p], "bpe", 60, 1)


def test_averaging_identical_checkpoints_gives_the_same_weights(tmp_path, tokenizer) -> None:
    size = tokenizer.get_vocab_size()
    model = build_transformer(size, size, 16, 16, d_model=16, N=1, h=2, d_ff=32, tie_embeddings=True)
    for step in (10, 20):
        save_checkpoint(tmp_path, tiny_state(model, step, tokenizer), step, keep=5)
    paths = checkpoints_to_average(tmp_path, 2)
    assert [p.name for p in paths] == ["ckpt_00000020.pt", "ckpt_00000010.pt"]
    averaged = average_checkpoints(paths)
    assert averaged["global_step"] == 20
    assert averaged["model"].keys() == model.state_dict().keys()
    for key, value in model.state_dict().items():
        torch.testing.assert_close(averaged["model"][key], value, rtol=0, atol=1e-7)
    tied = averaged["model"]
    assert tied["src_embed.embedding.weight"] is tied["projection_layer.proj.weight"]
    loaded, *_ = load_for_inference(None, tmp_path, torch.device("cpu"), average=2)
    assert loaded.projection_layer.proj.weight is loaded.tgt_embed.embedding.weight
    torch.testing.assert_close(loaded.projection_layer.proj.weight, model.projection_layer.proj.weight)


def test_averaging_takes_the_mean_of_the_newest_checkpoints(tmp_path, tokenizer) -> None:
    size = tokenizer.get_vocab_size()
    models = [build_transformer(size, size, 16, 16, d_model=16, N=1, h=2, d_ff=32, tie_embeddings=True)
              for _ in range(3)]
    for step, model in zip((1, 2, 3), models):
        save_checkpoint(tmp_path, tiny_state(model, step, tokenizer), step, keep=5)
    averaged = average_checkpoints(checkpoints_to_average(tmp_path, 2, newest=tmp_path / "ckpt_00000002.pt"))
    assert averaged["global_step"] == 2
    for key in ("encoder.layers.0.feed_forward.linear_1.weight", "src_embed.embedding.weight"):
        expected = (models[0].state_dict()[key] + models[1].state_dict()[key]) / 2
        torch.testing.assert_close(averaged["model"][key], expected)
    with pytest.raises(CheckpointError, match="holds 3"):
        checkpoints_to_average(tmp_path, 4)


# ---------------------------------------------------------------------------- attention plot

def test_attention_weights_are_distributions_and_the_plot_is_a_png(tmp_path, tokenizer) -> None:
    torch.manual_seed(0)
    size = tokenizer.get_vocab_size()
    model = build_transformer(size, size, 24, 24, d_model=16, N=2, h=2, d_ff=32, tie_embeddings=True)
    model.train()
    sentence = "The cat sees the dog."
    sources, outputs, weights = cross_attention_weights(model, tokenizer, tokenizer, sentence)
    assert model.training, "the model's mode is restored"
    assert sources[0] == "[SOS]" and sources[-1] == "[EOS]" and len(sources) == len(encode_ids(tokenizer, sentence)) + 2
    assert weights.shape == (2, len(outputs), len(sources))
    torch.testing.assert_close(weights.sum(dim=-1), torch.ones(2, len(outputs)))
    path = save_attention_plot(model, tokenizer, tokenizer, sentence, tmp_path / "attention.png")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000
    figure = attention_figure(model, tokenizer, tokenizer, sentence, per_head=True)
    assert sum(ax.get_visible() for ax in figure.axes) == 2 + 1  # two heads and the colour bar


def test_attention_figure_logs_to_tensorboard(tmp_path, tokenizer) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter

    size = tokenizer.get_vocab_size()
    model = build_transformer(size, size, 24, 24, d_model=16, N=1, h=2, d_ff=32, tie_embeddings=True)
    writer = SummaryWriter(str(tmp_path))
    writer.add_figure("val/attention", attention_figure(model, tokenizer, tokenizer, "The dog eats."), 7)
    writer.close()
    events = EventAccumulator(str(tmp_path), size_guidance={"images": 0})
    events.Reload()
    [image] = events.Images("val/attention")
    assert image.step == 7 and image.width > 100 and image.encoded_image_string[:4] == b"\x89PNG"
