"""Speed benchmark: this project's Transformer against the tutorial way and torch.nn.Transformer.

    python -m benchmarks.bench [--datasource FOLDER] [--json] [--quick] [--device auto|cpu|cuda]

One process, one device, one run. Prints a table (or with --json one JSON object) on stdout and
its progress on stderr. The phases, in order:

1. Dense matmul peak of the device, measured here: the best of `torch.mm` and the model's own
   `cpu_kernels.linear` (oneDNN on AVX-512 CPUs) on square fp32 matrices, and of `torch.mm` in bf16
   where the device runs bf16 natively.
2. Sentence lengths: the train split of `--datasource`, tokenized with word-level tokenizers
   trained on it, or else seeded synthetic text whose lengths resemble opus_books (log-normal,
   mean about 30 tokens, about 1% past 100). The model's vocabularies are those of the
   tokenizers or 8000 (source) and 10000 (target), whichever is larger.
3. Training, at the paper-base size of config.py (d_model 512, 6+6 layers, 8 heads, d_ff 2048):
   forward, summed label-smoothed loss (`loss.loss_sum`), backward, gradient clipping and an
   AdamW step (`optimizer.build_optimizer`), as train.py does it, under the autocast dtype that
   precision.py chooses for the device. This project's model and
   `torch.nn.Transformer` (same sizes, the same sinusoidal embeddings, `nn.Linear` projection,
   PyTorch's own kernels throughout) train on the identical batches of the project's batching
   (`dataset.BatchPlan`, token budget `batch_tokens`): warm-up steps on the batch with the most
   padded positions and on the one with the longest sentences (between them the memory peak),
   then on batches at evenly spaced length quantiles of the epoch, untimed once (the heap grows to
   its working size) and then timed. The tutorial way is a faithful re-implementation of the tutorials'
   model (hand-written LayerNorm, q @ k.T / sqrt(d_k), masked_fill, softmax, dropout, @ v,
   log_softmax projection, CrossEntropyLoss, Adam) on batches of 8 sentences padded to 350
   positions. Its cost does not depend on which sentences fill the padding, so its throughput is
   8 x (the data's mean target length) real tokens per measured second of a step.
   Throughput counts real target tokens (labels that are not padding, [EOS] included) per second.
4. Decoding with `decoding.greedy_decode`, with and without the KV cache, on an untrained
   base-size model whose [EOS] logit is pushed to -1e9, so every sentence of the batch generates
   exactly 10, 50 and 150 tokens; then one sentence through `translator.TorchTranslator`, as
   translate.py does (it stops at `max_output_tokens`: 2 x source length + 10).
5. Translation with beam 5 of 64 of the data's sentences, as translate.py translates: this
   project's PyTorch engine, and CTranslate2 on the same model exported by export.py (float16 on
   CUDA, int8 on the CPU; skipped with the reason when ctranslate2 is not installed).
6. Kill -9 and resume: train.py (`--deterministic true`, the cpu preset; tiny with --quick) on
   synthetic pairs, killed with SIGKILL once its first checkpoint is listed and run again, against
   an unbroken run of the same command: the final weights must be bit-identical.
7. Peak memory: on CPU the process's peak resident set (VmHWM), reset at the start of each phase
   through /proc/self/clear_refs (after returning freed memory with malloc_trim), so each phase's
   figure is the whole process's peak during that phase; on CUDA `torch.cuda.max_memory_allocated`.

On a GPU (`--device cuda`) training runs in the autocast dtype precision.py picks (bf16 from compute
capability 8.0, else fp16), its FLOP/s are compared with the bf16 (or fp32) matmul peak measured in
the same run, and the targets are a GPU's: at least 45% of that peak and 1.5x torch.nn.Transformer.

FLOPs are counted by `model.train_flops` (its docstring gives the count): the matrix products at
the padded shapes that are computed, forward and backward.
"% peak" is this count per second over the matmul peak: how well the hardware is used. "real %"
counts each sentence at its own lengths instead (`real_flops`): the padding computed is not
useful work, and this figure is lower by about the padding share.
"""
from __future__ import annotations

import argparse
import contextlib
import ctypes
import functools
import gc
import json
import math
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch import nn

if not __package__:  # run as a file: only benchmarks/ is on sys.path, not the project
    sys.exit("bench.py: run it from the repository root as: python -m benchmarks.bench")

from nmt import cpu_kernels  # noqa: E402  (after the check above)
from nmt.training.checkpoint import MANIFEST, checkpoint_name, load_checkpoint, read_manifest  # noqa: E402
from config import PRESETS, ConfigError, get_config  # noqa: E402
from dataset import BatchPlan, BilingualDataset, padding_waste  # noqa: E402
from nmt.inference.decoding import greedy_decode, max_output_tokens  # noqa: E402
from nmt.device import pick_device  # noqa: E402
from nmt.training.batch_size import CPU_BATCH_TOKENS  # noqa: E402
from nmt.training.loss import loss_sum  # noqa: E402
from model import PositionalEncoding, build_model, train_flops  # noqa: E402
from nmt.training.optimizer import build_optimizer  # noqa: E402
from nmt.precision import amp_dtype, autocast_context, native_bf16_cpu  # noqa: E402
from nmt.corpora.sources import DataError, open_source, read_pairs  # noqa: E402
from nmt.corpora.tokenizer import EOS_ID, PAD_ID, SOS_ID, TokenizerError, decode_ids, train_tokenizer  # noqa: E402
from nmt.inference.translator import DecodingOptions, TorchTranslator  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]  # the repository, where train.py runs from

VOCAB_FLOOR = (8000, 10000)  # opus_books-sized vocabularies (source, target)
TUTORIAL_SEQ_LEN = 350
TUTORIAL_BATCH = 8
TARGETS = {"vs_tutorial": 12.0, "vs_nn_transformer": 1.15, "peak_fraction": 0.60, "cache_speedup_50": 4.0,
           "train_rss_gb": 6.0}
# On a GPU (issue 19): MFU against the bf16 (or fp16) peak measured in the same run, and the margin over
# torch.nn.Transformer that fused attention, the fused loss and AdamW should give.
CUDA_TARGETS = {**TARGETS, "vs_nn_transformer": 1.5, "peak_fraction": 0.45}


def log(message: str) -> None:
    print(f"[bench {time.monotonic() - STARTED:6.1f}s] {message}", file=sys.stderr, flush=True)


STARTED = time.monotonic()


# ---------------------------------------------------------------------------- settings

def bench_settings(quick: bool) -> dict[str, Any]:
    """Sizes of one run: the paper-base model of config.py at the CPU's batch (--batch_tokens auto's
    there, the budget this benchmark's figures were measured at, on a GPU too), or tiny ones."""
    config = {**get_config(), "batch_tokens": CPU_BATCH_TOKENS}
    settings = {"quick": quick, "train_steps": 4, "tutorial_steps": 1, "tutorial_seq_len": TUTORIAL_SEQ_LEN,
                "decode_lengths": (10, 50, 150), "decode_batch": 16, "peak_size": 4096, "synthetic_pairs": 20000,
                "vocab_floor": VOCAB_FLOOR, "translate_sentences": 64, "resume_preset": "cpu", "resume_steps": 200,
                "resume_every": 50}
    if quick:
        config.update(PRESETS["tiny"])
        config["dropout"] = 0.1  # exercise the dropout paths
        settings.update({"train_steps": 2, "tutorial_seq_len": config["seq_len"], "decode_lengths": (2, 4, 6),
                         "decode_batch": 3, "peak_size": 256, "synthetic_pairs": 300, "vocab_floor": (60, 80),
                         "translate_sentences": 6, "resume_preset": "tiny", "resume_steps": 30, "resume_every": 10})
    settings["config"] = config
    return settings


def on_cuda(settings: dict[str, Any]) -> dict[str, Any]:
    """A GPU's steps take milliseconds: more of them are timed."""
    return {**settings, "train_steps": 24, "peak_size": 8192} if not settings["quick"] else settings


# Dense bf16 tensor-core peaks from the vendors' datasheets (no sparsity), TFLOP/s, by a part of the
# name torch.cuda.get_device_name gives (the first that matches: the PCIe and NVL parts before their SXM
# namesakes, L40S before L4): MFU is also reported against these, beside the peak measured in the run.
SPEC_BF16_TFLOPS = {"H200 NVL": 835.0, "H200": 989.0, "H100 PCIe": 756.0, "H100": 989.0, "A100": 312.0,
                    "L40S": 362.0, "L4": 121.0, "A10": 125.0}


def spec_peak_tflops(device_name: str) -> float | None:
    """The datasheet's dense bf16 peak of the GPU so named (SPEC_BF16_TFLOPS); None for another."""
    return next((peak for name, peak in SPEC_BF16_TFLOPS.items() if name in device_name), None)


# ---------------------------------------------------------------------------- device helpers

def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(device: torch.device, function: Callable[[], Any]) -> tuple[float, Any]:
    synchronize(device)
    started = time.perf_counter()
    result = function()
    synchronize(device)
    return time.perf_counter() - started, result


class PeakMemory:
    """Peak memory of the process during a `with` block, in bytes (see the module docstring)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.peak = 0
        self.kind = "cuda max_memory_allocated" if device.type == "cuda" else "peak RSS"

    def __enter__(self) -> "PeakMemory":
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.device)
            return self
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6").malloc_trim(0)  # give freed heap back, so the reset starts low
        try:
            Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
        except OSError:
            self.kind = "peak RSS since process start"  # cannot reset: a lifetime figure
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.device.type == "cuda":
            self.peak = torch.cuda.max_memory_allocated(self.device)
            return
        try:
            for line in Path("/proc/self/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    self.peak = int(line.split()[1]) * 1024
        except OSError:
            import resource  # getrusage reports the lifetime peak in KiB on Linux
            self.peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def native_bf16(device: torch.device) -> bool:
    """Whether bf16 products run natively: on CPU, AVX-512 BF16 or AMX (precision.py's rule)."""
    return device.type != "cpu" or native_bf16_cpu()


def matmul_peak(device: torch.device, size: int, dtype: torch.dtype) -> dict[str, float]:
    """GFLOP/s of square matmuls of `size`: torch.mm, and on CPU in fp32 also cpu_kernels.linear."""
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(size, size, generator=generator).to(device, dtype)
    b = torch.randn(size, size, generator=generator).to(device, dtype)
    kernels: dict[str, Callable[[], torch.Tensor]] = {"torch.mm": lambda: a @ b}
    if device.type == "cpu" and dtype == torch.float32:
        kernels["cpu_kernels.linear"] = lambda: cpu_kernels.linear(a, b)
    flops = 2 * size ** 3
    results = {}
    with torch.no_grad():
        for name, kernel in kernels.items():
            kernel()
            seconds = min(timed(device, kernel)[0] for _ in range(5))
            results[name] = flops / seconds / 1e9
    return results


# ---------------------------------------------------------------------------- data

def synthetic_pairs(count: int, seed: int, vocab: tuple[int, int]) -> list[tuple[str, str]]:
    """Sentence pairs of made-up words: source lengths log-normal (median 24, mean about 30
    words, about 1% longer than 100), target about 5% longer; Zipf-distributed words."""
    rng = np.random.default_rng(seed)
    src_len = np.clip(np.rint(rng.lognormal(math.log(24), 0.65, count)), 1, None).astype(int)
    tgt_len = np.clip(np.rint(src_len * rng.lognormal(0.05, 0.2, count)), 1, None).astype(int)

    def words(prefix: str, size: int, total: int) -> list[str]:
        weights = 1.0 / np.arange(1, size + 1) ** 1.1
        ids = rng.choice(size, total, p=weights / weights.sum())
        return [f"{prefix}{i}" for i in ids]

    src_words, tgt_words = words("s", vocab[0], int(src_len.sum())), words("t", vocab[1], int(tgt_len.sum()))
    pairs, i, j = [], 0, 0
    for n, m in zip(src_len, tgt_len):
        pairs.append((" ".join(src_words[i:i + n]), " ".join(tgt_words[j:j + m])))
        i, j = i + n, j + m
    return pairs


def load_data(datasource: str | None, settings: dict[str, Any], seed: int) -> tuple[BilingualDataset, Any, Any, str]:
    config = settings["config"]
    if datasource:
        source = open_source(datasource, config["lang_src"], config["lang_tgt"])
        batches = read_pairs(source, "train", config["lang_src"], config["lang_tgt"])
        pairs = [pair for batch in batches for pair in batch]
        name = f"{datasource} (train split)"
    else:
        pairs = synthetic_pairs(settings["synthetic_pairs"], seed, settings["vocab_floor"])
        name = "synthetic, opus_books-like lengths"
    tokenizer_args = (config["tokenizer_type"], config["vocab_size"], config["min_frequency"])
    tok_src = train_tokenizer((p[0] for p in pairs), *tokenizer_args)
    tok_tgt = train_tokenizer((p[1] for p in pairs), *tokenizer_args)
    return BilingualDataset.from_pairs(pairs, tok_src, tok_tgt, config["seq_len"], "bench"), tok_src, tok_tgt, name


def pick_batches(batches: Sequence[np.ndarray], dataset: BilingualDataset,
                 count: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Warm-up batches (the most padded positions; the longest sentences), and `count` batches at
    evenly spaced quantiles of the epoch's batches ordered by their longest sentence."""
    longest = [int(max(dataset.src_lens[b].max(), dataset.tgt_lens[b].max())) for b in batches]
    padded = [len(b) * int(dataset.src_lens[b].max() + dataset.tgt_lens[b].max()) for b in batches]
    order = np.argsort(longest, kind="stable")
    picks = [batches[order[min(len(order) - 1, int((i + 0.5) * len(order) / count))]] for i in range(count)]
    return [batches[int(np.argmax(padded))], batches[order[-1]]], picks


# ---------------------------------------------------------------------------- models compared

class TorchTransformer(nn.Module):
    """torch.nn.Transformer of the same sizes with the project's sinusoidal embeddings and a plain
    nn.Linear projection (tied to the embeddings as the project's where `tie_embeddings`); takes the
    project's src_mask (True = attend, None = no padding) and finds the target's padding from its ids."""

    def __init__(self, src_vocab: int, tgt_vocab: int, config: dict[str, Any]) -> None:
        super().__init__()
        d_model = config["d_model"]
        self.scale = math.sqrt(d_model)
        self.src_embed = nn.Embedding(src_vocab, d_model)
        self.tgt_embed = nn.Embedding(tgt_vocab, d_model)
        self.register_buffer("pe", PositionalEncoding(d_model, config["seq_len"], 0.0).pe, persistent=False)
        self.dropout = nn.Dropout(config["dropout"])
        with warnings.catch_warnings():  # "enable_nested_tensor is True, but ... norm_first": an inference detail
            warnings.simplefilter("ignore", UserWarning)
            self.transformer = nn.Transformer(d_model, config["num_heads"], config["num_layers"],
                                              config["num_layers"], config["d_ff"], config["dropout"],
                                              batch_first=True, norm_first=config["norm_first"])
        self.proj = nn.Linear(d_model, tgt_vocab)
        if config["tie_embeddings"]:
            self.tgt_embed.weight = self.proj.weight = self.src_embed.weight

    def forward(self, src: torch.Tensor, tgt: torch.Tensor, src_mask: torch.Tensor | None = None) -> torch.Tensor:
        length = tgt.size(1)
        source_padding = None if src_mask is None else ~src_mask[:, 0, 0, :]  # nn.Transformer: True = do not attend
        target_padding = tgt == PAD_ID
        future = torch.ones(length, length, dtype=torch.bool, device=tgt.device).triu(1)
        x = self.dropout(self.src_embed(src) * self.scale + self.pe[:src.size(1)])
        y = self.dropout(self.tgt_embed(tgt) * self.scale + self.pe[:length])
        out = self.transformer(x, y, tgt_mask=future, src_key_padding_mask=source_padding,
                               tgt_key_padding_mask=target_padding, memory_key_padding_mask=source_padding,
                               tgt_is_causal=True)
        return self.proj(out)


class TutorialLayerNorm(nn.Module):
    """The tutorials' hand-written LayerNorm: alpha * (x - mean) / (std + eps) + bias."""

    def __init__(self, features: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.alpha = nn.Parameter(torch.ones(features))
        self.bias = nn.Parameter(torch.zeros(features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean = x.mean(dim=-1, keepdim=True)
        std = x.std(dim=-1, keepdim=True)
        return self.alpha * (x - mean) / (std + self.eps) + self.bias


class TutorialAttention(nn.Module):
    """Multi-head attention written out by hand, as in the tutorials (weights kept for plotting)."""

    def __init__(self, d_model: int, h: int, dropout: float) -> None:
        super().__init__()
        self.h, self.d_k = h, d_model // h
        self.w_q = nn.Linear(d_model, d_model, bias=False)
        self.w_k = nn.Linear(d_model, d_model, bias=False)
        self.w_v = nn.Linear(d_model, d_model, bias=False)
        self.w_o = nn.Linear(d_model, d_model, bias=False)
        self.dropout = nn.Dropout(dropout)
        self.attention_scores: torch.Tensor | None = None

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        batch = q.size(0)
        query = self.w_q(q).view(batch, -1, self.h, self.d_k).transpose(1, 2)
        key = self.w_k(k).view(batch, -1, self.h, self.d_k).transpose(1, 2)
        value = self.w_v(v).view(batch, -1, self.h, self.d_k).transpose(1, 2)
        scores = (query @ key.transpose(-2, -1)) / math.sqrt(self.d_k)
        scores.masked_fill_(mask == 0, -1e9)
        scores = self.dropout(scores.softmax(dim=-1))
        self.attention_scores = scores
        x = (scores @ value).transpose(1, 2).contiguous().view(batch, -1, self.h * self.d_k)
        return self.w_o(x)


class TutorialResidual(nn.Module):
    def __init__(self, d_model: int, dropout: float) -> None:
        super().__init__()
        self.norm = TutorialLayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, sublayer: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        return x + self.dropout(sublayer(self.norm(x)))


class TutorialFeedForward(nn.Module):
    def __init__(self, d_model: int, d_ff: int, dropout: float) -> None:
        super().__init__()
        self.linear_1 = nn.Linear(d_model, d_ff)
        self.dropout = nn.Dropout(dropout)
        self.linear_2 = nn.Linear(d_ff, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_2(self.dropout(torch.relu(self.linear_1(x))))


class TutorialEncoderBlock(nn.Module):
    def __init__(self, d_model: int, h: int, d_ff: int, dropout: float) -> None:
        super().__init__()
        self.self_attention = TutorialAttention(d_model, h, dropout)
        self.feed_forward = TutorialFeedForward(d_model, d_ff, dropout)
        self.residual = nn.ModuleList([TutorialResidual(d_model, dropout) for _ in range(2)])

    def forward(self, x: torch.Tensor, src_mask: torch.Tensor) -> torch.Tensor:
        x = self.residual[0](x, lambda y: self.self_attention(y, y, y, src_mask))
        return self.residual[1](x, self.feed_forward)


class TutorialDecoderBlock(nn.Module):
    def __init__(self, d_model: int, h: int, d_ff: int, dropout: float) -> None:
        super().__init__()
        self.self_attention = TutorialAttention(d_model, h, dropout)
        self.cross_attention = TutorialAttention(d_model, h, dropout)
        self.feed_forward = TutorialFeedForward(d_model, d_ff, dropout)
        self.residual = nn.ModuleList([TutorialResidual(d_model, dropout) for _ in range(3)])

    def forward(self, x: torch.Tensor, memory: torch.Tensor, src_mask: torch.Tensor,
                tgt_mask: torch.Tensor) -> torch.Tensor:
        x = self.residual[0](x, lambda y: self.self_attention(y, y, y, tgt_mask))
        x = self.residual[1](x, lambda y: self.cross_attention(y, memory, memory, src_mask))
        return self.residual[2](x, self.feed_forward)


class TutorialTransformer(nn.Module):
    """The tutorials' encoder-decoder: every block above, a final LayerNorm on each side, and a
    projection that returns log-probabilities."""

    def __init__(self, src_vocab: int, tgt_vocab: int, seq_len: int, config: dict[str, Any]) -> None:
        super().__init__()
        d_model, h, d_ff, dropout = config["d_model"], config["num_heads"], config["d_ff"], config["dropout"]
        self.d_model = d_model
        self.src_embed = nn.Embedding(src_vocab, d_model)
        self.tgt_embed = nn.Embedding(tgt_vocab, d_model)
        self.register_buffer("pe", PositionalEncoding(d_model, seq_len, 0.0).pe.unsqueeze(0))
        self.dropout = nn.Dropout(dropout)
        self.encoder = nn.ModuleList([TutorialEncoderBlock(d_model, h, d_ff, dropout)
                                      for _ in range(config["num_layers"])])
        self.decoder = nn.ModuleList([TutorialDecoderBlock(d_model, h, d_ff, dropout)
                                      for _ in range(config["num_layers"])])
        self.encoder_norm, self.decoder_norm = TutorialLayerNorm(d_model), TutorialLayerNorm(d_model)
        self.proj = nn.Linear(d_model, tgt_vocab)
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)

    def embed(self, table: nn.Embedding, ids: torch.Tensor) -> torch.Tensor:
        x = table(ids) * math.sqrt(self.d_model)
        return self.dropout(x + self.pe[:, :x.size(1), :].requires_grad_(False))

    def forward(self, src: torch.Tensor, tgt: torch.Tensor, src_mask: torch.Tensor,
                tgt_mask: torch.Tensor) -> torch.Tensor:
        memory = self.embed(self.src_embed, src)
        for block in self.encoder:
            memory = block(memory, src_mask)
        memory = self.encoder_norm(memory)
        x = self.embed(self.tgt_embed, tgt)
        for block in self.decoder:
            x = block(x, memory, src_mask, tgt_mask)
        return torch.log_softmax(self.proj(self.decoder_norm(x)), dim=-1)


def tutorial_batch(dataset: BilingualDataset, indices: Sequence[int], seq_len: int) -> dict[str, torch.Tensor]:
    """Every sentence padded to seq_len, masks as the tutorials build them (int, 0 = masked)."""
    rows = []
    causal = torch.triu(torch.ones(1, seq_len, seq_len), diagonal=1).int() == 0
    for index in indices:
        src, tgt = (ids.tolist() for ids in dataset[int(index)])
        encoder_input = torch.tensor([SOS_ID, *src, EOS_ID] + [PAD_ID] * (seq_len - len(src) - 2))
        decoder_input = torch.tensor([SOS_ID, *tgt] + [PAD_ID] * (seq_len - len(tgt) - 1))
        label = torch.tensor([*tgt, EOS_ID] + [PAD_ID] * (seq_len - len(tgt) - 1))
        rows.append({"encoder_input": encoder_input, "decoder_input": decoder_input, "label": label,
                     "src_mask": (encoder_input != PAD_ID).unsqueeze(0).unsqueeze(0).int(),
                     "tgt_mask": (decoder_input != PAD_ID).unsqueeze(0).int() & causal})
    return {key: torch.stack([row[key] for row in rows]) for key in rows[0]}


# ---------------------------------------------------------------------------- training

def project_step(model: nn.Module, optimizer: torch.optim.Optimizer, batch: dict[str, torch.Tensor],
                 config: dict[str, Any], dtype: torch.dtype | None, device: torch.device) -> None:
    """One optimizer step the way train.py takes it (one micro-batch, no DDP)."""
    with autocast_context(device, dtype):
        logits = model(batch["encoder_input"], batch["decoder_input"], batch.get("src_mask"))
    summed = loss_sum(logits, batch["label"], config["label_smoothing"])
    del logits
    (summed / batch["num_tokens"]).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), config["clip_grad"] or float("inf"))
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def tutorial_step(model: nn.Module, optimizer: torch.optim.Optimizer, batch: dict[str, torch.Tensor],
                  config: dict[str, Any], loss_fn: nn.Module) -> None:
    log_probs = model(batch["encoder_input"], batch["decoder_input"], batch["src_mask"], batch["tgt_mask"])
    loss = loss_fn(log_probs.view(-1, log_probs.size(-1)), batch["label"].view(-1))
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def on_device(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    moved = {key: value.to(device) for key, value in batch.items()}
    moved["num_tokens"] = int((batch["label"] != PAD_ID).sum())  # a host number: no device sync
    return moved


def padded_to(batch: dict[str, torch.Tensor], multiple: int, source: str) -> dict[str, torch.Tensor]:
    """`batch` with its target positions padded to a multiple of `multiple`, and its source too:
    always (`source` "always": train.py's CUDA batches until this was measured) or only where some
    source is padded already, so that a batch without a source mask keeps none ("if_masked")."""
    def widen(tensor: torch.Tensor) -> torch.Tensor:
        extra = -tensor.size(1) % multiple
        return torch.nn.functional.pad(tensor, (0, extra), value=PAD_ID) if extra else tensor

    padded = {**batch, "decoder_input": widen(batch["decoder_input"]), "label": widen(batch["label"])}
    if source == "always" or "src_mask" in batch:
        padded["encoder_input"] = widen(batch["encoder_input"])
        if padded["encoder_input"].size(1) != batch["encoder_input"].size(1) or "src_mask" in batch:
            padded["src_mask"] = (padded["encoder_input"] != PAD_ID)[:, None, None, :]
    return padded


def real_flops(batch: dict[str, torch.Tensor], config: dict[str, Any], tgt_vocab: int) -> int:
    """train_flops of each sentence at its own lengths: what the batch would cost without padding."""
    src = (batch["encoder_input"] != PAD_ID).sum(1).tolist()
    tgt = (batch["decoder_input"] != PAD_ID).sum(1).tolist()
    return sum(train_flops(1, s, t, config, tgt_vocab) for s, t in zip(src, tgt))


def measure_training(name: str, step: Callable[[dict[str, torch.Tensor]], None],
                     warmups: Sequence[dict[str, torch.Tensor]],
                     batches: Sequence[dict[str, torch.Tensor]], flops_of: Callable[[dict[str, torch.Tensor]], int],
                     config: dict[str, Any], tgt_vocab: int, device: torch.device,
                     tokens_per_batch: float | None = None) -> dict[str, Any]:
    """Warm-up steps, then the timed steps; throughput in real target tokens per second, FLOP/s
    at the computed (padded) shapes and at the sentences' own lengths (`real_flops`).

    The warm-up ends with one untimed pass over the timed batches: a step of a shape not seen
    before grows the heap, and paying for those page faults is a first-epoch cost, not training's
    steady pace."""
    for warmup in [*warmups, *batches]:
        log(f"training: {name}: warm-up step")
        step(warmup)
    seconds = []
    for index, batch in enumerate(batches):
        seconds.append(timed(device, lambda: step(batch))[0])
        log(f"training: {name}: step {index + 1}/{len(batches)} {seconds[-1]:.2f} s")
    total = sum(seconds)
    tokens = tokens_per_batch * len(batches) if tokens_per_batch is not None else \
        sum(batch["num_tokens"] for batch in batches)
    return {"tokens_per_s": tokens / total, "ms_per_step": 1000 * total / len(batches),
            "flops_per_s": sum(flops_of(batch) for batch in batches) / total,
            "real_flops_per_s": sum(real_flops(batch, config, tgt_vocab) for batch in batches) / total,
            "steps": len(batches),
            "real_tokens_per_step": tokens / len(batches),
            "padded_positions_per_step": statistics.mean(
                int(b["label"].numel() + b["encoder_input"].numel()) for b in batches)}


def training_rows(dataset: BilingualDataset, settings: dict[str, Any], vocab: tuple[int, int],
                  device: torch.device, seed: int) -> tuple[dict[str, Any], float, dict[str, Any]]:
    """Throughput rows; the padding waste of the epoch's batches; memory of the project's row."""
    config = settings["config"]
    batches = BatchPlan(dataset, config["batch_tokens"], seed).epoch_batches(0)
    waste = padding_waste(batches, dataset.src_lens, dataset.tgt_lens)
    warmup_batches, picks = pick_batches(batches, dataset, settings["train_steps"])
    warmups = [on_device(dataset.collate(b), device) for b in warmup_batches]
    timed_batches = [on_device(dataset.collate(b), device) for b in picks]

    def flops(batch: dict[str, torch.Tensor]) -> int:
        return train_flops(batch["encoder_input"].size(0), batch["encoder_input"].size(1),
                           batch["decoder_input"].size(1), config, vocab[1])

    default_dtype = amp_dtype(config, device)
    exact = (warmups, timed_batches)
    # (name, model, autocast dtype, the model's CPU fast paths on, (warm-up batches, timed batches))
    variants: list[tuple[str, Callable[[], nn.Module], torch.dtype | None, bool, tuple[list, list]]] = [
        ("project", lambda: build_model(config, *vocab), default_dtype, True, exact)]
    if device.type == "cpu" and default_dtype == torch.bfloat16:
        # A CPU with bf16 instructions, where train.py takes bf16: the fp32 step beside it.
        variants.append(("project, fp32", lambda: build_model(config, *vocab), None, True, exact))
    if device.type == "cpu":
        variants.append(("project, stock PyTorch kernels", lambda: build_model(config, *vocab), None, False, exact))
    else:
        # Tensor cores take matrix sides in multiples of 8; a padded source needs a mask, which takes
        # attention off FlashAttention. Both ways of padding, beside the exact widths above.
        for source in ("always", "if_masked"):
            padded = tuple([padded_to(b, 8, source) for b in part] for part in exact)
            variants.append((f"project, padded to 8 ({source})", lambda: build_model(config, *vocab), default_dtype,
                             True, padded))
    variants.append(("torch.nn.Transformer", lambda: TorchTransformer(*vocab, config), default_dtype, True, exact))

    rows: dict[str, Any] = {}
    memory: dict[str, Any] = {}
    for name, build, dtype, fast, (warm, timed_set) in variants:
        torch.manual_seed(seed)
        model = build().to(device).train()
        optimizer = build_optimizer(model, config)
        cpu_kernels.CPU_FAST_PATHS = fast
        try:
            with PeakMemory(device) as peak:
                step = functools.partial(project_step, model, optimizer, config=config, dtype=dtype, device=device)
                rows[name] = measure_training(name, step, warm, timed_set, flops, config, vocab[1], device)
        finally:
            cpu_kernels.CPU_FAST_PATHS = True
        rows[name].update({"dtype": str(dtype or torch.float32).replace("torch.", ""),
                           "parameters": sum(p.numel() for p in model.parameters()), "peak_memory_bytes": peak.peak})
        if name == "project":
            memory = {"kind": peak.kind, "bytes": peak.peak}
        del model, optimizer

    rows["tutorial"] = tutorial_row(dataset, settings, vocab, device, seed)
    return rows, waste, memory


def tutorial_row(dataset: BilingualDataset, settings: dict[str, Any], vocab: tuple[int, int], device: torch.device,
                 seed: int) -> dict[str, Any]:
    """The tutorial way's throughput row: the same sentences' distribution, 8 to a batch, padded to
    seq_len, through the tutorials' model, Adam and cross-entropy."""
    config = settings["config"]
    seq_len = settings["tutorial_seq_len"]
    fitting = [i for i in range(len(dataset)) if dataset.src_lens[i] <= seq_len and dataset.tgt_lens[i] <= seq_len]
    rng = np.random.default_rng(seed)
    chosen = rng.choice(fitting, TUTORIAL_BATCH * (settings["tutorial_steps"] + 1), replace=False)
    tutorial_batches = [on_device(tutorial_batch(dataset, chosen[i:i + TUTORIAL_BATCH], seq_len), device)
                        for i in range(0, len(chosen), TUTORIAL_BATCH)]
    torch.manual_seed(seed)
    model = TutorialTransformer(*vocab, seq_len, config).to(device).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, eps=1e-9)
    loss_fn = nn.CrossEntropyLoss(ignore_index=PAD_ID, label_smoothing=config["label_smoothing"])
    mean_target = float(dataset.tgt_lens[fitting].mean())
    with PeakMemory(device) as peak:
        row = measure_training(
            "tutorial", functools.partial(tutorial_step, model, optimizer, config=config, loss_fn=loss_fn),
            tutorial_batches[:1],
            tutorial_batches[1:], lambda batch: train_flops(TUTORIAL_BATCH, seq_len, seq_len, config, vocab[1]),
            config, vocab[1], device, tokens_per_batch=TUTORIAL_BATCH * mean_target)
    row.update({"dtype": "float32", "parameters": sum(p.numel() for p in model.parameters()),
                "peak_memory_bytes": peak.peak})
    return row


# ---------------------------------------------------------------------------- decoding

def decoding_rows(dataset: BilingualDataset, tok_src: Any, tok_tgt: Any, settings: dict[str, Any],
                  vocab: tuple[int, int], device: torch.device, seed: int) -> dict[str, Any]:
    config = settings["config"]
    torch.manual_seed(seed)
    model = build_model(config, *vocab).to(device).eval()
    with torch.no_grad():
        model.projection_layer.proj.bias[EOS_ID] = -1e9  # never ends: every output has the full length
    rng = np.random.default_rng(seed)
    batch = settings["decode_batch"]
    sources = dataset.collate(rng.choice(len(dataset), batch, replace=False))
    src = sources["encoder_input"].to(device)
    src_mask = (src != PAD_ID)[:, None, None, :]
    rows: list[dict[str, Any]] = []
    with PeakMemory(device) as peak:
        for use_cache in (True, False):
            greedy_decode(model, src, src_mask, 2, use_cache=use_cache)  # warm-up
        for length in settings["decode_lengths"]:
            outputs = {}
            for use_cache in (True, False):
                seconds, outputs[use_cache] = timed(device, lambda: greedy_decode(model, src, src_mask, length,
                                                                                  use_cache=use_cache))
                assert all(len(tokens) == length for tokens, _ in outputs[use_cache]), "an output ended early"
                rows.append({"tokens": length, "cache": use_cache, "batch": batch, "seconds": seconds,
                             "sentences_per_s": batch / seconds, "ms_per_step": 1000 * seconds / length,
                             "tokens_per_s": batch * length / seconds})
                log(f"decoding: {length} tokens, cache {'on' if use_cache else 'off'}: {seconds:.2f} s")
            rows[-2]["speedup"] = rows[-1]["seconds"] / rows[-2]["seconds"]
            rows[-2]["identical"] = [t for t, _ in outputs[True]] == [t for t, _ in outputs[False]]

        # translate.py's way: raw text in, one sentence, until max_output_tokens.
        median = int(np.argsort(dataset.src_lens)[len(dataset) // 2])
        sentence = decode_ids(tok_src, dataset[median][0])
        source_tokens = int(dataset.src_lens[median]) - 2
        translator = TorchTranslator(model, tok_src, tok_tgt, config)
        translate = lambda: translator.translate_best([sentence], DecodingOptions(beam_size=1))  # noqa: E731
        translate()
        latency = statistics.median(timed(device, translate)[0] for _ in range(3))
    generated = max_output_tokens(source_tokens, config["seq_len"])
    single = {"source_tokens": source_tokens, "output_tokens": generated, "ms": 1000 * latency,
              "ms_per_token": 1000 * latency / generated}
    log(f"decoding: one sentence of {source_tokens} tokens -> {generated} tokens: {1000 * latency:.0f} ms")
    return {"greedy": rows, "single_sentence": single, "peak_memory_bytes": peak.peak, "memory_kind": peak.kind}


# ---------------------------------------------------------------------------- translation, beam 5

def translation_rows(dataset: BilingualDataset, tok_src: Any, tok_tgt: Any, settings: dict[str, Any],
                     device: torch.device, seed: int) -> dict[str, Any]:
    """Sentences per second translating `translate_sentences` source sentences of the data with beam 5,
    as translate.py does: this project's PyTorch engine (`TorchTranslator`) and CTranslate2 on the same
    model exported by export.py (float16 on CUDA, int8 on the CPU). The model is untrained with its
    [EOS] suppressed, so both engines generate the same number of tokens (2 x source + 10)."""
    config = settings["config"]
    torch.manual_seed(seed)
    # The tokenizers' own sizes, not the training legs' floor: an export's vocabularies are the tokenizers'.
    model = build_model(config, tok_src.get_vocab_size(), tok_tgt.get_vocab_size()).to(device).eval()
    with torch.no_grad():
        model.projection_layer.proj.bias[EOS_ID] = -1e9
    rng = np.random.default_rng(seed)
    picked = rng.choice(len(dataset), min(settings["translate_sentences"], len(dataset)), replace=False)
    sentences = [decode_ids(tok_src, dataset[int(i)][0]) for i in picked]
    options = DecodingOptions(beam_size=5)

    def measure(engine: str, translator: Any) -> dict[str, Any]:
        translator.translate_best(sentences[:2], options)  # warm-up
        seconds, _ = timed(device, lambda: translator.translate_best(sentences, options))
        log(f"translation, beam 5: {engine}: {len(sentences) / seconds:.1f} sentences/s")
        return {"engine": engine, "sentences": len(sentences), "seconds": seconds,
                "sentences_per_s": len(sentences) / seconds}

    rows = [measure("pytorch", TorchTranslator(model, tok_src, tok_tgt, config))]
    quantization = "float16" if device.type == "cuda" else "int8"
    try:
        from export import export_model
        from nmt.inference.translator import CTranslate2Translator
        import ctranslate2  # noqa: F401  (only to learn whether it is installed)
    except ImportError as error:
        return {"rows": rows, "skipped": f"ctranslate2 {quantization}: {error}"}
    with tempfile.TemporaryDirectory() as work:
        folder = export_model(model.cpu(), config, tok_src, tok_tgt, Path(work) / quantization, quantization)
        try:
            translator = CTranslate2Translator(folder, device=device.type)
            rows.append(measure(f"ctranslate2 {quantization}", translator))
        except (RuntimeError, OSError, ValueError) as error:  # e.g. its CUDA build missing cuBLAS 12
            return {"rows": rows, "skipped": f"ctranslate2 {quantization} on {device.type}: {error}"}
    rows[-1]["vs_pytorch"] = rows[-1]["sentences_per_s"] / rows[0]["sentences_per_s"]
    return {"rows": rows}


# ---------------------------------------------------------------------------- kill -9 and resume

def training_command(data: Path, work: Path, name: str, settings: dict[str, Any], device: torch.device) -> list[str]:
    return [sys.executable, str(ROOT / "train.py"), "--datasource", str(data), "--preset", settings["resume_preset"],
            "--device", device.type, "--deterministic", "true", "--max_steps", str(settings["resume_steps"]),
            "--save_every_steps", str(settings["resume_every"]), "--num_epochs", "1000", "--val_max_sentences", "8",
            "--num_examples", "0", "--experiment_name", "resume",
            "--store_folder", str(work / "stores"), "--model_folder", str(work / name / "weights"),
            "--runs_folder", str(work / name / "runs")]


def resume_check(settings: dict[str, Any], device: torch.device, seed: int) -> dict[str, Any]:
    """train.py (`--deterministic true`) killed with SIGKILL as soon as its first checkpoint is listed,
    then run again, which resumes it; against an unbroken run of the same command. Bit-identical
    final weights are the target; otherwise the largest difference is reported."""
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        data = work / "pairs.en-it.tsv"
        data.write_text("".join(f"{s}\t{t}\n" for s, t in synthetic_pairs(400, seed, (300, 300))), encoding="utf-8")
        unbroken = subprocess.Popen(training_command(data, work, "unbroken", settings, device),
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        broken_command = training_command(data, work, "killed", settings, device)
        killed = subprocess.Popen(broken_command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        manifest = work / "killed" / "weights" / "resume" / MANIFEST
        while killed.poll() is None and not (manifest.is_file() and read_manifest(manifest.parent)["checkpoints"]):
            time.sleep(0.005)
        killed.kill()
        stderr = killed.communicate()[1]
        if killed.returncode != -signal.SIGKILL:
            raise RuntimeError(f"the run to kill ended by itself before it was killed: {stderr.strip()[-300:]}")
        killed_at = read_manifest(manifest.parent)["latest"]
        resumed = subprocess.run(broken_command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        unbroken_stderr = unbroken.communicate()[1]
        for run, stderr in ((resumed, resumed.stderr), (unbroken, unbroken_stderr)):
            if run.returncode != 0:
                raise RuntimeError(f"train.py failed: {stderr.strip()[-300:]}")
        final = checkpoint_name(settings["resume_steps"])
        weights = [load_checkpoint(work / name / "weights" / "resume" / final)["model"]
                   for name in ("unbroken", "killed")]
    difference = max(float((weights[0][k].float() - weights[1][k].float()).abs().max()) for k in weights[0])
    exact = all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    log(f"kill -9 at {killed_at} and resume: final weights {'bit-identical' if exact else f'differ by {difference:g}'}")
    return {"preset": settings["resume_preset"], "steps": settings["resume_steps"], "killed_after": killed_at,
            "bit_identical": exact, "max_abs_difference": difference}


# ---------------------------------------------------------------------------- report

def run(args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    settings = bench_settings(args.quick)
    if device.type == "cuda":
        settings = on_cuda(settings)
    config = settings["config"]
    result: dict[str, Any] = {
        "command": " ".join(["python", "-m", "benchmarks.bench", *sys.argv[1:]]),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else
        f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)",
        "device_type": device.type, "torch": torch.__version__, "quick": args.quick,
        "model": {k: config[k] for k in ("d_model", "num_layers", "num_heads", "d_ff", "dropout", "norm_first",
                                         "batch_tokens", "seq_len")},
    }
    # Data first: a bad --datasource is reported before any work is done.
    dataset, tok_src, tok_tgt, data_name = load_data(args.datasource, settings, args.seed)
    if len(dataset) < TUTORIAL_BATCH * (settings["tutorial_steps"] + 1):
        raise DataError(f"{data_name} has only {len(dataset)} usable pairs; the benchmark needs at least "
                        f"{TUTORIAL_BATCH * (settings['tutorial_steps'] + 1)}")
    log(f"data: {data_name}, {len(dataset)} pairs; measuring the matmul peak on {device}")
    peak_fp32 = matmul_peak(device, settings["peak_size"], torch.float32)
    # Without native bf16 (AVX-512 BF16 or AMX) a CPU runs bf16 products on a slow fallback: on an
    # AVX2 machine one square bf16 product did not finish in 4 minutes. Measured only where native.
    peak_bf16 = matmul_peak(device, settings["peak_size"], torch.bfloat16) if native_bf16(device) else {}
    result["peak_gflops"] = {"float32": max(peak_fp32.values()), "bfloat16": max(peak_bf16.values(), default=None),
                             "float32_by_kernel": peak_fp32, "bfloat16_by_kernel": peak_bf16}
    floor = settings["vocab_floor"]
    vocab = (max(tok_src.get_vocab_size(), floor[0]), max(tok_tgt.get_vocab_size(), floor[1]))
    result["model"]["vocab"] = list(vocab)

    rows, waste, memory = training_rows(dataset, settings, vocab, device, args.seed)
    result["data"] = {"source": data_name, "pairs": len(dataset),
                      "mean_src_tokens": float(dataset.src_lens.mean()), "mean_tgt_tokens": float(dataset.tgt_lens.mean()),
                      "max_src_tokens": int(dataset.src_lens.max()), "max_tgt_tokens": int(dataset.tgt_lens.max()),
                      "share_tgt_over_100": float((dataset.tgt_lens > 100).mean()), "padding_waste": waste}
    for row in rows.values():
        compute = torch.bfloat16 if row["dtype"] == "bfloat16" else torch.float32
        peak = result["peak_gflops"][str(compute).replace("torch.", "")]
        row["peak_fraction"], row["real_peak_fraction"] = row["flops_per_s"] / 1e9 / peak, row["real_flops_per_s"] / 1e9 / peak
    result["training"] = rows
    if device.type == "cuda" and (spec := spec_peak_tflops(result["device"])):
        result["peak_gflops"]["bfloat16_spec"] = 1000 * spec
        for row in rows.values():
            if row["dtype"] == "bfloat16":
                row["spec_peak_fraction"] = row["flops_per_s"] / 1e12 / spec
    result["training_memory"] = memory
    project = rows["project"]["tokens_per_s"]
    result["ratios"] = {"vs_tutorial": project / rows["tutorial"]["tokens_per_s"],
                        "vs_nn_transformer": project / rows["torch.nn.Transformer"]["tokens_per_s"]}
    result["decoding"] = decoding_rows(dataset, tok_src, tok_tgt, settings, vocab, device, args.seed)
    result["translation"] = translation_rows(dataset, tok_src, tok_tgt, settings, device, args.seed)
    result["resume"] = resume_check(settings, device, args.seed)
    result["targets"] = targets(result, settings)
    result["seconds"] = time.monotonic() - STARTED
    return result


def targets(result: dict[str, Any], settings: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's targets, each with the measured value and whether it is met."""
    greedy = result["decoding"]["greedy"]
    cached = {row["tokens"]: row for row in greedy if row["cache"]}
    lengths = settings["decode_lengths"]
    middle = cached[lengths[1]]
    memory_gb = result["training_memory"]["bytes"] / 1e9
    needed = CUDA_TARGETS if result["device_type"] == "cuda" else TARGETS
    checks = [
        ("training throughput vs the tutorial way", result["ratios"]["vs_tutorial"], needed["vs_tutorial"], "x"),
        ("training throughput vs torch.nn.Transformer", result["ratios"]["vs_nn_transformer"],
         needed["vs_nn_transformer"], "x"),
        ("achieved training FLOP/s / matmul peak", result["training"]["project"]["peak_fraction"],
         needed["peak_fraction"], "fraction"),
        (f"greedy decoding speed-up of the cache at {lengths[1]} tokens", middle["speedup"],
         needed["cache_speedup_50"], "x"),
    ]
    out = [{"target": name, "value": value, "needed": least, "unit": unit, "met": value >= least}
           for name, value, least, unit in checks]
    out.append({"target": f"cached ms per step at {lengths[-1]} / at {lengths[0]} tokens (roughly flat)",
                "value": cached[lengths[-1]]["ms_per_step"] / cached[lengths[0]]["ms_per_step"], "needed": 1.5,
                "unit": "ratio, at most", "met": cached[lengths[-1]]["ms_per_step"]
                <= 1.5 * cached[lengths[0]]["ms_per_step"]})
    out.append({"target": f"training memory ({result['training_memory']['kind']}) in GB", "value": memory_gb,
                "needed": needed["train_rss_gb"], "unit": "GB, at most", "met": memory_gb < needed["train_rss_gb"]})
    out.append({"target": "kill -9 and resume: final weights bit-identical (1 = yes)",
                "value": float(result["resume"]["bit_identical"]), "needed": 1, "unit": "",
                "met": result["resume"]["bit_identical"]})
    return out


def table(result: dict[str, Any]) -> str:
    model, data, peak = result["model"], result["data"], result["peak_gflops"]
    lines = [f"bench.py on {result['device']}, torch {result['torch']}"
             + (" -- QUICK sizes, not the targets' conditions" if result["quick"] else ""),
             f"model: d_model {model['d_model']}, {model['num_layers']}+{model['num_layers']} layers, "
             f"{model['num_heads']} heads, d_ff {model['d_ff']}, dropout {model['dropout']}, "
             f"vocab {model['vocab'][0]}/{model['vocab'][1]}",
             f"data: {data['source']}: {data['pairs']} pairs, mean {data['mean_src_tokens']:.1f} source / "
             f"{data['mean_tgt_tokens']:.1f} target tokens, longest {data['max_src_tokens']}/{data['max_tgt_tokens']}, "
             f"{100 * data['share_tgt_over_100']:.1f}% of targets over 100",
             f"batching: token budget {model['batch_tokens']}, padding {100 * data['padding_waste']:.1f}% of the "
             f"epoch's positions (dataset.padding_waste)",
             "matmul peak (GFLOP/s): fp32 " + ", ".join(f"{k} {v:.0f}" for k, v in peak["float32_by_kernel"].items())
             + "; bf16 " + (", ".join(f"{k} {v:.0f}" for k, v in peak["bfloat16_by_kernel"].items())
                            or "not measured: this CPU has no native bf16"),
             "",
             f"{'training (fwd+bwd+AdamW)':<34}{'dtype':>9}{'real tok/s':>12}{'ms/step':>10}{'GFLOP/s':>9}"
             f"{'% peak':>8}{'real %':>8}{'peak mem GB':>13}"]
    for name, row in result["training"].items():
        lines.append(f"{name:<34}{row['dtype']:>9}{row['tokens_per_s']:>12.1f}{row['ms_per_step']:>10.0f}"
                     f"{row['flops_per_s'] / 1e9:>9.1f}{100 * row['peak_fraction']:>7.0f}%"
                     f"{100 * row['real_peak_fraction']:>7.0f}%"
                     f"{row['peak_memory_bytes'] / 1e9:>13.2f}")
    lines.append(f"project / tutorial: {result['ratios']['vs_tutorial']:.1f}x;  "
                 f"project / torch.nn.Transformer: {result['ratios']['vs_nn_transformer']:.2f}x")
    decoding = result["decoding"]
    lines += ["", f"greedy decoding, batch of {decoding['greedy'][0]['batch']}, [EOS] suppressed "
                  f"(peak mem {decoding['peak_memory_bytes'] / 1e9:.2f} GB)",
              f"{'tokens':>6}{'cache':>7}{'sent/s':>9}{'ms/step':>10}{'tok/s':>9}{'speed-up':>10}{'same output':>13}"]
    for row in decoding["greedy"]:
        extra = f"{row['speedup']:>9.1f}x{'yes' if row['identical'] else 'NO':>13}" if "speedup" in row else ""
        lines.append(f"{row['tokens']:>6}{'on' if row['cache'] else 'off':>7}{row['sentences_per_s']:>9.2f}"
                     f"{row['ms_per_step']:>10.1f}{row['tokens_per_s']:>9.0f}{extra}")
    single = decoding["single_sentence"]
    lines += [f"TorchTranslator, one sentence of {single['source_tokens']} tokens -> {single['output_tokens']} "
              f"tokens: {single['ms']:.0f} ms ({single['ms_per_token']:.1f} ms/token)", ""]
    translation = result["translation"]
    lines.append(f"translation, beam 5, {translation['rows'][0]['sentences']} sentences, [EOS] suppressed: "
                 + "; ".join(f"{row['engine']} {row['sentences_per_s']:.1f} sentences/s" for row in translation["rows"])
                 + (f" ({translation['rows'][-1]['vs_pytorch']:.2f}x)" if "vs_pytorch" in translation["rows"][-1] else "")
                 + (f"; skipped {translation['skipped']}" if "skipped" in translation else ""))
    resume = result["resume"]
    lines += [f"kill -9 after {resume['killed_after']} and resume ({resume['preset']} preset, {resume['steps']} steps, "
              f"--deterministic true): final weights "
              + ("bit-identical to an unbroken run" if resume["bit_identical"] else
                 f"differ from an unbroken run's by up to {resume['max_abs_difference']:g}"), "", "targets:"]
    for target in result["targets"]:
        lines.append(f"  [{'met ' if target['met'] else 'MISS'}] {target['target']}: {target['value']:.2f} "
                     f"(needed {target['needed']} {target['unit']})")
    lines.append(f"({result['seconds']:.0f} s; command: {result['command']})")
    return "\n".join(lines)


def argument_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasource", default=None, help="local dataset folder in Hub layout (default: "
                                                           "synthetic opus_books-like lengths)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test of the benchmark itself")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda", "mps"), default="auto")
    parser.add_argument("--seed", type=int, default=0)
    return parser


def main(argv: list[str] | None = None, command_line: bool = False) -> int:
    """bench.py's entry point; as a program (`command_line`) on CPU it sets glibc to keep freed memory,
    as train.py's command line does, so the figures are those of a training run."""
    parser = argument_parser()
    args = parser.parse_args(argv)
    try:
        device = pick_device(args.device)
    except ConfigError as error:
        print(f"bench.py: error: {error}", file=sys.stderr)
        return 2
    if command_line and device.type == "cpu":
        cpu_kernels.keep_freed_memory()
    try:
        result = run(args, device)
    except (DataError, TokenizerError) as error:
        print(f"bench.py: error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("bench.py: interrupted", file=sys.stderr)
        return 130
    print(json.dumps(result, indent=1) if args.json else table(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(command_line=True))
