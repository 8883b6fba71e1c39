"""The training step's arithmetic: gradient accumulation, the lr schedule, bf16 autocast on CPU."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import train
from loss import loss_sum
from config import get_config
from dataset import BilingualDataset, token_batches
from model import build_model
from synthetic_data import synthetic_pairs, tiny_corpus
from tokenizer import train_tokenizers


def test_accumulating_four_micro_batches_equals_one_batch_of_all(tmp_path: Path) -> None:
    """accum 4 x batch b gives the gradient of batch 4b: each micro-batch's summed loss is divided
    by the token count of the whole step, as the training loop does."""
    config = dict(get_config(), d_model=32, num_heads=2, d_ff=64, num_layers=2, dropout=0.0, min_frequency=1,
                  seq_len=64)
    pairs = synthetic_pairs(300, 1)
    tok_src, tok_tgt = train_tokenizers(config, lambda: iter(pairs))
    dataset = BilingualDataset.from_pairs(pairs, tok_src, tok_tgt, config["seq_len"])
    micro = token_batches(dataset.src_lens, dataset.tgt_lens, 120, np.random.default_rng(0))[:4]
    assert len({int(dataset.src_lens[b].max()) for b in micro}) > 1, "micro-batches should pad differently"
    step_tokens = int(sum(dataset.tgt_lens[b].sum() for b in micro))

    torch.manual_seed(0)
    model = build_model(config, tok_src.get_vocab_size(), tok_tgt.get_vocab_size())

    def gradients(batches: list[np.ndarray]) -> dict[str, torch.Tensor]:
        model.zero_grad(set_to_none=True)
        for indices in batches:
            batch = dataset.collate(indices)
            logits = model(batch["encoder_input"], batch["decoder_input"], batch.get("src_mask"))
            (loss_sum(logits, batch["label"], 0.1) / step_tokens).backward()
        return {n: p.grad.clone() for n, p in model.named_parameters()}

    accumulated = gradients(micro)
    whole = gradients([np.concatenate(micro)])
    for name in whole:
        torch.testing.assert_close(accumulated[name], whole[name], rtol=1e-4, atol=1e-6, msg=name)


def test_weight_decay_applies_to_weight_matrices_only() -> None:
    """Decay on the linear layers' weights; never on biases, LayerNorms or embeddings (nor on the
    projection when it is the tied embedding matrix)."""
    for tied in (False, True):
        config = dict(get_config(), d_model=16, num_heads=2, d_ff=32, num_layers=1, seq_len=16, weight_decay=0.01,
                      joint_vocab=tied, tie_embeddings=tied)
        model = build_model(config, 30, 30)
        decay, no_decay = train.build_optimizer(model, config).param_groups
        names = {id(p): name for name, p in model.named_parameters()}
        decayed = {names[id(p)] for p in decay["params"]}
        kept = {names[id(p)] for p in no_decay["params"]}
        assert (decay["weight_decay"], no_decay["weight_decay"]) == (0.01, 0.0)
        assert decayed | kept == set(names.values()) and not decayed & kept
        assert "encoder.layers.0.self_attention.w_q.weight" in decayed
        assert "decoder.layers.0.feed_forward.linear_2.weight" in decayed
        assert "encoder.layers.0.self_attention.w_q.bias" in kept and "decoder.norm.weight" in kept
        assert "src_embed.embedding.weight" in kept
        assert ("projection_layer.proj.weight" in decayed) is not tied


def test_inverse_sqrt_schedule_without_warmup_decays_from_the_first_step() -> None:
    config = dict(get_config(), lr=1e-3, warmup_steps=0)
    assert [train.lr_factor(step, config, 100) for step in (0, 3, 99)] == pytest.approx([1.0, 0.5, 0.1])


def test_inverse_sqrt_schedule_peaks_at_warmup() -> None:
    config = dict(get_config(), lr=1e-3, warmup_steps=100)
    factors = [train.lr_factor(step, config, 1000) for step in range(400)]
    assert factors[99] == pytest.approx(1.0)
    assert factors[0] == pytest.approx(0.01)
    assert factors[399] == pytest.approx((100 / 400) ** 0.5)
    assert max(factors) == pytest.approx(1.0)


def test_cosine_schedule_ends_at_min_lr() -> None:
    config = dict(get_config(), lr=1e-3, warmup_steps=10, lr_schedule="cosine", min_lr=1e-5)
    assert train.lr_factor(9, config, 100) == pytest.approx(1.0)
    assert train.lr_factor(99, config, 100) == pytest.approx(1e-2)


def test_bf16_autocast_on_cpu_trains(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    data = tiny_corpus(tmp_path / "data")
    assert train.main(["--datasource", str(data), "--preset", "tiny", "--amp", "bf16", "--max_steps", "30",
                       "--num_epochs", "100", "--log_every", "5", "--model_folder", str(tmp_path / "w"),
                       "--runs_folder", str(tmp_path / "r"), "--store_folder", str(tmp_path / "s"),
                       "--val_max_sentences", "4"]) == 0
    err = capsys.readouterr().err
    assert "autocast bfloat16" in err
    state = torch.load(max((tmp_path / "w").glob("*/ckpt_*.pt")), weights_only=True)
    assert all(t.dtype == torch.float32 and torch.isfinite(t).all() for t in state["model"].values()), \
        "master weights stay fp32"
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    events = EventAccumulator(str(next((tmp_path / "r").iterdir())))
    events.Reload()
    losses = [e.value for e in events.Scalars("train/loss")]
    assert len(losses) == 6 and losses[-1] < losses[0] * 0.8, losses
