"""The training step's arithmetic: gradient accumulation, bf16 autocast on CPU."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import train
from nmt.training.loss import loss_sum
from config import get_config
from dataset import BilingualDataset, token_batches
from model import build_model
from synthetic_data import synthetic_pairs, tiny_corpus
from nmt.corpora.tokenizer import train_tokenizers


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
