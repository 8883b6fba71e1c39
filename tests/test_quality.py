"""Quality features: subword tokenizers, tied embeddings, checkpoint averaging. (Attention plots:
tests/test_attention_plot.py.)"""
from __future__ import annotations

import pytest
import torch

from nmt.training.checkpoint import average_checkpoints, checkpoints_to_average, load_for_inference, save_checkpoint, CheckpointError
from config import ConfigError, get_config, validate_config
from model import build_transformer
from synthetic_data import synthetic_pairs
from nmt.corpora.tokenizer import decode_ids, encode_ids, train_tokenizer
from nmt.inference.translator import TorchTranslator

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


def test_averaging_never_takes_a_checkpoint_written_steps_after_another(tmp_path, tokenizer) -> None:
    """A clock stop at step 305, just after the epoch's end at 300: the two are nearly one point."""
    size = tokenizer.get_vocab_size()
    model = build_transformer(size, size, 16, 16, d_model=16, N=1, h=2, d_ff=32, tie_embeddings=True)
    for step in (100, 200, 300, 305):
        save_checkpoint(tmp_path, tiny_state(model, step, tokenizer), step, keep=5)
    spaced = [p.name for p in checkpoints_to_average(tmp_path, 3)]  # half the median spacing: 50 steps
    assert spaced == ["ckpt_00000305.pt", "ckpt_00000200.pt", "ckpt_00000100.pt"]
    assert [p.name for p in checkpoints_to_average(tmp_path, 2, min_gap=5)] == ["ckpt_00000305.pt", "ckpt_00000300.pt"]
    with pytest.raises(CheckpointError, match="of which 2 are at least 150 steps apart"):
        checkpoints_to_average(tmp_path, 3, min_gap=150)
    assert load_for_inference(None, tmp_path, torch.device("cpu"), average=3)[4] == tmp_path / "ckpt_00000305.pt"


def test_best_latest_and_average_load_what_they_name(tmp_path, tokenizer, capsys) -> None:
    size = tokenizer.get_vocab_size()
    models = {}
    for step, chrf in ((10, 30.0), (20, 50.0), (30, 40.0)):
        models[step] = build_transformer(size, size, 16, 16, d_model=16, N=1, h=2, d_ff=32, tie_embeddings=True)
        save_checkpoint(tmp_path, tiny_state(models[step], step, tokenizer), step, keep=1,
                        metrics={"bleu": 1.0, "chrf": chrf, "loss": 2.0}, best_metric="chrf")
    for choice, step in (("best", 20), ("latest", 30), ("average", 30)):  # no average written: the newest
        loaded, *_, path = load_for_inference(None, tmp_path, torch.device("cpu"), choice=choice)
        assert path.name == f"ckpt_{step:08d}.pt"
        torch.testing.assert_close(loaded.state_dict(), models[step].state_dict(), rtol=0, atol=0)
    # No choice given: the config's default (best), in the loader and in the translator alike.
    assert get_config()["checkpoint_choice"] == "best"
    assert load_for_inference(None, tmp_path, torch.device("cpu"))[4].name == "ckpt_00000020.pt"
    assert TorchTranslator.load(None, tmp_path, torch.device("cpu")).path.name == "ckpt_00000020.pt"
    unscored = tmp_path / "unscored"
    save_checkpoint(unscored, tiny_state(models[10], 10, tokenizer), 10, keep=1)
    assert load_for_inference(None, unscored, torch.device("cpu"), choice="best")[4] == unscored / "ckpt_00000010.pt"
    assert capsys.readouterr().err == f"{unscored} has no best checkpoint (no validation has scored one yet): using " \
                                      f"the newest\n"
