"""The one config dict that drives every program, its presets and its command line.

`get_config()` returns the defaults (the paper's base model on the Hub's opus_books en->it).
`parse_config(argv)` applies `--preset NAME`, then every `--key value` override (typed from the
default), validates the result and exits with one line naming the key when something is wrong.
Paths of run artefacts are derived here and nowhere else, and so are the training corpora that
`datasource` names (`corpora`), their tags and a model's target languages.
"""
from __future__ import annotations

import argparse
import math
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence


def get_config() -> dict[str, Any]:
    """Defaults: the paper's base Transformer on Helsinki-NLP/opus_books, English to Italian."""
    return {
        # data: one corpus, or several as SOURCE[:WEIGHT[:TAG]],... (`corpora`); a SOURCE is a Hub id, a folder,
        # a PREFIX of PREFIX.SRC + PREFIX.TGT, or a TSV file
        "datasource": "Helsinki-NLP/opus_books",
        "lang_src": "en",
        "lang_tgt": "it",  # several joined with "+" (fr+it) for one model of several target languages
        "valid_data": "",  # validation pairs given apart (a PREFIX or a TSV file); empty = the datasource's own
        "test_data": "",  # test pairs given apart, likewise
        "reserved_tags": "<BT>",  # tag tokens reserved in the tokenizers beside those the corpora carry
        "val_fraction": 0.05,  # only used when the source has a train split alone: carved from it,
        "test_fraction": 0.05,
        "val_max_pairs": 3000,  # ... each held-out split capped at this many pairs
        "test_max_pairs": 3000,
        "filter_duplicates": False,  # drop training pairs that repeat an earlier pair exactly
        "filter_max_length_ratio": 0.0,  # drop training pairs whose token lengths differ by more than this; 0 = off
        "store_folder": "stores",  # tokenized data, reused by restarts, resumes and every rank
        "seq_len": 256,  # longest sentence, in tokens including [SOS]/[EOS]; longer pairs are dropped
        # tokenizers
        "tokenizer_type": "wordlevel",  # wordlevel | bpe | unigram
        "vocab_size": 8000,  # entries per tokenizer; wordlevel keeps the most frequent words seen min_frequency times
        "min_frequency": 2,
        "tokenizer_max_sentences": 1_000_000,  # tokenizers train on a seeded sample of at most this many pairs
        "joint_vocab": False,  # one tokenizer for both languages
        # model
        "d_model": 512,
        "num_layers": 6,
        "num_heads": 8,
        "d_ff": 2048,
        "dropout": 0.1,
        "norm_first": True,  # pre-norm: trains stably without a finely tuned warmup
        "tie_embeddings": False,  # needs joint_vocab
        # optimisation
        "batch_tokens": 4096,  # token budget of one batch (padded, source or target, whichever is larger)
        "accum_steps": 1,
        "lr": 7e-4,  # peak, reached at the end of warmup; 7e-4 equals the paper's d_model**-0.5 * warmup**-0.5
        "warmup_steps": 0,  # linear warmup over this many steps; 0 = warmup_fraction of the run's steps
        "warmup_fraction": 0.1,  # a fixed 4000 (the paper's, of 100k steps) would outlast a run on opus_books
        "lr_schedule": "inverse_sqrt",  # inverse_sqrt (the paper's) | cosine (to min_lr at max_steps)
        "min_lr": 1e-5,
        "weight_decay": 0.0,  # AdamW decay, applied to weight matrices only
        "adam_beta1": 0.9,
        "adam_beta2": 0.98,
        "adam_eps": 1e-9,
        "label_smoothing": 0.1,
        "clip_grad": 1.0,  # 0 disables clipping
        "num_epochs": 20,
        "max_steps": 0,  # optimizer steps; 0 = no limit
        "max_minutes": 0.0,  # wall-clock budget including validation; 0 = no limit
        "seed": 42,
        "amp": "auto",  # auto (CUDA: bf16 from capability 8.0, else fp16; bf16 on CPUs that have it) | off | bf16 | fp16
        "compile": False,
        "deterministic": False,  # torch.use_deterministic_algorithms: bit-exact repeats and resumes on CUDA, slower
        "num_workers": -1,  # DataLoader workers; -1 = 2 on CUDA, 0 elsewhere
        "device": "auto",  # auto | cpu | cuda | mps
        # CPU, train.py's command line only: glibc keeps freed memory for reuse instead of page-faulting
        # large blocks in afresh every step (faster steps; the process keeps its peak heap until it exits)
        "keep_freed_memory": True,
        "max_nonfinite_steps": 10,  # consecutive skipped steps before the run stops
        "rank_timeout_s": 60.0,  # torchrun: how long a rank may show no sign of life before every rank stops
        # validation and decoding
        "validate_every_steps": 0,  # also validate (and checkpoint) every N optimizer steps; 0 = epoch ends only
        "val_max_sentences": 0,  # distinct validation sources decoded, a fixed subset drawn with the seed; 0 = all
        "eval_batch_size": 64,  # sentences per decoding batch
        "beam_size": 1,
        "length_penalty": 1.0,  # hypothesis scores are log-probability / length ** length_penalty
        # plus this times log(BLEU's brevity penalty) against length_ratio x the source's length (Sockeye;
        # 0.2 chosen on tatoeba validation, docs/quality.md)
        "brevity_penalty": 0.2,
        "length_ratio": 0.0,  # target / source tokens of the training data; 0: train.py measures it
        "sampling_topk": 0,  # translate.py: sample from the k most likely tokens (0 = no top-k cut)
        "sampling_topp": 0.0,  # translate.py: sample from the smallest set reaching this probability (0 = off)
        "temperature": 1.0,  # sampling: divide the logits by this first
        "no_repeat_ngram_size": 0,  # never produce an n-gram of this size twice in one output; 0 = off
        "target_lang": "",  # inference: the language a model of several target languages produces
        "compute_type": "auto",  # --engine ctranslate2: auto (per machine: translator.ct2_setup) or a CTranslate2 type
        "val_beam_size": 5,  # validation decodes as the README's evaluation does (the cpu and tiny presets: greedy)
        "num_examples": 3,
        "early_stopping_patience": 0,  # validations without a better best_metric before stopping; 0 = never
        "best_metric": "bleu",  # bleu | chrf | loss: the validation metric that picks the best checkpoint
        # checkpoints and logs
        "model_folder": "weights",
        "runs_folder": "runs",
        "experiment_name": "",  # empty = derived from datasource and language pair
        "init_from": "",  # a checkpoint whose weights, tokenizers and architecture start a new experiment
        "preload": "latest",  # latest (resume if there is a checkpoint) | new (refuse if there is one) | a path
        "keep_checkpoints": 3,
        "average_checkpoints": 0,  # at the end of training, average the newest N checkpoints for inference; 0 = off
        # inference: latest | best (by best_metric; the best on tatoeba validation, docs/quality.md) | average
        # (training's average)
        "checkpoint_choice": "best",
        "average_min_gap_steps": 0,  # averaged checkpoints lie this many steps apart; 0 = half their median spacing
        "save_every_steps": 0,  # also checkpoint every N optimizer steps; 0 = epoch ends only
        "log_every": 20,
        # serving (serve.py): limits on one request, and how concurrent requests are batched
        "serve_max_sentences": 32,  # sentences in one request
        "serve_max_chars": 1000,  # characters in one sentence
        "serve_max_body_bytes": 65536,  # a larger request body gets 413
        "serve_max_beam_size": 8,  # largest beam_size a request may ask for
        "serve_batch_sentences": 64,  # sentences decoded together, gathered from concurrent requests
        "serve_batch_wait_ms": 10,  # how long a batch waits for more requests once its first has arrived
        # overload: work (sentences x beam size) that may wait for the model; past it, 503 with Retry-After.
        # 512: eight full greedy batches, or two of the largest requests at the largest beam
        "serve_max_queued_work": 512,
        "serve_request_timeout_s": 30.0,  # from a request's arrival to its answer; then 503 with Retry-After
        "serve_body_timeout_s": 10.0,  # a request body that takes longer to arrive gets 408
        # on SIGTERM or Ctrl-C, how long the requests held may take; below Kubernetes' default 30 s before SIGKILL
        "serve_drain_grace_s": 20.0,
    }


# Sizes selectable with --preset; anything not named keeps its default.
PRESETS: dict[str, dict[str, Any]] = {
    "base": {},
    "big": {"d_model": 1024, "num_heads": 16, "d_ff": 4096, "dropout": 0.3},
    # The best tatoeba BLEU in 15 minutes on a 2-core CPU (README: measured figures). On a
    # compute-bound CPU a small, cheap model taking many small steps beats a wider one. 21 epochs
    # fit the 15 minutes where --amp auto trains in bf16 (AVX-512 BF16, AMX); the longer run needs
    # more dropout than 0.1. A joint BPE of 6k beat 8k, 4k, 3k and 2k on seed 42's validation, tied
    # 4k on validation over three seeds and led it on test (docs/quality.md). An fp32-only CPU is
    # stopped by the clock earlier.
    "cpu": {
        "d_model": 256, "num_layers": 3, "num_heads": 4, "d_ff": 512, "dropout": 0.15,
        "tokenizer_type": "bpe", "vocab_size": 6000, "joint_vocab": True, "tie_embeddings": True,
        "batch_tokens": 1500, "lr": 1.4e-3, "warmup_steps": 100, "lr_schedule": "cosine",
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

# What a model is made of, with its tokenizers and language pair: --init_from takes these from its
# checkpoint, and an explicit option that says otherwise is refused.
MODEL_KEYS = ("lang_src", "lang_tgt", "tokenizer_type", "vocab_size", "min_frequency", "joint_vocab",
              "reserved_tags", "d_model", "num_layers", "num_heads", "d_ff", "norm_first", "tie_embeddings")

# Keys that define what a checkpoint *is*: resuming with other values is refused.
IDENTITY_KEYS = (
    "datasource", "lang_src", "lang_tgt", "valid_data", "test_data", "val_fraction", "test_fraction",
    "val_max_pairs", "test_max_pairs", "seed", "tokenizer_type", "vocab_size", "min_frequency", "joint_vocab",
    "d_model", "num_layers", "num_heads", "d_ff", "norm_first", "tie_embeddings",
)

# What --help says beside the default, for keys whose name does not say it all.
HELP = {
    "keep_freed_memory": "on a CPU, train.py's command line sets glibc's malloc to keep freed memory for reuse "
                         "(faster steps; the process keeps its peak heap until it exits); never applied on import",
    "preload": "latest: resume the newest good checkpoint if there is one; new: start a new run, refusing a folder "
               "that already holds checkpoints; or a checkpoint path to continue",
    "init_from": "fine-tuning: a checkpoint whose weights, tokenizers, architecture and language pair start this new "
                 "experiment (fresh optimizer, schedule and step count; any datasource); the same command again "
                 "resumes the fine-tuned run",
    "device": "auto: CUDA, else MPS, else CPU; naming a device that is not there is an error",
    "rank_timeout_s": "under torchrun, seconds without a sign of life from another rank (a heartbeat, the store's "
                      "answer, a collective's completion, the rendezvous) before every rank stops with one line "
                      "naming it; waits for rank 0's data build, validation and checkpoints last as long as its "
                      "heartbeat beats",
    "amp": "mixed precision: auto is bf16 on CUDA GPUs of compute capability 8.0 and up (A100, H100), fp16 with a "
           "GradScaler on older ones (V100, T4), bf16 on CPUs with AVX-512 BF16 or AMX (AMD Zen 4, Intel Sapphire "
           "Rapids and later), off on other CPUs and MPS; fp16 and bf16 run on any device",
}

CHOICES = {
    "tokenizer_type": ("wordlevel", "bpe", "unigram"),
    "lr_schedule": ("inverse_sqrt", "cosine"),
    "amp": ("auto", "off", "bf16", "fp16"),
    "device": ("auto", "cpu", "cuda", "mps"),
    "best_metric": ("bleu", "chrf", "loss"),
    "checkpoint_choice": ("latest", "best", "average"),
    "compute_type": ("auto", "default", "int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16", "float16",
                     "bfloat16", "float32"),
}


class ConfigError(ValueError):
    """A config value that cannot be used; the message names the key."""


def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


class _OneLineParser(argparse.ArgumentParser):
    """argparse that reports a bad command line in one line instead of usage + error."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"{self.prog}: error: {message} (see --help)\n")
        raise SystemExit(2)


def build_parser(description: str) -> argparse.ArgumentParser:
    """A parser with --preset and one --key option per config key, typed from the default."""
    # No ArgumentDefaultsHelpFormatter: the argparse default of every key is None (meaning "not
    # given"), so it would print "(default: None)" beside the real default in each help line.
    parser = _OneLineParser(description=description, allow_abbrev=False)
    parser.add_argument("--preset", choices=sorted(PRESETS), default=None,
                        help="named size preset, applied before the --key overrides")
    for key, default in get_config().items():
        kind = _parse_bool if isinstance(default, bool) else type(default)
        parser.add_argument(f"--{key}", type=kind, default=None, metavar=type(default).__name__.upper(),
                            help=f"{HELP[key]} (default: {default!r})" if key in HELP else f"default: {default!r}")
    return parser


def resolve_config(args: argparse.Namespace) -> dict[str, Any]:
    """Defaults, then the preset, then explicit overrides; validated."""
    config = get_config()
    if args.preset:
        config.update(PRESETS[args.preset])
    for key in config:
        value = getattr(args, key, None)
        if value is not None:
            config[key] = value
    validate_config(config)
    return config


def explicit_keys(args: argparse.Namespace) -> set[str]:
    """The config keys the command line set, itself or through --preset."""
    keys = {key for key in get_config() if getattr(args, key, None) is not None}
    return keys | set(PRESETS[args.preset]) if args.preset else keys


def parse_config(argv: Sequence[str] | None = None, description: str = "") -> dict[str, Any]:
    """The resolved config for a program that takes only config options."""
    parser = build_parser(description)
    args = parser.parse_args(argv)
    return config_or_exit(args, parser)


def config_or_exit(args: argparse.Namespace, parser: argparse.ArgumentParser) -> dict[str, Any]:
    try:
        return resolve_config(args)
    except ConfigError as error:
        parser.error(str(error))
        raise  # unreachable: error() exits


def validate_config(config: dict[str, Any]) -> None:
    """Refuse values that would fail later, naming the key. Also used on configs read from checkpoints."""
    defaults = get_config()
    unknown = sorted(set(config) - set(defaults))
    if unknown:
        raise ConfigError(f"unknown config key {unknown[0]!r}")
    for key, default in defaults.items():
        if key not in config:
            raise ConfigError(f"config key {key!r} is missing")
        value = config[key]
        expected = type(default)
        if expected is float and isinstance(value, int) and not isinstance(value, bool):
            config[key] = value = float(value)
        if type(value) is not expected:
            raise ConfigError(f"config key {key!r} must be {expected.__name__}, got {type(value).__name__}")
    for key, allowed in CHOICES.items():
        if config[key] not in allowed:
            raise ConfigError(f"--{key} must be one of {', '.join(allowed)}, got {config[key]!r}")
    positive = ("d_model", "num_layers", "num_heads", "d_ff", "batch_tokens", "accum_steps", "num_epochs",
                "eval_batch_size", "beam_size", "val_beam_size", "keep_checkpoints", "log_every", "vocab_size",
                "min_frequency", "max_nonfinite_steps", "tokenizer_max_sentences", "rank_timeout_s")
    for key in positive:
        if config[key] < 1:
            raise ConfigError(f"--{key} must be at least 1, got {config[key]}")
    non_negative = ("average_checkpoints", "no_repeat_ngram_size", "val_max_pairs", "test_max_pairs",
                    "filter_max_length_ratio", "max_steps", "max_minutes", "warmup_steps", "weight_decay",
                    "clip_grad", "val_max_sentences", "validate_every_steps", "num_examples", "early_stopping_patience",
                    "save_every_steps", "average_min_gap_steps", "min_lr", "adam_eps", "length_penalty", "brevity_penalty", "length_ratio")
    for key in non_negative:
        if config[key] < 0:
            raise ConfigError(f"--{key} must not be negative, got {config[key]}")
    if not config["lr"] > 0:
        raise ConfigError(f"--lr must be positive, got {config['lr']}")
    if config["d_model"] % config["num_heads"]:
        raise ConfigError(f"--d_model {config['d_model']} is not divisible by --num_heads {config['num_heads']}")
    if config["d_model"] % 2:
        raise ConfigError(f"--d_model must be even for sinusoidal positions, got {config['d_model']}")
    if config["seq_len"] < 3:
        raise ConfigError(f"--seq_len must be at least 3 ([SOS], a token, [EOS]), got {config['seq_len']}")
    for key in ("dropout", "label_smoothing", "adam_beta1", "adam_beta2", "warmup_fraction"):
        if not 0 <= config[key] < 1:
            raise ConfigError(f"--{key} must be in [0, 1), got {config[key]}")
    if not 0 <= config["val_fraction"] < 1 or not 0 <= config["test_fraction"] < 1 \
            or config["val_fraction"] + config["test_fraction"] >= 1:
        raise ConfigError("--val_fraction and --test_fraction must be in [0, 1) and leave training data")
    if config["tie_embeddings"] and not config["joint_vocab"]:
        raise ConfigError("--tie_embeddings needs --joint_vocab true: separate vocabularies cannot share weights")
    targets = target_languages(config)
    if not config["lang_src"] or "" in targets or config["lang_src"] in targets or len(set(targets)) < len(targets):
        raise ConfigError("--lang_src and --lang_tgt must be different, non-empty language codes (several targets "
                          "joined with +, e.g. fr+it)")
    for tag in config["reserved_tags"].split(",") if config["reserved_tags"] else []:
        if not TAG_PATTERN.fullmatch(tag):
            raise ConfigError(f"--reserved_tags: {tag!r} is not a tag: write it as <NAME>, e.g. <BT>")
    if config["num_workers"] < -1:
        raise ConfigError(f"--num_workers must be -1 (auto) or more, got {config['num_workers']}")
    if config["sampling_topk"] < 0 or not 0 <= config["sampling_topp"] <= 1:
        raise ConfigError("--sampling_topk must not be negative and --sampling_topp must be in [0, 1]")
    if not config["temperature"] > 0:
        raise ConfigError(f"--temperature must be positive, got {config['temperature']}")
    if (config["sampling_topk"] or config["sampling_topp"]) and config["beam_size"] != 1:
        raise ConfigError(f"sampling (--sampling_topk, --sampling_topp) needs --beam_size 1, got {config['beam_size']}")
    if 0 < config["filter_max_length_ratio"] < 1:
        raise ConfigError(f"--filter_max_length_ratio must be 0 (off) or at least 1, "
                          f"got {config['filter_max_length_ratio']}")
    if config["average_checkpoints"] > config["keep_checkpoints"]:
        raise ConfigError(f"--average_checkpoints {config['average_checkpoints']} needs --keep_checkpoints at least as "
                          f"large, got {config['keep_checkpoints']}")
    if config["min_lr"] > config["lr"]:
        raise ConfigError(f"--min_lr {config['min_lr']} is above the peak --lr {config['lr']}")
    if not config["datasource"]:
        raise ConfigError("--datasource must name a Hub dataset, a local folder, a PREFIX of parallel files or a TSV file")
    corpus_entries(config["datasource"])  # raises on a malformed corpus list
    for key in ("serve_max_sentences", "serve_max_chars", "serve_max_body_bytes", "serve_max_beam_size",
                "serve_batch_sentences", "serve_max_queued_work"):
        if config[key] < 1:
            raise ConfigError(f"--{key} must be at least 1, got {config[key]}")
    if config["serve_batch_wait_ms"] < 0:
        raise ConfigError(f"--serve_batch_wait_ms must not be negative, got {config['serve_batch_wait_ms']}")
    if not 0 <= config["serve_drain_grace_s"] < math.inf:
        raise ConfigError(f"--serve_drain_grace_s must be a number of seconds, 0 or more, "
                          f"got {config['serve_drain_grace_s']}")
    for key in ("serve_request_timeout_s", "serve_body_timeout_s"):
        if not 0 < config[key] < math.inf:
            raise ConfigError(f"--{key} must be a positive number of seconds, got {config[key]}")


# A tag token: <BT> for back-translated pairs, <2fr> for "translate into French".
TAG_PATTERN = re.compile(r"<[A-Za-z0-9_.-]+>")
TARGET_TAG = re.compile(r"<2([A-Za-z0-9_-]+)>")
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


def corpus_entries(datasource: str) -> list[tuple[str, float, str]]:
    """(SOURCE, WEIGHT, TAG) of each comma-separated SOURCE[:WEIGHT[:TAG]] of `datasource`; a
    ConfigError names a malformed one."""
    found = []
    for entry in datasource.split(","):
        parts = entry.split(":")
        if len(parts) > 3 or not parts[0].strip():
            raise ConfigError(f"--datasource: {entry!r} is not SOURCE[:WEIGHT[:TAG]]")
        source, weight, tag = (parts + ["", ""])[:3]
        try:
            number = float(weight) if weight else 1.0
        except ValueError:
            raise ConfigError(f"--datasource: the weight of {source!r} must be a number, got {weight!r}") from None
        if not 0 < number < math.inf:
            raise ConfigError(f"--datasource: the weight of {source!r} must be positive, got {weight!r}")
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
    several target languages, and every corpus tag, in that order, each once."""
    tags = config["reserved_tags"].split(",") if config["reserved_tags"] else []
    targets = target_languages(config)
    if len(targets) > 1:
        tags += [target_tag(lang) for lang in targets]
    tags += [tag for _, _, tag in corpus_entries(config["datasource"]) if tag]
    return list(dict.fromkeys(tags))


def corpus_name(source: str) -> str:
    """A short name of one corpus's SOURCE, for folder names: its last path part without the
    compression and .tsv suffixes (corpora/europarl.tsv.gz -> europarl)."""
    base = os.path.basename(os.path.normpath(source)) or "data"
    for suffix in (*COMPRESSION_SUFFIXES, ".tsv"):
        base = base.removesuffix(suffix)
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", base) or "data"


def experiment_name(config: dict[str, Any]) -> str:
    """`experiment_name`, or one derived from the corpora and the pair: opus_books_en-it,
    europarl+news_en-it, europarl+news_en-fr+it."""
    if config["experiment_name"]:
        return config["experiment_name"]
    base = "+".join(dict.fromkeys(corpus_name(source) for source, _, _ in corpus_entries(config["datasource"])))
    return f"{base}_{config['lang_src']}-{config['lang_tgt']}"


def weights_dir(config: dict[str, Any]) -> Path:
    """Checkpoints, tokenizers and the resolved config of one experiment."""
    return Path(config["model_folder"]) / experiment_name(config)


def runs_dir(config: dict[str, Any]) -> Path:
    """TensorBoard logs of one experiment."""
    return Path(config["runs_folder"]) / experiment_name(config)
