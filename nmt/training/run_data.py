"""A training run's data: its stores and tokenizers (`prepare_data`, rank 0 building what the
other ranks then map, or their nodes' own copies of it), its batches and each epoch's loader, each
step's dropout seed, the corpora's names in the log, and what the training targets decide
(`repeat_limit`).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from torch.utils.data import DataLoader

from config import corpora, corpus_name
from dataset import BatchPlan, CorpusMix, MicroBatches, bucket_lengths
from nmt.corpora.store import (TextStore, TokenStore, data_record, term_store, text_stores, token_stores,
                                tokenizer_sample)
from nmt.corpora.terms import save_renderings
from nmt.corpora.tokenizer import save_tokenizers, tag_id, tokenizer_from_json, train_tokenizers
from nmt.diagnostics import log
from nmt.inference.decoding import REPEAT_SHARE, REPEAT_SIZES, repeat_free_ngram_size
from nmt.inference.pair_scoring import pair_scorer
from nmt.training.nodes import node_stores, store_files
from nmt.training.ranks import RankExchange, Ranks

REPEAT_SAMPLE = 100_000  # training targets read to pick no_repeat_ngram_size: enough for a share


class RunData(NamedTuple):
    """What prepare_data gives a run: the held-out (first corpus's) text store, every corpus's token
    store, the tokenizers, the data record (store.data_record) and on rank 0 the cleaning reports."""

    held_out: TextStore
    tokens: list[TokenStore]
    tok_src: Any
    tok_tgt: Any
    record: dict[str, Any] | None
    cleaning_reports: list[dict[str, Any]]


def prepare_data(config: dict[str, Any], folder: Path, exchange: RankExchange, is_main: bool,
                 checkpoint: dict[str, Any] | None, origin: str, held_out_from: str | None = None,
                 folder_owner: bool = False) -> RunData:
    """The held-out (first corpus's) text store, every corpus's token store, and the tokenizers.
    Rank 0 (`is_main`) opens or builds the stores (store.py; the held-out splits of the store
    `held_out_from` when given) and, for a new run, trains the tokenizers on a sample of all the
    corpora's training pairs, reserving the run's tags, and saves them in `folder`; the other ranks
    wait, then take rank 0's tokenizers (JSON through the job's store; saved in `folder` by a rank
    that writes a node's own, `folder_owner`) and map rank 0's stores, or their node's own copies
    of them (nodes.node_stores: no shared disk needed). A resumed or fine-tuned run's tokenizers come
    from its checkpoint (`origin`), which must hold every corpus's tag. Rank 0 records what the run
    trains on, for every rank."""
    record, reports, posted = None, [], None
    if checkpoint is not None:
        tok_src = tokenizer_from_json(checkpoint["tokenizers"]["src"])
        tok_tgt = tokenizer_from_json(checkpoint["tokenizers"]["tgt"])
        for corpus in corpora(config):
            if corpus.tag:
                tag_id(tok_src, corpus.tag, origin)
    if is_main:
        texts = text_stores(config, held_out_from, pair_scorer(config))
        record = data_record(config, texts, held_out_from)
        if checkpoint is None:
            tok_src, tok_tgt = train_tokenizers(config, lambda: tokenizer_sample(config, texts))
            save_tokenizers(folder, config, tok_src, tok_tgt)
            sample = min(sum(text.size("train") for text in texts), config["tokenizer_max_sentences"])
            log(f"trained {config['tokenizer_type']} tokenizers on {sample} training pairs: "
                f"{tok_src.get_vocab_size()} source and {tok_tgt.get_vocab_size()} target entries")
        tokens = token_stores(config, texts, tok_src, tok_tgt)
        save_renderings(folder, term_store(config, texts).word_list().renderings)  # for its glossaries
        held_out = texts[0]
        reports = [report for text in texts if (report := text.cleaning()) is not None]
        posted = {"folders": [str(held_out.folder), *(str(store.folder) for store in tokens)],
                  "files": store_files([held_out, *tokens]), "record": record, "held_out_from": held_out_from,
                  "tokenizers": None if checkpoint is not None else [tok_src.to_str(), tok_tgt.to_str()]}
    posted = exchange.from_rank0(posted)  # the other ranks wait here while rank 0 builds
    if not is_main:
        if checkpoint is None:
            tok_src, tok_tgt = (tokenizer_from_json(text) for text in posted["tokenizers"])
            if folder_owner:
                save_tokenizers(folder, config, tok_src, tok_tgt)
        held_out, tokens = node_stores(config, posted["folders"], posted["files"], posted["held_out_from"], tok_src,
                                       tok_tgt)
        record = posted["record"]
    return RunData(held_out, tokens, tok_src, tok_tgt, record, reports)


def corpus_labels(config: dict[str, Any]) -> list[str]:
    """One name per corpus for the log and TensorBoard: its short name, numbered by its place in
    `datasource` when an earlier corpus has the same name (tatoeba, tatoeba.2)."""
    labels: list[str] = []
    for place, corpus in enumerate(corpora(config), start=1):
        name = corpus_name(corpus.source)
        labels.append(f"{name}.{place}" if name in labels else name)
    return labels


def repeat_limit(train_ds: CorpusMix, seed: int) -> int:
    """The n-gram size the model's decoders never repeat (no_repeat_ngram_size -1), picked from the
    training targets, a seeded sample of REPEAT_SAMPLE where there are more: the same on every rank."""
    indices = np.arange(len(train_ds))
    if len(indices) > REPEAT_SAMPLE:
        indices = np.random.default_rng(seed).choice(indices, REPEAT_SAMPLE, replace=False)
    limit = repeat_free_ngram_size([train_ds[int(i)][1].tolist() for i in indices])
    log(f"no_repeat_ngram_size {limit}: " + (
        f"the smallest n-gram size from 3 that under {REPEAT_SHARE:.0%} of the training targets repeat, which "
        f"decoding will not" if limit else f"every n-gram size up to {REPEAT_SIZES[-1]} repeats in "
        f"{REPEAT_SHARE:.0%} of the training targets or more: decoding bans no repeat"))
    return limit


def batch_plan(train_ds: CorpusMix, config: dict[str, Any], ranks: Ranks) -> BatchPlan:
    """This rank's batches of every epoch, from the config's batch settings: in length buckets where
    the step is captured as CUDA graphs (cuda_graphs on: one graph per bucket's shape)."""
    return BatchPlan(train_ds, config["batch_tokens"], config["seed"], ranks.world_size, ranks.rank,
                     config["accum_steps"], [corpus.weight for corpus in corpora(config)],
                     bucket_lengths(config["seq_len"]) if config["cuda_graphs"] == "on" else None)


def epoch_loader(train_ds: CorpusMix, batches: BatchPlan, epoch: int, batches_done: int, config: dict[str, Any],
                 device: torch.device) -> DataLoader:
    """This rank's micro-batches of `epoch` from `batches_done` on, collated by DataLoader workers
    (num_workers; -1: two on CUDA, none elsewhere)."""
    workers = config["num_workers"] if config["num_workers"] >= 0 else (2 if device.type == "cuda" else 0)
    # Its own generator: a loader draws worker seeds from the global RNG otherwise, which would
    # shift the dropout stream of a run resumed mid-epoch.
    return DataLoader(MicroBatches(train_ds, batches.micro_batches(epoch, batches_done), batches.shape_of),
                      batch_size=None, shuffle=False, num_workers=workers, pin_memory=device.type == "cuda",
                      generator=torch.Generator().manual_seed(config["seed"] + epoch))


def step_seed(seed: int, rank: int, step: int) -> int:
    """The seed of the dropout stream of optimizer step `step` on `rank`: a function of those three
    alone, so a resumed run, on any rank, draws exactly what the unbroken run drew."""
    return int(np.random.SeedSequence([seed, rank, step]).generate_state(1, dtype=np.uint64)[0])
