"""Fixtures shared by the test modules: a CLI runner, a toy translator
trained in seconds, and one tiny end-to-end training run that is resumed once (shared because
training is the slow part of the suite)."""
from __future__ import annotations

import contextlib
import io
import json
import os
import random
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ClassVar

# One thread per process, read by OpenMP when torch loads, here and in every program a test starts:
# the suite runs servers, ranks and programs side by side on CI's two cores, where two threads each
# oversubscribe them (an OpenMP barrier then spins against the other process: tens of times slower),
# and its toy models gain nothing from a second thread. A caller's own setting is kept.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

from config import parse_config, runs_dir, weights_dir  # noqa: E402  (pytest.ini puts the project on sys.path)
from nmt.training.checkpoint import MANIFEST, load_checkpoint  # noqa: E402
from model import Transformer, build_transformer, causal_mask  # noqa: E402
from synthetic_data import synthetic_pairs, write_hub_dataset  # noqa: E402
from nmt.corpora.tokenizer import EOS_ID, PAD_ID, SOS_ID, encode_ids, train_tokenizer  # noqa: E402


# ---------------------------------------------------------------------------- command line

@pytest.fixture(scope="session")
def cli() -> Callable[..., subprocess.CompletedProcess]:
    """Run `python SCRIPT ARGS...` from the project root, as a user would; text in and out
    (stdin may be bytes for invalid UTF-8)."""

    def run(script: str, *args: str, stdin: str | bytes | None = None, env: dict[str, str] | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess:
        binary = isinstance(stdin, bytes)
        result = subprocess.run([sys.executable, script, *args], cwd=ROOT, input=stdin, capture_output=True,
                                text=not binary, timeout=timeout, env=env)
        if binary:
            result.stdout = result.stdout.decode("utf-8")
            result.stderr = result.stderr.decode("utf-8")
        return result

    return run


def save_as_if_from(location: str, obj: Any, path: Path) -> None:
    """torch.save `obj` with every storage recorded as living on `location` (e.g. "cuda:0"),
    byte for byte what a save on that device writes: this machine has no GPU to save from."""
    registry = torch.serialization._package_registry

    def tag(storage: Any) -> str:
        return location

    def deserialize(storage: Any, where: str) -> None:
        return None  # let the real deserializers (or map_location) handle loading

    torch.serialization.register_package(0, tag, deserialize)
    try:
        torch.save(obj, path)
    finally:
        registry[:] = [entry for entry in registry if entry[1] is not tag]


@pytest.fixture(scope="session")
def save_as_if_from_cuda() -> Callable[[Any, Path], None]:
    return lambda obj, path: save_as_if_from("cuda:0", obj, path)


@pytest.fixture
def backend_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """CT2_USE_MKL unset for a test and restored after it, whatever ct2_model.ct2_setup sets."""
    monkeypatch.setenv("CT2_USE_MKL", "")
    monkeypatch.delenv("CT2_USE_MKL")


# ---------------------------------------------------------------------------- toy translator

TOY_SOURCE = ("one", "two", "three", "four", "five", "six", "seven", "eight")
TOY_TARGET = ("uno", "due", "tre", "quattro", "cinque", "sei", "sette", "otto")


@dataclass
class Toy:
    """A tiny model that learned to translate number words and reverse their order."""

    model: Transformer
    tok_src: Any
    tok_tgt: Any
    seq_len: int
    train_pairs: list[tuple[str, str]]
    first_loss: float
    last_loss: float

    @staticmethod
    def pairs(count: int, seed: int, min_words: int = 3, max_words: int = 8) -> list[tuple[str, str]]:
        """"one two three." -> "tre due uno.": a word mapping plus a reversal, which needs attention
        to positions, not just a position-wise copy."""
        rng = random.Random(seed)
        pairs = []
        for _ in range(count):
            words = [rng.randrange(len(TOY_SOURCE)) for _ in range(rng.randint(min_words, max_words))]
            pairs.append((" ".join(TOY_SOURCE[w] for w in words) + ".",
                          " ".join(TOY_TARGET[w] for w in reversed(words)) + "."))
        return pairs

    def translator(self) -> Any:
        """The toy model behind the translator interface."""
        from config import get_config
        from nmt.inference.translator import TorchTranslator
        return TorchTranslator(self.model, self.tok_src, self.tok_tgt, dict(get_config(), seq_len=self.seq_len))

    def encode(self, pairs: list[tuple[str, str]]) -> list[tuple[list[int], list[int]]]:
        """The token ids of each pair's source and target, without special tokens."""
        return [(encode_ids(self.tok_src, s), encode_ids(self.tok_tgt, t)) for s, t in pairs]

    def batch(self, encoded: list[tuple[list[int], list[int]]]) -> dict[str, torch.Tensor]:
        """A teacher-forcing batch built directly from token ids (independent of dataset.py)."""
        sources = [[SOS_ID, *s, EOS_ID] for s, _ in encoded]
        targets = [t for _, t in encoded]
        src_len, tgt_len = max(map(len, sources)), max(len(t) + 1 for t in targets)
        src = torch.full((len(encoded), src_len), PAD_ID)
        decoder_input = torch.full((len(encoded), tgt_len), PAD_ID)
        label = torch.full((len(encoded), tgt_len), PAD_ID)
        for row, (s, t) in enumerate(zip(sources, targets)):
            src[row, :len(s)] = torch.tensor(s)
            decoder_input[row, :len(t) + 1] = torch.tensor([SOS_ID, *t])
            label[row, :len(t) + 1] = torch.tensor([*t, EOS_ID])
        return {"src": src, "decoder_input": decoder_input, "label": label,
                "src_mask": (src != PAD_ID)[:, None, None, :],
                "tgt_mask": (decoder_input != PAD_ID)[:, None, None, :] & causal_mask(tgt_len)[None]}


def train_toy(train_pairs: list[tuple[str, str]], steps: int) -> Toy:
    """A 1-layer, d_model 32 model with WordLevel tokenizers trained on `train_pairs` for `steps`
    steps of 64 pairs, lr decaying linearly to zero."""
    from nmt.training.loss import loss_sum

    torch.manual_seed(0)
    rng = random.Random(0)
    tok_src = train_tokenizer([s for s, _ in train_pairs], "wordlevel", 100, 1)
    tok_tgt = train_tokenizer([t for _, t in train_pairs], "wordlevel", 100, 1)
    seq_len = 20
    model = build_transformer(tok_src.get_vocab_size(), tok_tgt.get_vocab_size(), seq_len, seq_len, d_model=32,
                              N=1, h=2, dropout=0.0, d_ff=64)
    toy = Toy(model, tok_src, tok_tgt, seq_len, train_pairs, 0.0, 0.0)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3, betas=(0.9, 0.98))
    # Decaying to zero makes the end point stable: at a constant lr the last steps' noise decided
    # whether 88% or 99% of unseen sentences came out exactly right.
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 - step / steps)
    losses = []
    encoded = toy.encode(train_pairs)  # once: tokenizing every batch anew took a third of the time
    model.train()
    for _ in range(steps):
        batch = toy.batch([encoded[i] for i in rng.sample(range(len(encoded)), 64)])
        logits = model(batch["src"], batch["decoder_input"], batch["src_mask"], batch["tgt_mask"])
        loss = loss_sum(logits, batch["label"], 0.0) / (batch["label"] != PAD_ID).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
    model.eval()
    toy.first_loss, toy.last_loss = losses[0], sum(losses[-20:]) / 20
    return toy


@pytest.fixture(scope="session")
def toy_translator() -> Toy:
    """The toy pairs' model after 600 steps (about 8 s on 2 cores)."""
    return train_toy(Toy.pairs(2000, seed=1), 600)


@pytest.fixture(scope="session")
def untrained_checkpoint() -> Callable[[Path, list[tuple[str, str]], str, str], Path]:
    """A function that writes the checkpoint file of an untrained tiny model from lang_src into
    lang_tgt, its tokenizers trained on `pairs`, into a folder: the scoring models of cleaning's
    tests."""
    from nmt.training.checkpoint import save_checkpoint
    from model import build_model

    def write(folder: Path, pairs: list[tuple[str, str]], lang_src: str, lang_tgt: str) -> Path:
        torch.manual_seed(0)
        config = parse_config(["--preset", "tiny", "--lang_src", lang_src, "--lang_tgt", lang_tgt])
        tok_src = train_tokenizer([s for s, _ in pairs], "wordlevel", 200, 1)
        tok_tgt = train_tokenizer([t for _, t in pairs], "wordlevel", 200, 1)
        model = build_model(config, tok_src.get_vocab_size(), tok_tgt.get_vocab_size())
        state = {"config": config, "model": model.state_dict(),
                 "tokenizers": {"src": tok_src.to_str(), "tgt": tok_tgt.to_str()}}
        return save_checkpoint(folder, state, 1, keep=1)

    return write


# ---------------------------------------------------------------------------- end-to-end run

# Rows a real corpus contains and the loader must skip: an empty side and a missing one.
BAD_TRAIN_ROWS = [{"id": "bad-1", "translation": {"en": "", "it": "Vuoto."}},
                  {"id": "bad-2", "translation": {"en": "The cat.", "it": None}}]


@dataclass
class Run:
    """Output of one in-process train.main call."""

    code: int
    stdout: str
    stderr: str


@dataclass
class TrainedRun:
    """A tiny training run stopped mid-epoch at FIRST_MAX_STEPS, then resumed to SECOND_MAX_STEPS."""

    FIRST_MAX_STEPS: ClassVar[int] = 5
    SECOND_MAX_STEPS: ClassVar[int] = 60
    datasource: Path
    model_folder: Path
    args: list[str]  # the options both runs share
    first: Run
    second: Run
    first_state: dict[str, Any]
    first_manifest: dict[str, Any]

    @property
    def config(self) -> dict[str, Any]:
        return parse_config(self.args)

    @property
    def folder(self) -> Path:
        """weights/<experiment>: checkpoints, tokenizers, config.json."""
        return weights_dir(self.config)

    @property
    def runs(self) -> Path:
        """runs/<experiment>: the TensorBoard event files."""
        return runs_dir(self.config)

    def latest(self) -> tuple[Path, dict[str, Any]]:
        manifest = json.loads((self.folder / MANIFEST).read_text())
        path = self.folder / manifest["latest"]
        return path, load_checkpoint(path)


def train_in_process(argv: list[str]) -> Run:
    import train

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = train.main(argv)
    return Run(code, out.getvalue(), err.getvalue())


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory: pytest.TempPathFactory) -> TrainedRun:
    root = tmp_path_factory.mktemp("e2e")
    data = write_hub_dataset(root / "data", {"train": synthetic_pairs(200, 1) + BAD_TRAIN_ROWS,
                                             "validation": synthetic_pairs(16, 2),
                                             "test": synthetic_pairs(16, 3)})
    model_folder, runs_folder = root / "weights", root / "runs"
    # lr 1e-2: validation BLEU is well above 0 after 60 steps (about 1.5 s), so comparing the
    # pipeline's BLEU with sacrebleu's is not a comparison of two zeros.
    # --clean false: the tests that use this run were written against a model of the pairs as written
    # (cleaning removes their near-duplicates; tests/test_train.py trains with it on); and against
    # decoding without a repeat ban, whose validation BLEU made the best checkpoint the latest
    # (tests/test_train.py checks the ban train.py picks)
    args = ["--datasource", str(data), "--preset", "tiny", "--batch_tokens", "256", "--lr", "1e-2",
            "--num_epochs", "100", "--log_every", "2", "--model_folder", str(model_folder),
            "--runs_folder", str(runs_folder), "--store_folder", str(root / "stores"), "--clean", "false",
            "--no_repeat_ngram_size", "0"]
    first = train_in_process(args + ["--max_steps", str(TrainedRun.FIRST_MAX_STEPS)])
    assert first.code == 0, first.stderr
    run = TrainedRun(data, model_folder, args, first, Run(-1, "", ""), {}, {})
    _, run.first_state = run.latest()
    run.first_manifest = json.loads((run.folder / MANIFEST).read_text())
    run.second = train_in_process(args + ["--max_steps", str(TrainedRun.SECOND_MAX_STEPS)])
    assert run.second.code == 0, run.second.stderr
    return run


# A calibrator's confidence.json as a user may leave it: cut short (a full disk, a killed copy), or
# edited by hand into something that is JSON but no calibrator.
GOOD_CALIBRATOR = {"kind": "logistic", "features": ["mean_log_prob", "lowest_log_prob", "log_length"],
                   "mean": [-0.5, -2.0, 2.0], "scale": [0.3, 1.0, 0.5], "weights": [1.5, 0.5, 0.0], "bias": 0.2,
                   "threshold": 50.0, "sentences": 100, "metric": "chrF", "checkpoint": "ckpt_00000060.pt"}
BAD_CALIBRATORS = {"truncated": json.dumps(GOOD_CALIBRATOR, indent=1)[:150],
                   "hand-edited": json.dumps({**GOOD_CALIBRATOR, "threshold": "50%"}, indent=1)}
# how the warning about each starts, FILE being its path
CALIBRATOR_PROBLEMS = {"truncated": "the confidence calibrator FILE is not valid JSON: ",
                       "hand-edited": "FILE: not a stored confidence calibrator: could not convert string to float: "
                                      "'50%'"}


@pytest.fixture(params=sorted(BAD_CALIBRATORS))
def bad_calibrator_run(request: pytest.FixtureRequest, trained_run: TrainedRun, tmp_path: Path) -> tuple[Path, str]:
    """A copy of the trained run's folder (under tmp_path/weights, the only run there) beside whose
    checkpoints lies a confidence.json that cannot be used (BAD_CALIBRATORS), and how the
    problem is said (its start)."""
    folder = tmp_path / "weights" / trained_run.folder.name
    shutil.copytree(trained_run.folder, folder, ignore=shutil.ignore_patterns("*.lock"))
    (folder / "confidence.json").write_text(BAD_CALIBRATORS[request.param], encoding="utf-8")
    return folder, CALIBRATOR_PROBLEMS[request.param].replace("FILE", str(folder / "confidence.json"))
