"""pair_scoring.py: dual conditional cross-entropy is Junczys-Dowmunt's score of the models' own
cross-entropies, and the scorer a program hands the data store loads its models only when first
asked, once, and names the option of a model it cannot load."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from config import get_config
from model import build_transformer
from nmt.corpora.sources import DataError
from nmt.corpora.tokenizer import EOS_ID, SOS_ID, encode_ids, train_tokenizer
from nmt.inference.pair_scoring import (DualScorer, conditional_cross_entropy, dual_conditional_cross_entropy,
                                        pair_scorer)
from nmt.inference.translator import TorchTranslator

PAIRS = [("the cat sees the dog", "il gatto vede il cane"), ("the dog", "il cane"),
         ("a big red house", "una grande casa rossa"), ("the cat", "il gatto vede il cane grande")]


def tiny_translator(pairs: list[tuple[str, str]], lang_src: str, lang_tgt: str, seed: int) -> TorchTranslator:
    """An untrained d_model 16 model over word-level tokenizers of `pairs` (source, target)."""
    torch.manual_seed(seed)
    tok_src = train_tokenizer([s for s, _ in pairs], "wordlevel", 100, 1)
    tok_tgt = train_tokenizer([t for _, t in pairs], "wordlevel", 100, 1)
    model = build_transformer(tok_src.get_vocab_size(), tok_tgt.get_vocab_size(), 16, 16, d_model=16, N=1, h=2,
                              dropout=0.0, d_ff=32)
    return TorchTranslator(model, tok_src, tok_tgt, dict(get_config(), seq_len=16, lang_src=lang_src,
                                                         lang_tgt=lang_tgt))


def one_by_one(translator: TorchTranslator, source: str, target: str) -> float:
    """The mean cross-entropy of `target` given `source`, one sentence at a time, without padding."""
    src = torch.tensor([[SOS_ID, *encode_ids(translator.tok_src, source), EOS_ID]])
    ids = encode_ids(translator.tok_tgt, target)
    logits = translator.model(src, torch.tensor([[SOS_ID, *ids]]))
    return F.cross_entropy(logits[0].float(), torch.tensor([*ids, EOS_ID])).item()


def test_dual_conditional_cross_entropy_is_junczys_dowmunts_score() -> None:
    pairs = PAIRS
    forward = tiny_translator(pairs, "en", "it", seed=0)
    backward = tiny_translator([(t, s) for s, t in pairs], "it", "en", seed=1)
    h_f = conditional_cross_entropy(forward, [s for s, _ in pairs], [t for _, t in pairs], "it", batch_size=3)
    h_b = torch.tensor([one_by_one(backward, t, s) for s, t in pairs], dtype=torch.float64)
    torch.testing.assert_close(torch.from_numpy(h_f), torch.tensor([one_by_one(forward, s, t) for s, t in pairs],
                                                                   dtype=torch.float64), rtol=1e-5, atol=1e-5)
    scores = dual_conditional_cross_entropy(pairs, forward, backward, "en", "it", batch_size=2)
    expected = (torch.from_numpy(h_f) - h_b).abs() + 0.5 * (torch.from_numpy(h_f) + h_b)
    torch.testing.assert_close(torch.from_numpy(scores), expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="the forward model translates it into en, not en into it"):
        dual_conditional_cross_entropy(pairs, backward, forward, "en", "it")


def test_the_scorer_loads_the_models_when_first_asked_and_once(tmp_path: Path, untrained_checkpoint) -> None:
    forward = untrained_checkpoint(tmp_path / "forward", PAIRS, "en", "it")
    backward = untrained_checkpoint(tmp_path / "backward", [(t, s) for s, t in PAIRS], "it", "en")
    config = {**get_config(), "clean_score_forward": str(forward), "clean_score_backward": str(backward)}
    assert pair_scorer(get_config()) is None
    scorer = pair_scorer(config, torch.device("cpu"))
    assert isinstance(scorer, DualScorer) and scorer.models is None  # opening a built store loads nothing
    scores = scorer(PAIRS, "en", "it")
    models = scorer.models
    loaded = [TorchTranslator.load(path, path.parent, torch.device("cpu")) for path in (forward, backward)]
    torch.testing.assert_close(torch.from_numpy(scores),
                               torch.from_numpy(dual_conditional_cross_entropy(PAIRS, *loaded, "en", "it")))
    scorer(PAIRS[:2], "en", "it")
    assert scorer.models is models
    with pytest.raises(ValueError, match="the forward model translates en into it, not it into en"):
        scorer(PAIRS, "it", "en")


def test_a_model_the_scorer_cannot_load_is_named_by_its_option(tmp_path: Path, untrained_checkpoint) -> None:
    forward = untrained_checkpoint(tmp_path / "forward", PAIRS, "en", "it")
    config = {**get_config(), "clean_score_forward": str(forward),
              "clean_score_backward": str(tmp_path / "gone" / "ckpt.pt")}
    with pytest.raises(DataError, match=r"^--clean_score_backward: "):
        pair_scorer(config, torch.device("cpu"))(PAIRS, "en", "it")
