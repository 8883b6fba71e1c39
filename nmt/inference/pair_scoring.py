"""Sentence pairs scored by trained models: the model scoring of corpus cleaning (docs/cleaning.md).

`dual_conditional_cross_entropy` scores pairs with two trained models, source->target and
target->source (Junczys-Dowmunt 2018, "Dual conditional cross-entropy filtering of noisy parallel
corpora", WMT): with H_f and H_b the per-token cross-entropies of the target given the source and
of the source given the target, score = |H_f - H_b| + 0.5 (H_f + H_b), lower is better, and
exp(-score) the adequacy. A first run's models clean the corpus of a second.

The data store (nmt/corpora/store.py) keeps the best share of each corpus's training pairs by these
scores, but imports nothing of inference: the program that builds it (train.py, clean.py) hands it
`pair_scorer(config, device)`, a cleaning.PairScorer that loads the `clean_score_forward` and
`clean_score_backward` models when it is first asked, so that opening a built store loads none.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from nmt.corpora.sources import DataError, Pair
from nmt.corpora.tokenizer import EOS_ID, PAD_ID, SOS_ID, encode_texts
from nmt.inference.translator import TorchTranslator, TranslatorError
from nmt.device import pick_device
from nmt.precision import autocast_context, inference_dtype
from nmt.training.checkpoint import CheckpointError


def _padded(rows: list[list[int]], device: torch.device) -> torch.Tensor:
    out = torch.full((len(rows), max(map(len, rows))), PAD_ID, dtype=torch.long)
    for index, row in enumerate(rows):
        out[index, :len(row)] = torch.tensor(row, dtype=torch.long)
    return out.to(device)


def _batch_cross_entropy(model: torch.nn.Module, sources: list[list[int]], targets: list[list[int]],
                         device: torch.device) -> np.ndarray:
    """Per-token cross-entropy of each target given its source, teacher-forced, [EOS] included."""
    src = _padded([[SOS_ID, *ids, EOS_ID] for ids in sources], device)
    decoder_input = _padded([[SOS_ID, *ids] for ids in targets], device)
    label = _padded([[*ids, EOS_ID] for ids in targets], device)
    src_mask = (src != PAD_ID)[:, None, None, :]
    logits = model.project(model.decode(model.encode(src, src_mask), src_mask, decoder_input))
    losses = F.cross_entropy(logits.float().transpose(1, 2), label, ignore_index=PAD_ID, reduction="none")
    return (losses.sum(1) / (label != PAD_ID).sum(1)).cpu().numpy()


def conditional_cross_entropy(translator: TorchTranslator, sources: Sequence[str], targets: Sequence[str],
                              target_lang: str, batch_size: int = 64) -> np.ndarray:
    """Per-token cross-entropy (nats) of each target given its source under the translator's model
    (`target_lang`: the language it is asked for, which tags the sources of a model of several),
    in batches of similar length. Sources are cut to the model's limit (max_source_tokens, the tag
    counted), targets to seq_len - 1 tokens: a pair's score needs no more."""
    model = translator.model
    device = next(model.parameters()).device
    src_ids = [source.ids[:translator.max_source_tokens]
               for source in translator.encode(sources, translator.source_tag(target_lang))]
    tgt_ids = [encoding.ids[:translator.seq_len - 1]
               for encoding in encode_texts(translator.tok_tgt, targets, ids_only=True)]
    order = sorted(range(len(src_ids)), key=lambda i: (len(src_ids[i]), len(tgt_ids[i])))
    entropies = np.zeros(len(src_ids), dtype=np.float64)
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode(), autocast_context(device, inference_dtype(device)):
            for start in range(0, len(order), batch_size):
                chunk = order[start:start + batch_size]
                entropies[chunk] = _batch_cross_entropy(model, [src_ids[i] for i in chunk],
                                                        [tgt_ids[i] for i in chunk], device)
    finally:
        model.train(was_training)
    return entropies


def dual_conditional_cross_entropy(pairs: Sequence[Pair], forward: TorchTranslator, backward: TorchTranslator,
                                   lang_src: str, lang_tgt: str, batch_size: int = 64) -> np.ndarray:
    """Each pair's score, |H_f - H_b| + 0.5 (H_f + H_b), lower is better (module docstring);
    `forward` translates lang_src into lang_tgt, `backward` lang_tgt into lang_src (a ValueError
    says which is not)."""
    for name, model, source, target in (("forward", forward, lang_src, lang_tgt),
                                        ("backward", backward, lang_tgt, lang_src)):
        languages = (model.model_config["lang_src"], model.target_languages)
        if languages[0] != source or target not in languages[1]:
            raise ValueError(f"the {name} model translates {languages[0]} into {'+'.join(languages[1])}, "
                             f"not {source} into {target}")
    h_forward = conditional_cross_entropy(forward, [s for s, _ in pairs], [t for _, t in pairs], lang_tgt, batch_size)
    h_backward = conditional_cross_entropy(backward, [t for _, t in pairs], [s for s, _ in pairs], lang_src,
                                           batch_size)
    return np.abs(h_forward - h_backward) + 0.5 * (h_forward + h_backward)


def load_scoring_models(config: dict[str, Any], device: torch.device) -> tuple[TorchTranslator, TorchTranslator]:
    """The models of `clean_score_forward` and `clean_score_backward` on `device`; a DataError names
    the option of one that cannot be loaded."""
    models = []
    for key in ("clean_score_forward", "clean_score_backward"):
        path = Path(config[key])
        try:
            models.append(TorchTranslator.load(path, path.parent, device))
        except (CheckpointError, TranslatorError) as error:
            raise DataError(f"--{key}: {error}") from None
    return models[0], models[1]


class DualScorer:
    """A cleaning.PairScorer over the config's scoring models, loaded when first asked (on `device`,
    or the config's: device.pick_device) and kept for the pairs asked after (every corpus of a run)."""

    def __init__(self, config: dict[str, Any], device: torch.device | None = None) -> None:
        self.config, self.device = config, device
        self.models: tuple[TorchTranslator, TorchTranslator] | None = None

    def __call__(self, pairs: Sequence[Pair], lang_src: str, lang_tgt: str) -> np.ndarray:
        if self.models is None:
            device = self.device or pick_device(self.config["device"])
            self.models = load_scoring_models(self.config, device)
        return dual_conditional_cross_entropy(pairs, *self.models, lang_src, lang_tgt)


def pair_scorer(config: dict[str, Any], device: torch.device | None = None) -> DualScorer | None:
    """What scores the training pairs the data store keeps (store.text_stores' `scorer`): the
    `clean_score_*` models' dual conditional cross-entropy, loaded on `device` (default: the
    config's) only when a store is built; None without clean_score_forward."""
    return DualScorer(config, device) if config["clean_score_forward"] else None
