"""How training scores itself: the validation subset, its loss and its decoding, shared out over the
ranks of a torchrun job and scored on rank 0, and what a validation is expected to cost before the
first one runs (the plan to the clock needs it).

A validation decodes each distinct source of a fixed subset of the validation split once
(`validation_subset`), as inference decodes (`val_beam_size`, the config's penalties), and scores it
against all its references together (`scoring.grouped_scores`): what `best_metric` and early
stopping follow. Beside those, the line-by-line scores (nrefs:1), CER and WER, and in TensorBoard a
few examples and a cross-attention heatmap. Once training ends, `fit_confidence` fits the
confidence calibrator on the validation split.
"""
from __future__ import annotations

import io
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from config import corpora
from dataset import BatchPlan, BilingualDataset
from model import Transformer
from nmt.corpora.tokenizer import EOS_ID, encode_texts
from nmt.diagnostics import log
from nmt.inference.confidence import CalibrationError, fit_on_pairs, save_calibrator
from nmt.inference.scoring import corpus_scores, grouped_scores
from nmt.inference.translator import DecodingOptions, TorchTranslator, TranslatorError
from nmt.training.checkpoint import CheckpointError
from nmt.training.attention_plot import attention_figure
from nmt.training.loss import loss_sum


def validation_subset(pairs: list[tuple[str, str]], cap: int, seed: int) -> list[tuple[str, str]]:
    """The validation pairs that are decoded: those of at most `cap` distinct sources (all when 0),
    drawn once with the seed, in the split's order. A source that the split repeats with several
    references comes with all of them: it is decoded once and scored against them all."""
    sources = list(dict.fromkeys(source for source, _ in pairs))
    if not cap or len(sources) <= cap:
        return list(pairs)
    chosen = {sources[i] for i in np.random.default_rng(seed).choice(len(sources), cap, replace=False)}
    return [pair for pair in pairs if pair[0] in chosen]


@torch.no_grad()
def validation_loss(model: Transformer, val_ds: BilingualDataset, config: dict[str, Any], device: torch.device,
                    rank: int = 0, world_size: int = 1) -> tuple[torch.Tensor, int]:
    """Teacher-forced cross-entropy (no smoothing) summed over every `world_size`-th batch of the
    split from `rank`'s, as a tensor on `device`, and those batches' target tokens: the count comes
    from the lengths on the host, so no batch waits on a device read."""
    total, tokens = torch.zeros((), device=device), 0
    plan = BatchPlan(val_ds, config["batch_tokens"], config["seed"])
    for indices in plan.epoch_batches(0)[rank::world_size]:
        batch = {k: v.to(device) for k, v in val_ds.collate(indices).items()}
        logits = model(batch["encoder_input"], batch["decoder_input"], batch.get("src_mask"))
        total += loss_sum(logits, batch["label"], 0.0)
        tokens += int(val_ds.tgt_lens[indices].sum())
    return total, tokens


def validation_options(config: dict[str, Any]) -> DecodingOptions:
    """How validation decodes: `val_beam_size`, never sampling, the config's penalties. The held-out
    splits are the first corpus's: in a model of several target languages, into its language."""
    return DecodingOptions.from_config(config, beam_size=config["val_beam_size"], sampling_topk=0, sampling_topp=0.0,
                                       target_lang=corpora(config)[0].lang_tgt)


@torch.no_grad()
def validation_share(model: Transformer, val_ds: BilingualDataset, sources: list[str], tok_src, tok_tgt,
                     config: dict[str, Any], device: torch.device, rank: int = 0, world_size: int = 1) -> dict[str, Any]:
    """One rank's share of a validation, as plain data for rank 0: its share of the loss, and its
    translations of every `world_size`-th of the distinct `sources`, decoded as inference decodes
    (`val_beam_size`, with the length and brevity penalties of the config)."""
    model.eval()
    total, tokens = validation_loss(model, val_ds, config, device, rank, world_size)
    translator = TorchTranslator(model, tok_src, tok_tgt, config)
    hypotheses = translator.translate_best(sources[rank::world_size], validation_options(config))
    model.train()
    return {"loss_sum": float(total), "tokens": tokens, "hypotheses": hypotheses}


def validation_metrics(shares: list[dict[str, Any]], pairs: list[tuple[str, str]], model: Transformer, tok_src,
                       tok_tgt, config: dict[str, Any], writer, global_step: int) -> dict[str, float]:
    """Rank 0's scores of the ranks' shares, logged to TensorBoard at the step and printed: BLEU and
    chrF of each distinct source once against all its references, and line by line (nrefs:1) BLEU,
    chrF, CER and WER, each line of a repeated source carrying that source's one translation."""
    distinct = list(dict.fromkeys(source for source, _ in pairs))
    translation = {source: shares[i % len(shares)]["hypotheses"][i // len(shares)] for i, source in enumerate(distinct)}
    sources, references = [p[0] for p in pairs], [p[1] for p in pairs]
    hypotheses = [translation[source] for source in sources]
    lines, grouped = corpus_scores(hypotheses, references), grouped_scores(sources, hypotheses, references)
    metrics = {"loss": sum(s["loss_sum"] for s in shares) / max(1, sum(s["tokens"] for s in shares)),
               "bleu": grouped["bleu"], "chrf": grouped["chrf"], "bleu_nrefs1": lines["bleu"],
               "chrf_nrefs1": lines["chrf"], "cer": lines["cer"], "wer": lines["wer"]}
    for name, value in metrics.items():
        writer.add_scalar(f"val/{name}", value, global_step)
    examples = [f"SOURCE: {source}\nTARGET: {reference}\nOUTPUT: {hypothesis}"
                for source, reference, hypothesis in list(zip(sources, references, hypotheses))[:config["num_examples"]]]
    if examples:
        writer.add_text("val/examples", "\n\n".join(e.replace("\n", "  \n") for e in examples), global_step)
        attention = TorchTranslator(model, tok_src, tok_tgt, config).cross_attention(sources[0],
                                                                                     corpora(config)[0].lang_tgt)
        writer.add_figure("val/attention", attention_figure(attention), global_step)
    print(f"step {global_step}: val loss {metrics['loss']:.3f} | BLEU {metrics['bleu']:.2f} | chrF {metrics['chrf']:.2f} "
          f"on {len(distinct)} distinct sources with {len(pairs)} references | line by line: BLEU "
          f"{metrics['bleu_nrefs1']:.2f}, chrF {metrics['chrf_nrefs1']:.2f}, CER {metrics['cer']:.3f}, WER "
          f"{metrics['wer']:.3f} ({lines['bleu_signature']})", flush=True)
    for example in examples:
        print(example, flush=True)
    return metrics


def run_validation(model: Transformer, val_ds: BilingualDataset, pairs: list[tuple[str, str]], tok_src, tok_tgt,
                   config: dict[str, Any], device: torch.device, writer, global_step: int) -> dict[str, float]:
    """A whole validation in one process: `pairs` decoded (each distinct source once) and scored."""
    sources = list(dict.fromkeys(source for source, _ in pairs))
    share = validation_share(model, val_ds, sources, tok_src, tok_tgt, config, device)
    return validation_metrics([share], pairs, model, tok_src, tok_tgt, config, writer, global_step)


class UnendingModel(torch.nn.Module):
    """The model as decoding calls it (encode, decode, project), except that no sentence ends: [EOS]
    is never chosen, so a decode runs to the length it is given whatever the model writes. The plan
    times a young model's decoding with it: one that ends every sentence at its first step decodes
    in a moment what validations later decode to the references' length."""

    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.model = model

    def encode(self, src: torch.Tensor, src_mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.model.encode(src, src_mask)

    def decode(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self.model.decode(*args, **kwargs)

    def project(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.model.project(x)
        logits[..., EOS_ID] = float("-inf")
        return logits

    def new_cache(self) -> Any:
        return self.model.new_cache()


SAMPLE_SENTENCES = 32  # validation sources whose decoding the estimate times


def validation_cost(model: Transformer, val_ds: BilingualDataset | None, pairs: list[tuple[str, str]], tok_src,
                    tok_tgt, config: dict[str, Any], device: torch.device, clock: Callable[[], float], rank: int = 0,
                    world_size: int = 1) -> tuple[float, float]:
    """A validation's expected seconds: the loss over this rank's share of the split, timed, and the
    decoding of a sample of the sources, timed and scaled to the distinct sources of `pairs`; and
    the same for the confidence fit after the last checkpoint (rank 0, the fit's sources with the
    decoding options; 0 without a fit). The sample is decoded to the length of its longest reference
    and never ends sooner (UnendingModel): a model this young writes anything from nothing to
    endless repeats, and a validation costs what it costs once the model writes sentences of the
    references' lengths."""
    if not pairs:
        return 0.0, 0.0
    started = clock()
    model.eval()
    validation_loss(model, val_ds, config, device, rank, world_size)
    loss_seconds = clock() - started
    sample, lang_tgt = pairs[:SAMPLE_SENTENCES], corpora(config)[0].lang_tgt
    translator = TorchTranslator(UnendingModel(model), tok_src, tok_tgt, config)
    sources = translator.encode([source for source, _ in sample], translator.source_tag(lang_tgt))
    longest = max(len(e.ids) for e in encode_texts(tok_tgt, [target for _, target in sample], ids_only=True))

    def per_sentence(options: DecodingOptions) -> float:
        # Timed the second time: the first pays once for its new shapes (kernels loaded, memory allocated).
        translator.translate_batch(sources, options, longest + 1)  # the words and their [EOS]
        decode_started = clock()
        translator.translate_batch(sources, options, longest + 1)
        return (clock() - decode_started) / len(sample)

    distinct = len(dict.fromkeys(source for source, _ in pairs))
    validation = loss_seconds + per_sentence(validation_options(config)) * distinct / world_size
    fit = 0.0
    if config["confidence_sentences"] and rank == 0:
        fit = per_sentence(DecodingOptions.from_config(config, target_lang=lang_tgt)) * \
            min(config["confidence_sentences"], distinct)
    model.train()
    return validation, fit


def checkpoint_cost(model: torch.nn.Module, optimizer: torch.optim.Optimizer, clock: Callable[[], float]) -> float:
    """A checkpoint's expected seconds: the model's and optimizer's state serialised once in memory,
    doubled for hashing and writing it."""
    started = clock()
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, io.BytesIO())
    return 2 * (clock() - started)


def fit_confidence(folder: Path, pairs: list[tuple[str, str]], config: dict[str, Any], device: torch.device) -> None:
    """After the last checkpoint: the confidence calibrator (confidence.py) of the checkpoint that
    translators will use (checkpoint_choice), fitted on the validation `pairs` with the decoding
    options and stored beside the checkpoints in `folder`. One that cannot be fitted (too few
    sentences, all good or all bad) is a warning line: the model is trained, and evaluate.py
    --fit_confidence can fit one later."""
    try:
        translator = TorchTranslator.load(None, folder, device, choice=config["checkpoint_choice"],
                                          min_gap=config["average_min_gap_steps"])
        options = DecodingOptions.from_config(config)
        calibrator = fit_on_pairs(pairs, lambda sources: [h[0] for h in translator.translate(sources, options)],
                                  config["confidence_chrf_threshold"], config["confidence_sentences"])
        path = save_calibrator(folder, calibrator, translator.source)
    except (CalibrationError, CheckpointError, TranslatorError, OSError) as error:
        log(f"warning: no confidence calibrator: {error}")
        return
    log(f"saved {path}: the confidence calibrator of {translator.source}, fitted on {calibrator.sentences} "
        f"validation sentences")
