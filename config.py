"""The one config dict that drives every program: its schema, presets, command lines and files.

Every key is declared once, in `OPTIONS`: its default, its one line of help, its group, its allowed
values or range, and the programs that use it. Everything else is derived from that table:
`get_config()` (the defaults: the paper's base model on the Hub's opus_books en->it), the keys that
make a model (`MODEL_KEYS`) and a run (`IDENTITY_KEYS`), validation, each program's command line
(only the keys it uses, grouped, each with its help, default and choices) and the table of options
in docs/options.md.

`parse_args(program, argv)` applies, in order: the defaults, `--config FILE` (a run's config.json,
or a JSON or TOML file of keys), `--preset NAME`, then every `--key value`; validates the result, and
exits with one line naming the key when something is wrong. Paths of run artefacts are derived here
and nowhere else, and so are the training corpora that `datasource` names (`corpora`), their tags
and a model's target languages.
"""
from __future__ import annotations

import argparse
import difflib
import json
import math
import os
import re
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from nmt.text_files import TextFileError, read_text

VERSION = "1.0.0"

TRAIN, TRANSLATE, EVALUATE, SERVE, EXPORT, CLEAN = "train", "translate", "evaluate", "serve", "export", "clean"
PROGRAMS = (TRAIN, TRANSLATE, EVALUATE, SERVE, EXPORT, CLEAN)
DECODERS = frozenset({TRANSLATE, EVALUATE, SERVE})  # the programs that translate with a trained model
CLEANERS = frozenset({TRAIN, CLEAN})
EVERY = frozenset(PROGRAMS)

# Groups in the order --help shows them, each with its heading.
GROUPS = {
    "data": "data: the corpora, their languages and how they are split",
    "cleaning": "cleaning: rules that remove training pairs before they are learned (docs/cleaning.md)",
    "tokenizers": "tokenizers: trained on the training split of a new run",
    "model": "model: the Transformer's sizes",
    "optimisation": "optimisation: batches, AdamW and the learning-rate schedule",
    "run": "run: length, precision, device and randomness",
    "validation": "validation: how training scores itself and picks its best checkpoint",
    "checkpoints": "checkpoints: where a run lives, which checkpoint to start from or to translate with",
    "decoding": "decoding: how text is segmented and translations are searched",
    "serving": "serving (serve.py): request limits, batching and overload",
}


@dataclass(frozen=True)
class Range:
    """Allowed numbers: at least `low` (above it when `low_open`), at most `high` (below it when
    `high_open`); None is no bound. NaN is never a number, and an infinity only where a closed
    bound names it (Range(0, math.inf): an option whose help then says what infinity means)."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def admits(self, value: float) -> bool:
        if math.isnan(value) or (math.isinf(value) and value not in (self.low, self.high)):
            return False
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)

    def __str__(self) -> str:
        if self.high is None:
            return f"{'>' if self.low_open else '>='} {self.low:g}"
        return f"{'(' if self.low_open else '['}{self.low:g}, {self.high:g}{')' if self.high_open else ']'}"


AT_LEAST_ONE, NON_NEGATIVE, POSITIVE = Range(1), Range(0), Range(0, low_open=True)
FRACTION = Range(0, 1, high_open=True)  # [0, 1)
SECONDS = Range(0, math.inf, low_open=True, high_open=True)


@dataclass(frozen=True)
class Option:
    """One config key: its default (whose type is the key's type), one line of help, its group,
    its allowed values (`choices`) or `range`, the programs whose command line takes it, and whether
    it is part of what a model is made of (`model`: --init_from takes it from the checkpoint) or of
    what a run is (`identity`: resuming with another value is refused). `auto`: the key's type, for
    a key that also takes the word auto (AUTO), which the run decides and records (train.py)."""

    default: Any
    help: str
    group: str
    programs: frozenset[str] = frozenset({TRAIN})
    choices: tuple[Any, ...] = ()
    range: Range | None = None
    model: bool = False
    identity: bool = False
    auto: type | None = None
    kind: type = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", self.auto or type(self.default))


AUTO = "auto"  # what an option with `auto` takes besides its type's values


O = Option
OPTIONS: dict[str, Option] = {
    # ---- data
    "datasource": O("Helsinki-NLP/opus_books", "the training corpora: a Hub id, a Hub-layout folder, a PREFIX "
                    "of PREFIX.SRC + PREFIX.TGT, a TSV file, or SOURCE[:WEIGHT[:TAG]],... (docs/data.md); elsewhere: "
                    "names the run",
                    "data", EVERY,
                    identity=True),
    "lang_src": O("en", "source language code", "data", EVERY, model=True, identity=True),
    "lang_tgt": O("it", "target language code; several joined with + (fr+it) for one model of several target "
                  "languages", "data", EVERY, model=True, identity=True),
    "valid_data": O("", "validation pairs given apart (a PREFIX or a TSV file); empty: the datasource's own",
                    "data", frozenset({TRAIN, EVALUATE}), identity=True),
    "test_data": O("", "test pairs given apart (a PREFIX or a TSV file); empty: the datasource's own", "data",
                   frozenset({TRAIN, EVALUATE}), identity=True),
    "reserved_tags": O("<BT>", "tag tokens reserved in the tokenizers beside those the corpora carry, comma-separated",
                       "data", model=True),
    "term_annotation": O(0.0, "share of training sources annotated with linked target words, so that the model "
                              "places glossary terms (docs/glossary.md); needs joint_vocab", "data",
                         range=Range(0, 1), identity=True),
    "val_fraction": O(0.05, "share of a train-only source carved out for validation", "data", range=FRACTION,
                      identity=True),
    "test_fraction": O(0.05, "share of a train-only source carved out for test", "data", range=FRACTION,
                       identity=True),
    "val_max_pairs": O(3000, "at most this many carved validation pairs", "data", range=NON_NEGATIVE, identity=True),
    "test_max_pairs": O(3000, "at most this many carved test pairs", "data", range=NON_NEGATIVE, identity=True),
    "filter_duplicates": O(False, "drop training pairs that repeat an earlier pair exactly", "data"),
    "filter_max_length_ratio": O(0.0, "drop training pairs whose token lengths differ by more than this factor; 0: off",
                                 "data", range=NON_NEGATIVE),
    "store_folder": O("stores", "where the tokenized data stores live, reused by restarts, resumes and every rank",
                      "data", frozenset({TRAIN, EVALUATE})),
    "max_line_bytes": O(65536, "longest corpus line in bytes: longer ones are skipped and counted, never read whole; "
                               "translate.py reads a longer input line in pieces",
                        "data", frozenset({TRAIN, EVALUATE, CLEAN, TRANSLATE}), range=Range(64)),
    "data_changed": O("refuse", "resuming on corpora whose content changed: refuse, or keep_held_out (train on the "
                                "new content, keep the held-out splits)", "data",
                      choices=("refuse", "keep_held_out")),
    "allow_train_overlap": O(False, "evaluate.py: score a split even where some sources were trained on (said "
                                    "loudly); false: refuse it", "data", frozenset({EVALUATE})),
    "seq_len": O(256, "longest sentence in tokens, [SOS] and [EOS] included; longer training pairs are dropped",
                 "data", range=Range(3)),
    # ---- cleaning (cleaning.py): 0 or false turns a rule off
    "clean": O(True, "clean the training split with the rules below before it is learned (model scoring: "
                     "clean_score_forward)", "cleaning"),
    "clean_min_chars": O(1, "fewest characters on each side", "cleaning", CLEANERS, range=NON_NEGATIVE),
    "clean_max_chars": O(1000, "most characters on each side", "cleaning", CLEANERS, range=NON_NEGATIVE),
    "clean_bad_characters": O(True, "remove pairs with control, surrogate, private-use or replacement characters",
                              "cleaning", CLEANERS),
    "clean_copies": O(True, "remove pairs whose source equals their target", "cleaning", CLEANERS),
    "clean_max_length_ratio": O(3.0, "most characters of the longer side per character of the shorter; 0: off",
                                "cleaning", CLEANERS, range=NON_NEGATIVE),
    "clean_ratio_min_chars": O(30, "the length ratio is judged only when the longer side has this many characters",
                               "cleaning", CLEANERS, range=NON_NEGATIVE),
    "clean_script_min_share": O(0.5, "least share of a side's letters in its language's script", "cleaning",
                                CLEANERS, range=Range(0, 1)),
    "clean_langid_pair_threshold": O(0.9, "remove a side that py3langid reads as the pair's other language with this "
                                     "confidence", "cleaning", CLEANERS, range=Range(0, 1)),
    "clean_langid_other_threshold": O(0.98, "remove a side that py3langid reads as a third language with this "
                                      "confidence", "cleaning", CLEANERS, range=Range(0, 1)),
    "clean_near_duplicates": O(True, "remove pairs equal to an earlier one once casefolded, without punctuation "
                               "and spaces", "cleaning", CLEANERS),
    "clean_swap_sides": O(True, "swap a pair's sides back when each reads as the other's language",
                          "cleaning", CLEANERS),
    "clean_samples": O(5, "removed pairs written beside the store (clean.py: shown) per reason", "cleaning",
                       CLEANERS, range=NON_NEGATIVE),
    "clean_score_forward": O("", "a lang_src->lang_tgt checkpoint: with clean_score_backward, keep the "
                                 "clean_score_keep of pairs best by dual conditional cross-entropy "
                                 "(docs/cleaning.md)",
                             "cleaning", CLEANERS),
    "clean_score_backward": O("", "checkpoint of a lang_tgt->lang_src model trained on these corpora (see "
                              "clean_score_forward)", "cleaning", CLEANERS),
    "clean_score_keep": O(0.9, "share of each corpus's training pairs left by the rules that scoring keeps, the "
                          "best scored", "cleaning", CLEANERS, range=Range(0, 1, low_open=True)),
    # ---- tokenizers
    "tokenizer_type": O("wordlevel", "the tokenizers' model", "tokenizers", choices=("wordlevel", "bpe", "unigram"),
                        model=True, identity=True),
    "vocab_size": O(8000, "entries per tokenizer (wordlevel: the most frequent words seen min_frequency times)",
                    "tokenizers", range=AT_LEAST_ONE, model=True, identity=True),
    "min_frequency": O(2, "a token must occur this often in the training sample", "tokenizers", range=AT_LEAST_ONE,
                       model=True, identity=True),
    "tokenizer_max_sentences": O(1_000_000, "the tokenizers train on a seeded sample of at most this many pairs",
                                 "tokenizers", range=AT_LEAST_ONE),
    "joint_vocab": O(False, "one tokenizer for both languages", "tokenizers", model=True, identity=True),
    # ---- model
    "d_model": O(512, "width of every layer; 3/4 of it and of d_ff in a CPU's --max_minutes plan fitting under a "
                      "quarter of the epochs, unless either is given", "model", range=AT_LEAST_ONE, model=True,
                 identity=True),
    "num_layers": O(6, "encoder layers, and as many decoder layers; a --max_minutes plan on a CPU too slow for "
                       "the epochs trains one fewer unless given", "model", range=AT_LEAST_ONE, model=True,
                    identity=True),
    "num_heads": O(8, "attention heads; must divide d_model", "model", range=AT_LEAST_ONE, model=True, identity=True),
    "d_ff": O(2048, "inner width of the feed-forward blocks", "model", range=AT_LEAST_ONE, model=True, identity=True),
    "dropout": O(0.1, "dropout on embeddings, attention weights and sublayer outputs; a --max_minutes plan "
                     "scales it to its epochs unless given", "model", range=FRACTION),
    "norm_first": O(True, "pre-norm (true: trains stably without a finely tuned warmup) or the paper's post-norm",
                    "model", model=True, identity=True),
    "tie_embeddings": O(False, "share the embeddings and the output projection; needs joint_vocab", "model",
                        model=True, identity=True),
    # ---- optimisation
    "batch_tokens": O(AUTO, "token budget of one batch (padded; source or target, whichever is larger); auto: a "
                            "GPU's largest that fits (docs/gpu.md), 4096 on a CPU, where a --max_minutes plan too "
                            "slow for num_epochs takes smaller ones",
                      "optimisation", range=AT_LEAST_ONE, auto=int),
    "accum_steps": O(1, "batches accumulated into one optimizer step", "optimisation", range=AT_LEAST_ONE),
    "update_tokens": O(25000, "tokens of an optimizer step (all ranks) that accum_steps reaches where batch_tokens is "
                              "auto on a GPU or this is given; 0: accum_steps as given", "optimisation",
                       range=NON_NEGATIVE),
    "lr": O(7e-4, "peak learning rate, reached at the end of warmup (7e-4: the paper's d_model**-0.5 x 4000**-0.5)",
            "optimisation", range=POSITIVE),
    "warmup_steps": O(0, "linear warmup over this many steps; 0: warmup_fraction of the run's steps", "optimisation",
                      range=NON_NEGATIVE),
    "warmup_fraction": O(0.1, "warmup as a share of the run's steps, when warmup_steps is 0", "optimisation",
                         range=FRACTION),
    "lr_schedule": O("inverse_sqrt", "decay after warmup: the paper's inverse square root, cosine to min_lr at "
                     "the last step, or wsd (the peak held, then linear to min_lr over decay_fraction)",
                     "optimisation", choices=("inverse_sqrt", "cosine", "wsd")),
    "decay_fraction": O(0.2, "wsd: the share of the steps after warmup spent decaying", "optimisation",
                        range=FRACTION),
    "min_lr": O(1e-5, "the final learning rate of cosine and wsd", "optimisation", range=NON_NEGATIVE),
    "weight_decay": O(0.0, "AdamW's decay, on weight matrices only", "optimisation", range=NON_NEGATIVE),
    "adam_beta1": O(0.9, "AdamW's beta1", "optimisation", range=FRACTION),
    "adam_beta2": O(0.98, "AdamW's beta2 (the paper's)", "optimisation", range=FRACTION),
    "adam_eps": O(1e-9, "AdamW's epsilon (the paper's)", "optimisation", range=NON_NEGATIVE),
    "label_smoothing": O(0.1, "label smoothing of the cross-entropy", "optimisation", range=FRACTION),
    "clip_grad": O(1.0, "clip the gradient's norm to this; 0: no clipping", "optimisation", range=NON_NEGATIVE),
    # ---- run
    "num_epochs": O(20, "epochs to train", "run", range=AT_LEAST_ONE),
    "max_steps": O(0, "stop after this many optimizer steps (the schedule ends there); 0: no limit", "run",
                   range=NON_NEGATIVE),
    "max_minutes": O(0.0, "wall-clock budget, the last validation and checkpoint included, and a plan's "
                          "confidence fit; 0: no limit", "run", range=NON_NEGATIVE),
    "seed": O(42, "seed of the weights, the data split, the batches and dropout (translate.py: of sampling)", "run",
              frozenset({TRAIN, TRANSLATE, SERVE, CLEAN}), identity=True),
    "amp": O("auto", "mixed precision: auto is bf16 on CUDA from compute capability 8.0 (before: fp16, loss-scaled) "
                     "and on CPUs with AVX-512 BF16 or AMX, else off", "run", choices=("auto", "off", "bf16", "fp16")),
    "compile": O(False, "torch.compile the model for training", "run"),
    "cuda_graphs": O("auto", "the training step as CUDA graphs (docs/gpu.md); auto: on for one CUDA process "
                             "without fp16, --compile or --deterministic", "run", choices=("auto", "on", "off")),
    "deterministic": O(False, "torch.use_deterministic_algorithms: bit-exact repeats and resumes on CUDA, slower",
                       "run"),
    "num_workers": O(-1, "DataLoader workers; -1: 2 on CUDA, 0 elsewhere", "run", range=Range(-1)),
    "device": O("auto", "auto: CUDA, else MPS, else CPU; naming a device that is not there is an error", "run",
                frozenset({TRAIN, TRANSLATE, EVALUATE, SERVE, CLEAN}), choices=("auto", "cpu", "cuda", "mps")),
    "keep_freed_memory": O(True, "on a CPU, glibc's malloc keeps freed memory for reuse (faster steps; the heap "
                                 "stays at its peak)", "run"),
    "max_nonfinite_steps": O(10, "consecutive skipped (non-finite) steps before the run stops", "run",
                             range=AT_LEAST_ONE),
    "rank_timeout_s": O(60.0, "torchrun: seconds without a sign of life from a rank before every rank stops, "
                        "naming it", "run", range=AT_LEAST_ONE),
    "log_every": O(20, "log the loss, learning rate and speed to TensorBoard every N steps", "run",
                   range=AT_LEAST_ONE),
    "runs_folder": O("runs", "TensorBoard logs (runs/<experiment>); evaluate.py writes its translations there",
                     "run", frozenset({TRAIN, EVALUATE})),
    # ---- validation
    "validate_every_steps": O(0, "also validate and checkpoint every N optimizer steps; 0: at epoch ends only "
                              "(a --max_minutes plan: only its last ones, within a share of its budget)",
                              "validation", range=NON_NEGATIVE),
    "val_max_sentences": O(0, "distinct validation sources decoded, a fixed subset drawn with the seed; 0: all",
                           "validation", range=NON_NEGATIVE),
    "val_beam_size": O(5, "beam size of validation's decoding", "validation", range=AT_LEAST_ONE),
    "confidence_sentences": O(1000, "validation sources the confidence calibrator is fitted on (docs/glossary.md); "
                                    "0: no fit after training", "validation", frozenset({TRAIN, EVALUATE}),
                              range=NON_NEGATIVE),
    "confidence_chrf_threshold": O(50.0, "the confidence calibrator's good translation: sentence chrF at least this",
                                   "validation", frozenset({TRAIN, EVALUATE}), range=Range(0, 100)),
    "num_examples": O(3, "validation examples printed and logged", "validation", range=NON_NEGATIVE),
    "early_stopping_patience": O(0, "validations without a better best_metric before stopping; 0: never",
                                 "validation", range=NON_NEGATIVE),
    "best_metric": O("bleu", "the validation metric that picks the best checkpoint", "validation",
                     choices=("bleu", "chrf", "loss")),
    # ---- checkpoints
    "model_folder": O("weights", "where runs keep their checkpoints, tokenizers and config (weights/<experiment>)",
                      "checkpoints", EVERY),
    "experiment_name": O("", "the run's name; empty: train.py derives it from datasource and pair, the others take "
                             "the only run under model_folder", "checkpoints", EVERY),
    "init_from": O("", "fine-tuning: a checkpoint whose weights, tokenizers, architecture and languages start a new "
                       "experiment (fresh optimizer, schedule, steps)", "checkpoints"),
    "preload": O("latest", "latest: resume the newest good checkpoint, if any; new: refuse a folder with "
                           "checkpoints; or a checkpoint path to continue", "checkpoints"),
    "keep_checkpoints": O(3, "checkpoints kept by rotation (the best one is always kept)", "checkpoints",
                          range=AT_LEAST_ONE),
    "average_checkpoints": O(0, "at the end of training, save the average of the newest N checkpoints; 0: off",
                             "checkpoints", range=NON_NEGATIVE),
    "save_every_steps": O(0, "also checkpoint every N optimizer steps; 0: at epoch ends (a --max_minutes "
                          "plan: within a share of its budget)", "checkpoints", range=NON_NEGATIVE),
    "checkpoint_choice": O("best", "the checkpoint to translate with: best (best_metric on validation), latest, or "
                                   "average (training's)", "checkpoints", DECODERS | {EXPORT},
                           choices=("best", "latest", "average")),
    "average_min_gap_steps": O(0, "averaged checkpoints lie at least this many steps apart; 0: half their median "
                               "spacing", "checkpoints", DECODERS | {TRAIN, EXPORT}, range=NON_NEGATIVE),
    # ---- decoding
    "split_sentences": O("auto", "split lines into sentences (sentencex); auto: on in translate.py and serve.py, "
                         "off in evaluate.py and validation", "decoding", DECODERS | {TRAIN},
                         choices=("auto", "true", "false")),
    "beam_size": O(5, "beam width; 1: greedy search", "decoding", DECODERS, range=AT_LEAST_ONE),
    "length_penalty": O(1.0, "hypothesis scores are log-probability / length ** length_penalty", "decoding",
                        DECODERS | {TRAIN}, range=NON_NEGATIVE),
    "brevity_penalty": O(0.2, "plus this x log(BLEU's brevity penalty) against length_ratio x the source length "
                         "(Sockeye's; 0: off)", "decoding", DECODERS | {TRAIN}, range=NON_NEGATIVE),
    "length_ratio": O(0.0, "target / source tokens the brevity penalty expects; 0: train.py measures it on the "
                      "training data", "decoding", DECODERS | {TRAIN}, range=NON_NEGATIVE),
    "sampling_topk": O(0, "sample from the k most likely tokens instead of searching (implies beam_size 1); 0: off",
                       "decoding", frozenset({TRANSLATE, SERVE}), range=NON_NEGATIVE),
    "sampling_topp": O(0.0, "sample from the smallest set of tokens reaching this probability (implies beam_size 1); "
                       "0: off", "decoding", frozenset({TRANSLATE, SERVE}), range=Range(0, 1)),
    "temperature": O(1.0, "sampling: divide the logits by this first", "decoding", frozenset({TRANSLATE, SERVE}),
                     range=POSITIVE),
    "no_repeat_ngram_size": O(-1, "never produce an n-gram of this size twice in one output; 0: off; -1: the "
                              "model's (train.py picks it from its training targets)", "decoding",
                              DECODERS | {TRAIN}, range=Range(-1)),
    "eval_batch_size": O(64, "sentences per decoding batch", "decoding", DECODERS | {TRAIN}, range=AT_LEAST_ONE),
    "target_lang": O("", "a model of several target languages: the one to translate into", "decoding", DECODERS),
    "glossary": O("", "a TSV of terms (source TAB target): a sentence holding the source term is translated with the "
                      "target term (docs/glossary.md)", "decoding",
                  frozenset({TRANSLATE, EVALUATE})),
    "glossary_max_terms": O(10000, "terms a --glossary file may hold", "decoding", frozenset({TRANSLATE, EVALUATE}),
                            range=AT_LEAST_ONE),
    "glossary_beam_size": O(10, "beam width, at least, for a sentence holding a glossary term (its constraints share "
                                "the beam); others use beam_size", "decoding", DECODERS,
                            range=Range(2)),
    "compute_type": O("auto", "--engine ctranslate2: the weights' type at run time; auto: per machine", "decoding",
                      DECODERS, choices=("auto", "default", "int8", "int8_float32", "int8_float16", "int8_bfloat16",
                                         "int16", "float16", "bfloat16", "float32")),
    # ---- serving
    "serve_max_sentences": O(32, "sentences in one request", "serving", frozenset({SERVE}), range=AT_LEAST_ONE),
    "serve_max_chars": O(1000, "characters of a request's text (the string form) or of each sentence (the list form)",
                               "serving", frozenset({SERVE}), range=AT_LEAST_ONE),
    "serve_max_body_bytes": O(65536, "a larger request body gets 413", "serving", frozenset({SERVE}),
                              range=AT_LEAST_ONE),
    "serve_max_beam_size": O(8, "the largest beam_size a request may ask for", "serving", frozenset({SERVE}),
                             range=AT_LEAST_ONE),
    "serve_glossary_max_terms": O(100, "terms a request's glossary may hold", "serving", frozenset({SERVE}),
                                  range=AT_LEAST_ONE),
    "confidence_mark_below": O(0.5, "the page marks a translated sentence whose confidence is below this", "serving",
                               frozenset({SERVE}), range=Range(0, 1)),
    "serve_batch_sentences": O(64, "sentences decoded together, gathered from concurrent requests", "serving",
                               frozenset({SERVE}), range=AT_LEAST_ONE),
    "serve_batch_wait_ms": O(10, "how long a batch waits for more requests once its first has arrived", "serving",
                             frozenset({SERVE}), range=NON_NEGATIVE),
    "serve_max_queued_work": O(2560, "work (sentences x beam size) that may wait for the model; past it, 503 with "
                               "Retry-After", "serving", frozenset({SERVE}), range=AT_LEAST_ONE),
    "serve_request_timeout_s": O(30.0, "from a request's arrival to its answer; then 503 with Retry-After", "serving",
                                 frozenset({SERVE}), range=SECONDS),
    "serve_body_timeout_s": O(10.0, "a request body that takes longer to arrive gets 408", "serving",
                              frozenset({SERVE}), range=SECONDS),
    "serve_header_timeout_s": O(5.0, "close a connection that has not sent a whole request head this long after "
                                     "opening (TLS handshake included) or its last answer", "serving",
                                frozenset({SERVE}), range=SECONDS),
    "serve_max_connections": O(4096, "open connections at most (fewer under a lower open-file limit); at the limit a "
                                     "new one closes the longest-idle, or gets 503", "serving",
                               frozenset({SERVE}), range=AT_LEAST_ONE),
    "serve_drain_grace_s": O(20.0, "on SIGTERM or Ctrl-C, how long the requests held may take (below Kubernetes' "
                             "30 s before SIGKILL)", "serving", frozenset({SERVE}),
                             range=Range(0, math.inf, high_open=True)),
}
del O

MODEL_KEYS = tuple(key for key, option in OPTIONS.items() if option.model)
IDENTITY_KEYS = tuple(key for key, option in OPTIONS.items() if option.identity)


def get_config() -> dict[str, Any]:
    """Defaults: the paper's base Transformer on Helsinki-NLP/opus_books, English to Italian."""
    return {key: option.default for key, option in OPTIONS.items()}


# Sizes selectable with --preset; anything not named keeps its default.
PRESETS: dict[str, dict[str, Any]] = {
    "base": {},
    "big": {"d_model": 1024, "num_heads": 16, "d_ff": 4096, "dropout": 0.3},
    # The best tatoeba BLEU in 15 minutes on a 2-core CPU (docs/quality.md has the evidence for each
    # setting). On a compute-bound CPU a small, cheap model taking many small steps beats a wider
    # one; 21 epochs fit the 15 minutes where --amp auto trains in bf16, and the longer run needs more
    # dropout than 0.1. wsd, not cosine: a short run still learns fastest at the peak rate, so it holds
    # the peak and decays only at the end.
    "cpu": {
        "d_model": 256, "num_layers": 3, "num_heads": 4, "d_ff": 512, "dropout": 0.15,
        "tokenizer_type": "bpe", "vocab_size": 6000, "joint_vocab": True, "tie_embeddings": True,
        "batch_tokens": 1500, "lr": 1.4e-3, "warmup_steps": 100, "lr_schedule": "wsd",
        "num_epochs": 21, "seq_len": 128, "eval_batch_size": 128, "keep_checkpoints": 5, "val_beam_size": 1,
    },
    # For tests and smoke runs: seconds, not minutes. fp32 on every CPU (--amp auto would be bf16 on
    # some), so that a run gives the same numbers on every machine; its products are too small to gain.
    "tiny": {
        "d_model": 32, "num_layers": 1, "num_heads": 2, "d_ff": 64, "dropout": 0.0,
        "batch_tokens": 512, "lr": 3e-3, "warmup_steps": 20, "seq_len": 64, "min_frequency": 1,
        "num_epochs": 2, "log_every": 5, "val_beam_size": 1, "amp": "off",
    },
}


class ConfigError(ValueError):
    """A config value that cannot be used; the message names the key."""


# ---------------------------------------------------------------------------- validation

def check_value(key: str, value: Any) -> Any:
    """`value` as key's type (an int is taken where a float is expected, as JSON writes 1.0 as 1),
    within its choices and range (never NaN, an infinity only where the range names it: Range); a
    ConfigError names the key otherwise."""
    option = OPTIONS[key]
    if option.auto and value == AUTO:
        return value
    if option.kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if type(value) is not option.kind:
        raise ConfigError(f"config key {key!r} must be {option.kind.__name__}, got {type(value).__name__}")
    if option.choices and value not in option.choices:
        raise ConfigError(f"--{key} must be one of {', '.join(map(str, option.choices))}, got {value!r}")
    if option.range is not None and not option.range.admits(value):
        finite = "" if math.isfinite(value) else "a finite number, "
        raise ConfigError(f"--{key} must be {finite}{option.range}, got {value}")
    return value


def validate_config(config: dict[str, Any]) -> None:
    """Refuse values that would fail later, naming the key: every key known, present, of its type,
    choices and range (`check_value`), then the relations between keys. Also used on configs read
    from checkpoints and files."""
    unknown = sorted(set(config) - set(OPTIONS))
    if unknown:
        raise ConfigError(f"unknown config key {unknown[0]!r}{closest(unknown[0])}")
    for key in OPTIONS:
        if key not in config:
            raise ConfigError(f"config key {key!r} is missing")
        config[key] = check_value(key, config[key])
    check_model(config)
    check_data(config)
    check_training(config)


def check_model(config: dict[str, Any]) -> None:
    if config["d_model"] % config["num_heads"]:
        raise ConfigError(f"--d_model {config['d_model']} is not divisible by --num_heads {config['num_heads']}")
    if config["d_model"] % 2:
        raise ConfigError(f"--d_model must be even for sinusoidal positions, got {config['d_model']}")
    if config["tie_embeddings"] and not config["joint_vocab"]:
        raise ConfigError("--tie_embeddings needs --joint_vocab true: separate vocabularies cannot share weights")
    if config["term_annotation"] and not config["joint_vocab"]:
        raise ConfigError("--term_annotation needs --joint_vocab true: the target terms are written in the sources, "
                          "in the target's vocabulary")


def check_data(config: dict[str, Any]) -> None:
    if config["val_fraction"] + config["test_fraction"] >= 1:
        raise ConfigError("--val_fraction and --test_fraction must leave training data")
    targets = target_languages(config)
    if not config["lang_src"] or "" in targets or config["lang_src"] in targets or len(set(targets)) < len(targets):
        raise ConfigError("--lang_src and --lang_tgt must be different, non-empty language codes (several targets "
                          "joined with +, e.g. fr+it)")
    for tag in config["reserved_tags"].split(",") if config["reserved_tags"] else []:
        if not TAG_PATTERN.fullmatch(tag):
            raise ConfigError(f"--reserved_tags: {tag!r} is not a tag: write it as <NAME>, e.g. <BT>")
    for key in ("filter_max_length_ratio", "clean_max_length_ratio"):
        if 0 < config[key] < 1:
            raise ConfigError(f"--{key} must be 0 (off) or at least 1, got {config[key]}")
    if bool(config["clean_score_forward"]) != bool(config["clean_score_backward"]):
        raise ConfigError("scoring needs a model each way: --clean_score_forward and --clean_score_backward, or "
                          "neither")
    if not config["datasource"]:
        raise ConfigError("--datasource must name a Hub dataset, a local folder, a PREFIX of parallel files or a TSV file")
    corpus_entries(config["datasource"])  # raises on a malformed corpus list


def check_training(config: dict[str, Any]) -> None:
    if (config["sampling_topk"] or config["sampling_topp"]) and config["beam_size"] != 1:
        raise ConfigError(f"sampling (--sampling_topk, --sampling_topp) draws one token at a time: it needs "
                          f"--beam_size 1, got {config['beam_size']}")
    if config["average_checkpoints"] > config["keep_checkpoints"]:
        raise ConfigError(f"--average_checkpoints {config['average_checkpoints']} needs --keep_checkpoints at least as "
                          f"large, got {config['keep_checkpoints']}")
    if config["min_lr"] > config["lr"]:
        raise ConfigError(f"--min_lr {config['min_lr']} is above the peak --lr {config['lr']}")


def closest(name: str, known: Iterable[str] = OPTIONS, prefix: str = "--") -> str:
    """'; did you mean --X?' for the name among `known` (the config's keys) closest to `name`, or ''."""
    found = difflib.get_close_matches(name.lstrip("-"), list(known), n=1, cutoff=0.6)
    return f"; did you mean {prefix}{found[0]}?" if found else ""


# ---------------------------------------------------------------------------- command lines and files

class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a bad command line in one line instead of usage + error, and names the
    closest known option of an unknown one, or the program that takes a key this one does not."""

    def error(self, message: str) -> None:  # type: ignore[override]
        unknown = re.match(r"unrecognized arguments: (--[\w-]+)", message)
        if unknown:
            message += self.suggestion(unknown.group(1)[2:])
        sys.stderr.write(f"{self.prog}: error: {message} (see --help)\n")
        raise SystemExit(2)

    def suggestion(self, name: str) -> str:
        if name in OPTIONS:
            users = [f"{program}.py" for program in PROGRAMS if program in OPTIONS[name].programs]
            takers = f"{', '.join(users[:-1])} and {users[-1]} take it" if len(users) > 1 else f"{users[0]} takes it"
            return f": {self.prog} has no use for --{name} ({takers})"
        known = [action.option_strings[-1][2:] for action in self._actions if action.option_strings]
        found = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
        return f"; did you mean --{found[0]}?" if found else ""


def parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def option_help(option: Option) -> str:
    """An option's help line: its meaning, then its allowed values or range, then its default."""
    allowed = f"; {option.range}" if option.range is not None and option.range != AT_LEAST_ONE else ""
    default = option.default if option.default != "" else '""'
    return f"{option.help}{allowed} (default: {default})"


def auto_or(kind: type) -> Any:
    """The command-line type of an option with `auto`: the word auto, or a value of `kind`."""
    def parse(text: str) -> Any:
        return AUTO if text == AUTO else kind(text)
    parse.__name__ = kind.__name__  # argparse names the type in its "invalid int value" line
    return parse


def build_parser(program: str | tuple[str, ...], description: str) -> OneLineParser:
    """`program`'s parser: --config, --preset (train.py), --print_config, --version, and one --key option
    per config key the program uses (any of several, for a benchmark that drives several), in groups,
    each with its help, default and choices. Programs add their own options after it."""
    programs = {program} if isinstance(program, str) else set(program)
    # No ArgumentDefaultsHelpFormatter: the argparse default of every key is None ("not given").
    parser = OneLineParser(description=description, allow_abbrev=False)
    parser.add_argument("--version", action="version", version=f"%(prog)s {VERSION}")
    parser.add_argument("--config", type=Path, default=None, metavar="FILE",
                        help="read keys from this JSON or TOML file first (a run's weights/<experiment>/config.json "
                             "reproduces the run); options given here win")
    parser.add_argument("--print_config", action="store_true", help="print the resolved config as JSON and exit")
    if TRAIN in programs:
        parser.add_argument("--preset", choices=sorted(PRESETS), default=None,
                            help="named size preset, applied after --config and before the --key options")
    for group, heading in GROUPS.items():
        keys = [key for key, option in OPTIONS.items() if option.group == group and option.programs & programs]
        if not keys:
            continue
        section = parser.add_argument_group(heading)
        for key in keys:
            option = OPTIONS[key]
            kind = parse_bool if option.kind is bool else auto_or(option.kind) if option.auto else option.kind
            metavar = "{" + ",".join(map(str, option.choices)) + "}" if option.choices else option.kind.__name__.upper()
            metavar += f"|{AUTO}" if option.auto else ""
            section.add_argument(f"--{key}", type=kind, default=None, metavar=metavar, help=option_help(option))
    return parser


RUN_FILE_KEYS = ("config", "given", "preset", "decided")  # the layout of the config.json train.py writes


@dataclass
class ConfigFile:
    """What --config FILE holds: its values, the keys among them that count as given, and the preset
    of the run it describes (a run's config.json; None in a file of keys)."""

    values: dict[str, Any]
    given: set[str]
    preset: str | None = None


def read_config_file(path: Path) -> ConfigFile:
    """--config FILE, JSON or TOML (.toml), UTF-8 with or without a byte-order mark: a run's
    config.json (`run_config`: only its "given" keys count as given) or a table of keys, all given,
    flat or in tables named by their groups (`flat_keys`); every value checked (`check_value`)."""
    data = parse_config_text(path)
    if "config" in data:
        return run_config(data, path)
    flat = flat_keys(data, path)
    if isinstance(flat.get("datasource"), list):
        flat["datasource"] = corpora_from_tables(flat["datasource"], path)
    return ConfigFile(checked_values(flat, path), set(flat))


def parse_config_text(path: Path) -> dict[str, Any]:
    """The table a config file holds; a ConfigError in one line naming the file for one that cannot
    be read, is not UTF-8, JSON or TOML, gives a JSON key twice in one table, or holds no table."""
    toml = path.suffix == ".toml"
    try:
        text = read_text(path, f"--config {path}")
        data = tomllib.loads(text) if toml else json.loads(text, object_pairs_hook=unique_keys)
    except TextFileError as error:
        raise ConfigError(str(error)) from None
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as error:
        raise ConfigError(f"--config {path}: not valid {'TOML' if toml else 'JSON'}: {error}") from None
    except ConfigError as error:
        raise ConfigError(f"--config {path}: {error}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"--config {path}: expected a table of keys")
    return data


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object's pairs as a dict, refusing a key given twice (json.loads keeps the last, silently)."""
    table: dict[str, Any] = {}
    for key, value in pairs:
        if key in table:
            raise ConfigError(f"{key} is given twice in one table")
        table[key] = value
    return table


def flat_keys(data: dict[str, Any], path: Path) -> dict[str, Any]:
    """A config file's keys taken out of their tables: a table named by a group (GROUPS) holds that
    group's keys alone, and a key is given once, at the top level or in its table."""
    flat: dict[str, Any] = {}
    places: dict[str, str] = {}
    for name, value in data.items():
        table = name if name in GROUPS and isinstance(value, dict) else ""
        for key, item in value.items() if table else [(name, value)]:
            if table and key in OPTIONS and OPTIONS[key].group != table:
                raise ConfigError(f"--config {path}: {key} belongs in [{OPTIONS[key].group}], not in [{table}]")
            place = f"in [{table}]" if table else "at the top level"
            if key in flat:
                raise ConfigError(f"--config {path}: {key} is given twice ({places[key]} and {place})")
            flat[key], places[key] = item, place
    return flat


def checked_values(values: dict[str, Any], path: Path) -> dict[str, Any]:
    """A config file's values, each known and checked (`check_value`), or a ConfigError naming the file."""
    checked = {}
    for key, value in values.items():
        if key not in OPTIONS:
            raise ConfigError(f"--config {path}: unknown key {key!r}{closest(key)}")
        try:
            checked[key] = check_value(key, value)
        except ConfigError as error:
            raise ConfigError(f"--config {path}: {error}") from None
    return checked


def run_config(data: dict[str, Any], path: Path) -> ConfigFile:
    """A run's config.json as train.py writes it: {"config": {every resolved key: value}, "given":
    [the keys its user gave], "preset": NAME or null, "decided": {key: {"value": v, "by": "..."}}}.
    The values are "config"'s, and only "given" counts as given; "decided" (what the data, the plan
    or a checkpoint settled) is the record of that run alone, not applied: a run decides again."""
    unknown = sorted(set(data) - set(RUN_FILE_KEYS))
    if unknown:
        raise ConfigError(f"--config {path}: unknown key {unknown[0]!r} in a run's config.json (its keys: "
                          f"{', '.join(RUN_FILE_KEYS)}){closest(unknown[0], RUN_FILE_KEYS, '')}")
    values, given, preset = data["config"], data.get("given"), data.get("preset")
    if not isinstance(values, dict):
        raise ConfigError(f"--config {path}: 'config' must be a table of keys")
    if not isinstance(given, list) or not all(isinstance(key, str) for key in given):
        raise ConfigError(f"--config {path}: 'given' must be the list of the keys the run's user gave")
    strays = [key for key in given if key not in values]
    if strays:
        raise ConfigError(f"--config {path}: 'given' names {strays[0]!r}, which 'config' does not hold")
    if preset is not None and preset not in PRESETS:
        raise ConfigError(f"--config {path}: 'preset' must be one of {', '.join(sorted(PRESETS))} or null, "
                          f"got {preset!r}")
    if not isinstance(data.get("decided", {}), dict):
        raise ConfigError(f"--config {path}: 'decided' must be a table of keys")
    return ConfigFile(checked_values(values, path), set(given), preset)


def corpora_from_tables(tables: list[Any], path: Path) -> str:
    """A config file's list of corpora ({source, weight, tag} tables, as TOML's [[datasource]]) as
    the one `datasource` string, every path escaped: a path may hold any character there."""
    entries = []
    for table in tables:
        if not isinstance(table, dict) or not isinstance(table.get("source"), str) or \
                set(table) - {"source", "weight", "tag"}:
            raise ConfigError(f"--config {path}: each corpus of datasource is a table of source, weight and tag")
        entry = escape_source(table["source"])
        if "weight" in table or "tag" in table:
            entry += f":{table.get('weight', 1)}"
        if table.get("tag"):
            entry += f":{table['tag']}"
        entries.append(entry)
    return ",".join(entries)


@dataclass
class Resolved:
    """A program's resolved config, and where its keys came from."""

    config: dict[str, Any]
    given: set[str]  # keys set on the command line or in --config
    preset: set[str]  # keys the preset set
    preset_name: str | None = None  # --preset's, else that of the run whose config.json --config reads


def resolve(args: argparse.Namespace) -> Resolved:
    """Defaults, then --config, then the preset, then explicit options; sampling without an explicit
    beam implies beam_size 1; validated. Given: the options and the file's given keys (all of a file
    of keys); the preset's keys: --preset's, else those of the preset a run's config.json names."""
    config = get_config()
    from_file = read_config_file(args.config) if getattr(args, "config", None) else ConfigFile({}, set())
    config.update(from_file.values)
    # --preset's values go over the file's; a run's config.json holds its own preset's already
    config.update(PRESETS[args.preset] if getattr(args, "preset", None) else {})
    preset = getattr(args, "preset", None) or from_file.preset
    given = set(from_file.given)
    for key in OPTIONS:
        value = getattr(args, key, None)
        if value is not None:
            config[key] = value
            given.add(key)
    if (config["sampling_topk"] or config["sampling_topp"]) and "beam_size" not in given:
        config["beam_size"] = 1
    validate_config(config)
    return Resolved(config, given, set(PRESETS[preset] if preset else {}) - given, preset)


def parse_args(program: str | tuple[str, ...], argv: Sequence[str] | None = None, description: str = "",
               parser: OneLineParser | None = None) -> tuple[argparse.Namespace, Resolved]:
    """Parse `program`'s command line (`parser`, or one with the config options alone) and resolve its
    config; a bad option, value or file exits with one line. --print_config prints and exits."""
    parser = parser or build_parser(program, description)
    args = parser.parse_args(argv)
    try:
        resolved = resolve(args)
    except ConfigError as error:
        parser.error(str(error))
        raise  # unreachable: error() exits
    if args.print_config:
        print(json.dumps(resolved.config, indent=1))
        raise SystemExit(0)
    return args, resolved


def parse_config(argv: Sequence[str] | None = None, program: str = TRAIN) -> dict[str, Any]:
    """The resolved config of a command line of config options alone (train.py's by default)."""
    return parse_args(program, argv)[1].config


def options_table() -> str:
    """docs/options.md's table: every key with its group, programs, default, allowed values and help."""
    lines = ["| option | default | allowed | programs | meaning |", "|---|---|---|---|---|"]
    for group, heading in GROUPS.items():
        lines.append(f"| **{heading.split(':')[0]}** | | | | |")
        for key, option in OPTIONS.items():
            if option.group != group:
                continue
            allowed = ", ".join(map(str, option.choices)) or (str(option.range) if option.range else "")
            allowed += f" or {AUTO}" if option.auto else ""
            users = [program for program in PROGRAMS if program in option.programs]
            programs = "all" if len(users) == len(PROGRAMS) else ", ".join(users)
            default = json.dumps(option.default)
            lines.append(f"| `--{key}` | `{default}` | {allowed} | {programs} | {option.help.replace('|', '/')} |")
    return "\n".join(lines) + "\n"


# A tag token: <BT> for back-translated pairs, <2fr> for "translate into French".
TAG_PATTERN = re.compile(r"<[A-Za-z0-9_.-]+>")
TARGET_TAG = re.compile(r"<2([A-Za-z0-9_-]+)>")
# term_annotation's tags (nmt/corpora/terms.py): before a source term, before its target term, after that
TERM_TAGS = ("<term>", "<term_as>", "<term_end>")
COMPRESSION_SUFFIXES = (".gz", ".bz2", ".xz")


@dataclass(frozen=True)
class Corpus:
    """One training corpus of `datasource`: where it is, its sampling weight (round(weight x n) of its
    n pairs each epoch), the tag its sources start with ("" = none), and the target language it is
    read in (`lang_tgt`, or the language of its <2xx> tag in a model of several target languages)."""

    source: str
    weight: float
    tag: str
    lang_tgt: str


def target_languages(config: dict[str, Any]) -> list[str]:
    """The languages a model produces: `lang_tgt`, or its +-joined list (fr+it) for several."""
    return config["lang_tgt"].split("+")


def target_tag(lang: str) -> str:
    """The source tag that asks a model of several target languages for `lang` (Johnson et al. 2017)."""
    return f"<2{lang}>"


MAX_WEIGHT = 100.0  # a corpus drawn more than 100 times an epoch is a typo, not a mix


def split_unescaped(text: str, separator: str) -> list[str]:
    r"""`text` split at each `separator` not escaped by a backslash; escapes (\\, \: and \,) kept."""
    parts, current, escaped = [], [], False
    for char in text:
        if escaped:
            current += ["\\", char]
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == separator:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    return parts + ["".join(current + (["\\"] if escaped else []))]


def unescape(text: str) -> str:
    return re.sub(r"\\(.)", r"\1", text)


def escape_source(source: str) -> str:
    """A SOURCE written so that `corpus_entries` reads it whole, whatever characters it holds."""
    return re.sub(r"([\\:,])", r"\\\1", source)


def corpus_entries(datasource: str) -> list[tuple[str, float, str]]:
    r"""(SOURCE, WEIGHT, TAG) of each comma-separated SOURCE[:WEIGHT[:TAG]] of `datasource`; a
    datasource that names an existing path as a whole is that one path, whatever it holds, and a
    backslash escapes a ':' or ',' in a path of a mix (runs/2024-01-01T10\:00/corpus:2). A ConfigError
    names a malformed entry or a weight outside (0, MAX_WEIGHT]."""
    if os.path.exists(datasource):
        return [(datasource, 1.0, "")]
    found = []
    for entry in split_unescaped(datasource, ","):
        parts = split_unescaped(entry, ":")
        if len(parts) > 3 or not parts[0].strip():
            raise ConfigError(f"--datasource: {entry!r} is not SOURCE[:WEIGHT[:TAG]] (write a ':' or ',' that a path "
                              f"holds as \\: or \\,)")
        source, weight, tag = [unescape(part) for part in (parts + ["", ""])[:3]]
        try:
            number = float(weight) if weight else 1.0
        except ValueError:
            raise ConfigError(f"--datasource: the weight of {source!r} must be a number, got {weight!r}") from None
        if not 0 < number <= MAX_WEIGHT:
            raise ConfigError(f"--datasource: the weight of {source!r} must be above 0 and at most {MAX_WEIGHT:g}, "
                              f"got {weight!r}")
        if tag and not TAG_PATTERN.fullmatch(tag):
            raise ConfigError(f"--datasource: the tag of {source!r} must be written <NAME>, e.g. <BT>, got {tag!r}")
        found.append((source.strip(), number, tag))
    return found


def corpora(config: dict[str, Any]) -> list[Corpus]:
    """The training corpora named by `datasource`: SOURCE[:WEIGHT[:TAG]] joined with commas. One
    SOURCE alone is today's single corpus. In a model of several target languages (`lang_tgt` fr+it)
    each corpus must carry the <2xx> tag of the target language it is read in (checked here, where
    training reads the corpora; the programs that only name a model do not need it)."""
    targets = target_languages(config)
    found = []
    for source, weight, tag in corpus_entries(config["datasource"]):
        target = TARGET_TAG.fullmatch(tag)
        if len(targets) > 1 and not (target and target.group(1) in targets):
            raise ConfigError(f"--datasource: with several target languages ({config['lang_tgt']}) each corpus needs "
                              f"the tag of its target language, one of {', '.join(map(target_tag, targets))}; "
                              f"{source!r} has {tag or 'none'}")
        found.append(Corpus(source, weight, tag, target.group(1) if len(targets) > 1 else targets[0]))
    return found


def tokenizer_tags(config: dict[str, Any]) -> list[str]:
    """The tag tokens reserved in a new run's tokenizers: `reserved_tags`, the target tags of a model of
    several target languages, every corpus tag, and with term_annotation TERM_TAGS, in that order, each once."""
    tags = config["reserved_tags"].split(",") if config["reserved_tags"] else []
    targets = target_languages(config)
    if len(targets) > 1:
        tags += [target_tag(lang) for lang in targets]
    tags += [tag for _, _, tag in corpus_entries(config["datasource"]) if tag]
    tags += list(TERM_TAGS) if config["term_annotation"] else []
    return list(dict.fromkeys(tags))


def corpus_name(source: str) -> str:
    """A short name of one corpus's SOURCE, for folder names: its last path part without the
    compression and .tsv suffixes (corpora/europarl.tsv.gz -> europarl)."""
    base = os.path.basename(os.path.normpath(source)) or "data"
    for suffix in (*COMPRESSION_SUFFIXES, ".tsv"):
        base = base.removesuffix(suffix)
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", base) or "data"


def datasource_name(datasource: str) -> str:
    """What names a run's data in its experiment: its corpora's short names, each once, joined by +."""
    return "+".join(dict.fromkeys(corpus_name(source) for source, _, _ in corpus_entries(datasource)))


def experiment_name(config: dict[str, Any]) -> str:
    """`experiment_name`, or one derived from the corpora and the pair: opus_books_en-it,
    europarl+news_en-it, europarl+news_en-fr+it."""
    if config["experiment_name"]:
        return config["experiment_name"]
    return f"{datasource_name(config['datasource'])}_{config['lang_src']}-{config['lang_tgt']}"


def weights_dir(config: dict[str, Any]) -> Path:
    """Checkpoints, tokenizers and the resolved config of one experiment."""
    return Path(config["model_folder"]) / experiment_name(config)


def runs_dir(config: dict[str, Any]) -> Path:
    """TensorBoard logs of one experiment."""
    return Path(config["runs_folder"]) / experiment_name(config)


def trained_runs(model_folder: str) -> list[str]:
    """The runs under `model_folder`: folders where train.py wrote its config.json or checkpoints."""
    folder = Path(model_folder)
    if not folder.is_dir():
        return []
    return sorted(entry.name for entry in folder.iterdir()
                  if (entry / "config.json").is_file() or (entry / "checkpoints.json").is_file())


RUN_FLAGS = ("datasource", "lang_src", "lang_tgt")  # what a run translates, and from what


def run_record(run_folder: Path) -> dict[str, str] | None:
    """A run's RUN_FLAGS as its config.json records them (a flat file, or train.py's layout under
    "config"); None where it does not say (no such file, or one that cannot be read)."""
    try:
        data = json.loads(read_text(Path(run_folder) / "config.json"))
    except (OSError, ValueError):  # ValueError: not UTF-8 (TextFileError) or not JSON
        return None
    values = data.get("config") if isinstance(data, dict) and isinstance(data.get("config"), dict) else data
    if not isinstance(values, dict) or not all(isinstance(values.get(key), str) for key in RUN_FLAGS):
        return None
    return {key: values[key] for key in RUN_FLAGS}


def run_agrees(record: dict[str, str], config: dict[str, Any], flags: Sequence[str]) -> bool:
    """Whether a run's `record` has the config's value of each of `flags`: its languages equal, its
    datasource naming the same corpora (data/tatoeba and /home/me/data/tatoeba/ do)."""
    return all(record[key] == config[key] or (key == "datasource" and same_corpora(record[key], config[key]))
               for key in flags)


def same_corpora(one: str, other: str) -> bool:
    try:
        return datasource_name(one) == datasource_name(other)
    except ConfigError:  # a recorded datasource this version cannot read as a list of corpora
        return False


def describe_run(name: str, record: dict[str, str]) -> str:
    return f"{name} ({record['lang_src']}->{record['lang_tgt']} from {record['datasource']})"


def run_by_flags(config: dict[str, Any], runs: list[str], flags: Sequence[str]) -> str | None:
    """The one run under model_folder whose config.json agrees with `flags` (run_agrees), said on
    stderr; None when none does and some run does not say what it translates. A ConfigError says
    which runs exist and what they translate when several agree, or none while all say."""
    folder = config["model_folder"]
    records = {run: run_record(Path(folder) / run) for run in runs}
    matching = [run for run, record in records.items() if record is not None and run_agrees(record, config, flags)]
    asked = " ".join(f"--{key} {config[key]}" for key in flags)
    if len(matching) == 1:
        which = "the only run" if len(runs) == 1 else f"the one run that matches {asked}"
        print(f"using {which} under {folder}/: {describe_run(matching[0], records[matching[0]])}; "
              f"--experiment_name names another", file=sys.stderr)
        return matching[0]
    if matching:
        raise ConfigError(f"{len(matching)} runs under {folder}/ match {asked}: name one with --experiment_name "
                          f"({', '.join(describe_run(run, records[run]) for run in matching[:8])})")
    if runs and all(records.values()):
        there = "the only run there is" if len(runs) == 1 else "the runs there are"
        raise ConfigError(f"no run under {folder}/ matches {asked}: {there} "
                          f"{', '.join(describe_run(run, records[run]) for run in runs[:8])}; drop the flag, name a "
                          f"run with --experiment_name, or train one")
    return None


def choose_run(resolved: Resolved, fall_back: bool = False) -> str:
    """The experiment a program that translates with a trained model uses, written into the config:
    --experiment_name; else the one --datasource and the language pair name, as train.py named it;
    else the one run whose config.json agrees with the --datasource, --lang_src and --lang_tgt
    given (`run_by_flags`: one that disagrees says which runs exist); else the only run under
    model_folder (said on stderr). With several runs, or none, a ConfigError lists what there is.
    `fall_back` (evaluate.py, where --datasource is the data to score, not the run's): only the
    languages are matched, and a --datasource that names no run of its own is scored with the only run."""
    config, given = resolved.config, resolved.given
    if config["experiment_name"]:
        return config["experiment_name"]
    named = set(RUN_FLAGS) & given
    runs = trained_runs(config["model_folder"])
    derived = experiment_name(config)
    flags = [key for key in RUN_FLAGS if key in named and not (fall_back and key == "datasource")]
    chosen = derived if named and derived in runs else run_by_flags(config, runs, flags) if flags else None
    if chosen is None and flags and not fall_back:
        chosen = derived  # runs that do not say what they translate: the name train.py would have given it
    if chosen is None:
        chosen = only_run(config["model_folder"], runs)
    config["experiment_name"] = chosen
    return chosen


def only_run(folder: str, runs: list[str]) -> str:
    """The only run under `folder` (said on stderr), or a ConfigError listing what there is."""
    if len(runs) == 1:
        print(f"using the only run under {folder}/: {runs[0]} (--experiment_name names another)", file=sys.stderr)
        return runs[0]
    if not runs:
        raise ConfigError(f"no trained run under {folder}/: train one first (python train.py --datasource "
                          f"data/tatoeba --preset cpu), or give --checkpoint PATH")
    raise ConfigError(f"{len(runs)} runs under {folder}/: name one with --experiment_name "
                      f"({', '.join(runs[:8])}{', ...' if len(runs) > 8 else ''})")
