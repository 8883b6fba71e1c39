"""The CTranslate2 model directory, which export.py writes and translator.py runs.

- Its files: CTranslate2's own (model.bin, config.json, the vocabularies) and this project's beside
  them: both tokenizers and `project.json` (the checkpoint it came from, its quantization and the
  model's training config), written and read here (`write_project_files`, `read_project_files`);
  export.py's marker `export.json`, which lists the files of the export; and `compute_type.json`
  (`TIMINGS`), the compute type a timing chose on each machine, which export.py or a load may write.
- `QUANTIZATIONS`: the weight types an export takes, CTranslate2's names.
- `ct2_setup`: the compute type and CPU backend a model runs with on this machine, by what its CPU can
  do (`cpu_info`, `auto_rule`); where that rule cannot tell, the faster of a short timing of the
  model's own beam search (`time_compute_types`, each type in fresh processes), cached per machine
  beside the model (`TIMINGS`). `export_quantization`: the weight type export.py writes by default,
  by the same rule; where it cannot tell, `timed_export` times an export of each type.
- `pinned_folder`: the directory read as one export while export.py may replace it.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

from tokenizers import Tokenizer

from nmt.atomic_files import atomic_write_bytes
from config import get_config, validate_config
from nmt.diagnostics import first_line, log
from nmt.corpora.tokenizer import load_tokenizer

QUANTIZATIONS = ("int8", "int16", "float32", "bfloat16", "float16", "int8_float16")  # the last two for GPUs
SOURCE_TOKENIZER, TARGET_TOKENIZER, PROJECT_CONFIG = "tokenizer_source.json", "tokenizer_target.json", "project.json"
MARKER = "export.json"  # in every export: what export.py --overwrite may replace, and which files are its own
READ_ATTEMPTS = 3  # reads of an export that another replaced meanwhile, before giving up
TIMINGS = "compute_type.json"  # beside the model: the compute type a timing chose, per machine (ct2_setup)
CUDA_TYPES = {"bfloat16": "bfloat16", "int8": "int8_float16", "int8_float16": "int8_float16"}  # else float16
INT8_WEIGHTS = ("int8", "int8_float16")  # the exports `auto` may run as int8 on a CPU
ONEDNN = {"CT2_USE_MKL": "0"}  # CTranslate2's CPU backend on x86 under `auto`: oneDNN, never MKL
# The timing: beam 5 (the speed target's), a seeded batch of sources of the model's own tokens, each
# decoded to exactly TIMED_LENGTH tokens so that every compute type does the same work.
TIMED_BEAM, TIMED_LENGTH, TIMED_ROUNDS = 5, 16, 3
TIMED_SOURCE_LENGTHS = (6, 9, 12, 15, 18, 24) * 6
PROJECT_FOLDER = str(Path(__file__).resolve().parents[2])  # where a timing child imports this module from
TIMING_CHILD = ("import sys; from nmt.inference import ct2_model; "
                "print(ct2_model.beam_rate(sys.argv[1], sys.argv[2], int(sys.argv[3])))")


def child_environment() -> dict[str, str]:
    """The environment of a timing child: this one's, with the project's folder first on PYTHONPATH,
    so the child imports this module whatever its working folder (a relative model folder stays
    right) and whatever PYTHONSAFEPATH says."""
    paths = [PROJECT_FOLDER, *filter(None, [os.environ.get("PYTHONPATH")])]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


def write_project_files(folder: Path, tok_src: Tokenizer, tok_tgt: Tokenizer, project: dict[str, Any]) -> None:
    """This project's files beside CTranslate2's in `folder`: the tokenizers and `project`."""
    atomic_write_bytes(folder / SOURCE_TOKENIZER, tok_src.to_str().encode("utf-8"))
    atomic_write_bytes(folder / TARGET_TOKENIZER, tok_tgt.to_str().encode("utf-8"))
    atomic_write_bytes(folder / PROJECT_CONFIG, json.dumps(project, indent=1).encode("utf-8"))


def read_project_files(folder: Path) -> tuple[dict[str, Any], dict[str, Any], Tokenizer, Tokenizer]:
    """(project, the model's config validated, source tokenizer, target tokenizer) of the model
    directory `folder`. Raises what reading them raises: OSError, ValueError (a ConfigError or a
    file that is not JSON), KeyError, TypeError or TokenizerError."""
    project = json.loads((folder / PROJECT_CONFIG).read_text(encoding="utf-8"))
    model_config = {**get_config(), **project["config"]}  # keys added since the export get defaults
    validate_config(model_config)
    return project, model_config, load_tokenizer(folder / SOURCE_TOKENIZER), load_tokenizer(folder / TARGET_TOKENIZER)


@contextlib.contextmanager
def pinned_folder(folder: Path) -> Iterator[Path]:
    """A path to the directory that `folder` names now, which stays on that directory while the block
    runs even if export.py --overwrite renames another export into its place: /proc/self/fd/N of a
    descriptor held open (Linux), so that every file read through it is of one export, never the
    tokenizers of one and the weights of the next. Elsewhere, `folder` itself. Raises OSError
    (NotADirectoryError, FileNotFoundError) for a folder that cannot be opened."""
    descriptor = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        pinned = Path(f"/proc/self/fd/{descriptor}")
        yield pinned if pinned.is_dir() else folder
    finally:
        os.close(descriptor)


def replaced(pinned: Path, folder: Path) -> bool:
    """Whether `folder` now names another directory than `pinned` (pinned_folder's) does: it was
    replaced meanwhile, and what `pinned` holds may already be removed."""
    try:
        return not os.path.samefile(pinned, folder)
    except OSError:  # gone, between the two renames of a replacement
        return True


@dataclass(frozen=True)
class CpuInfo:
    """What /proc/cpuinfo says of this machine's CPU: its vendor, model name and flags, and its
    family and model numbers ("family 26 model 2", a Zen 5), which name a CPU whose model name
    does not (a cloud machine's "AMD EPYC")."""
    vendor: str
    model: str
    flags: frozenset[str]
    numbers: str = ""

    @property
    def family(self) -> str:
        """What the CPU can do, as the rule of `auto_rule` reads it; "other" for what it has no
        measurement to reason from (no AVX2: an older x86, or not x86)."""
        if self.flags & {"amx_int8", "amx_bf16", "amx_tile"}:
            return "AMX"
        if self.flags & {"avx512_vnni", "avx512_bf16"}:
            return "AVX-512 VNNI/BF16"
        if "avx512f" in self.flags:
            return "AVX-512"
        return "AVX2" if "avx2" in self.flags else "other"


def cpu_info(cpuinfo: Path = Path("/proc/cpuinfo")) -> CpuInfo:
    """This machine's CpuInfo, from its first processor's entry (empty where `cpuinfo` is not)."""
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""

    def field(name: str) -> str:
        found = re.search(rf"^{name}\s*:[ \t]*(.*)$", text, re.MULTILINE)
        return found[1].strip() if found else ""

    numbers = " ".join(f"{name} {field(key)}" for name, key in (("family", "cpu family"), ("model", "model"))
                       if field(key))
    return CpuInfo(field("vendor_id"), field("model name"), frozenset(field("flags").split()), numbers)


@dataclass(frozen=True)
class Rule:
    """`auto`'s set-up: one compute type, or several of which a timing picks the fastest, and the
    CPU-backend environment CTranslate2 reads when it first runs on the CPU."""
    compute_types: tuple[str, ...]
    backend: dict[str, str]


def auto_rule(device: str, quantization: str, info: CpuInfo) -> Rule:
    """`--compute_type auto` for a model exported as `quantization`, by what the device can do
    (docs/serving.md has the measurements). It never lowers the export's weights: int8 weights may
    run as float32 (the same values), float weights never as int8.
    - CUDA: 16-bit (float16, or the export's own bfloat16 or int8_float16; int8 as int8_float16);
    - x86 CPUs with AVX2: oneDNN (CT2_USE_MKL=0), faster than MKL in every type on every CPU
      measured; float weights as float32; int8 weights:
      - AVX2 without AVX-512: int8, which beat float32 there;
      - AVX-512, with or without VNNI, BF16 or AMX: float32 or int8, whichever a timing finds faster,
        as the fastest differed by machine and model; CTranslate2 has no bfloat16 on CPUs, so BF16
        and AMX add no type to time;
    - other CPUs, and int16 weights (MKL's type): the export's own type (`default`) on CTranslate2's
      default backend."""
    if device == "cuda":
        return Rule((CUDA_TYPES.get(quantization, "float16"),), {})
    family = info.family
    if family == "other" or quantization == "int16":
        return Rule(("default",), {})
    if quantization not in INT8_WEIGHTS:
        return Rule(("float32",), ONEDNN)
    return Rule(("int8",) if family == "AVX2" else ("float32", "int8"), ONEDNN)


def export_quantization(info: CpuInfo | None = None) -> str | None:
    """export.py's default weight type on this machine, by `auto_rule` for int8 weights: int8 where
    the rule fixes one type (`default` included); None where a timing decides between int8 and float32."""
    compute_types = auto_rule("cpu", "int8", info or cpu_info()).compute_types
    return None if len(compute_types) > 1 else compute_types[0].replace("default", "int8")


def cpu_backend() -> str:
    """The CPU backend CTranslate2 runs (or will run) in this process, as CT2_USE_MKL sets it."""
    return {"0": "oneDNN", "1": "MKL"}.get(os.environ.get("CT2_USE_MKL", ""), "CTranslate2's default")


def use_backend(rule: Rule) -> None:
    """Set `rule`'s CPU backend in os.environ, where the user has not set it; CTranslate2 reads it when
    it first runs on the CPU in a process (the timing's children inherit it)."""
    for name, value in rule.backend.items():
        os.environ.setdefault(name, value)


def ct2_setup(compute_type: str, device: str, quantization: str, model_dir: Path, threads: int,
              info: CpuInfo | None = None) -> str:
    """The compute type CTranslate2 runs the model at `model_dir` (exported as `quantization`) with on
    `threads` threads of this machine. `compute_type` other than `auto` is taken as given. `auto`
    follows `auto_rule`, first setting its CPU backend (`use_backend`: call this before CTranslate2
    first runs on the CPU in this process); where the rule names several types it takes the choice
    cached for this machine in `model_dir`/TIMINGS, or times them on the model's own weights
    (`timed_choice`). The timing picks among the rule's types only, and a cached choice stays, so
    outputs depend on it only as they depend on the compute type, which `describe` reports."""
    if compute_type != "auto":
        return compute_type
    info = info or cpu_info()
    rule = auto_rule(device, quantization, info)
    use_backend(rule)
    if len(rule.compute_types) == 1:
        return rule.compute_types[0]
    cached = read_timings(Path(model_dir)).get(machine_key(info, threads))
    if isinstance(cached, dict) and cached.get("compute_type") in rule.compute_types:
        return cached["compute_type"]
    return timed_choice(dict.fromkeys(rule.compute_types, Path(model_dir)), threads, info)


def timed_export(folders: dict[str, Path], threads: int) -> str:
    """export.py's choice where `export_quantization` is None: of `folders`, each an export in the
    type it is keyed by (in `auto_rule`'s order), the type whose own export runs fastest on this
    machine's `auto` backend (`timed_choice`), cached in that export for this machine."""
    info = cpu_info()
    use_backend(auto_rule("cpu", "int8", info))
    return timed_choice(folders, threads, info)


def machine_key(info: CpuInfo, threads: int) -> str:
    """What a timing holds for: the CPU (model and flags), threads, backend and CTranslate2's version."""
    import ctranslate2
    flags = hashlib.sha256(" ".join(sorted(info.flags)).encode()).hexdigest()[:12]
    return (f"{info.model or info.vendor or 'unknown CPU'} (flags {flags}), {threads} threads, {cpu_backend()}, "
            f"ctranslate2 {ctranslate2.__version__}")


def read_timings(model_dir: Path) -> dict[str, Any]:
    """The cached choices of `model_dir`, per machine key ({} where there is no readable cache)."""
    try:
        machines = json.loads((model_dir / TIMINGS).read_text(encoding="utf-8"))["machines"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    return machines if isinstance(machines, dict) else {}


def weights(folder: Path) -> str:
    """The weight type the export at `folder` was written in (project.json's), "?" where unreadable."""
    try:
        return str(json.loads((folder / PROJECT_CONFIG).read_text(encoding="utf-8"))["quantization"])
    except (OSError, ValueError, KeyError, TypeError):
        return "?"


def timed_choice(folders: dict[str, Path], threads: int, info: CpuInfo) -> str:
    """The fastest of `folders`' compute types, each run on its folder (`time_compute_types`; a tie
    keeps the first), cached for this machine in the chosen folder's TIMINGS with the rates and the
    weights each type ran on (atomically; a folder that cannot be written gets a warning, and the
    timing is done again at the next load)."""
    rates = time_compute_types(folders, threads)
    chosen = max(folders, key=lambda name: rates[name])
    timed_on = {name: weights(folder) for name, folder in folders.items()}
    cache, machines = folders[chosen], read_timings(folders[chosen])
    machines[machine_key(info, threads)] = {
        "compute_type": chosen, "family": info.family, "sentences_per_s": rates, "weights": timed_on,
        "timed": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    shown = ", ".join(f"{name} on {timed_on[name]} weights {rate:.1f}" for name, rate in rates.items())
    try:
        atomic_write_bytes(cache / TIMINGS, json.dumps({"machines": machines}, indent=1).encode("utf-8"))
        kept = f"cached beside the model ({TIMINGS})"
    except OSError as error:
        kept = f"not cached ({cache / TIMINGS}: {first_line(error)}), so timed again at the next load"
    log(f"ct2_model: {info.family} CPU: beam {TIMED_BEAM} ran at {shown} sentences/s: {chosen}, {kept}")
    return chosen


def time_compute_types(folders: dict[str, Path], threads: int) -> dict[str, float]:
    """Sentences per second of CTranslate2's beam search on the CPU in each compute type of `folders`,
    run on the model directory it maps to: TIMED_ROUNDS rounds taking the types in turn, each run in
    a fresh process (`beam_rate`), each type's best round kept (the one least slowed by other work on
    the machine). A fresh process each, as a serving process loads one translator: a translator loaded
    earlier in the same process slows the next one's timing.
    Raises RuntimeError, with the child's last line, where a timing fails."""
    rates = dict.fromkeys(folders, 0.0)
    for _ in range(TIMED_ROUNDS):
        for name, folder in folders.items():
            pinned = re.fullmatch(r"/proc/self/fd/(\d+)", str(folder))  # pinned_folder's: passed to the child
            child = subprocess.run([sys.executable, "-c", TIMING_CHILD, str(folder), name, str(threads)],
                                   capture_output=True, text=True, pass_fds=(int(pinned[1]),) if pinned else (),
                                   env=child_environment())
            if child.returncode != 0:
                reason = (child.stderr.strip().splitlines() or [f"exit status {child.returncode}"])[-1]
                raise RuntimeError(f"timing {name} on {folder} failed: {reason}")
            rates[name] = max(rates[name], float(child.stdout.split()[-1]))
    return {name: round(rate, 1) for name, rate in rates.items()}


def beam_rate(model_dir: str, compute_type: str, threads: int) -> float:
    """Sentences per second of one beam search over the model at `model_dir` in `compute_type` on
    `threads` CPU threads, in this process, after a warm-up one (a timing child's work): the same
    seeded batch of sources of the model's own tokens each time, each decoded to exactly TIMED_LENGTH
    tokens (both within the model's seq_len), so that every compute type does the same work."""
    import ctranslate2
    _, model_config, tokenizer, _ = read_project_files(Path(model_dir))
    seq_len = model_config["seq_len"]  # the model's positions: [SOS] source [EOS], and the output
    special = set(tokenizer.get_added_tokens_decoder())
    tokens = [tokenizer.id_to_token(i) for i in range(tokenizer.get_vocab_size()) if i not in special]
    draw = random.Random(0)
    sources = [[draw.choice(tokens) for _ in range(min(length, seq_len - 2))] for length in TIMED_SOURCE_LENGTHS]
    length = min(TIMED_LENGTH, seq_len - 1)
    translator = ctranslate2.Translator(model_dir, device="cpu", compute_type=compute_type, intra_threads=threads)
    options = {"beam_size": TIMED_BEAM, "min_decoding_length": length, "max_decoding_length": length}
    translator.translate_batch(sources, **options)  # the warm-up
    started = time.perf_counter()
    translator.translate_batch(sources, **options)
    return len(sources) / (time.perf_counter() - started)
