"""The CTranslate2 model directory, which export.py writes and translator.py runs.

- Its files: CTranslate2's own (model.bin, config.json, the vocabularies) and this project's beside
  them: both tokenizers and `project.json` (the checkpoint it came from, its quantization and the
  model's training config), written and read here (`write_project_files`, `read_project_files`);
  and export.py's marker `export.json`, which lists the files of the export.
- `QUANTIZATIONS`: the weight types an export takes, CTranslate2's names.
- `ct2_setup`: the compute type and CPU backend a model runs with on this machine.
- `pinned_folder`: the directory read as one export while export.py may replace it.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
from pathlib import Path
from typing import Any, Iterator

from tokenizers import Tokenizer

from atomic_files import atomic_write_bytes
from config import get_config, validate_config
from tokenizer import load_tokenizer

QUANTIZATIONS = ("int8", "int16", "float32", "bfloat16", "float16", "int8_float16")  # the last two for GPUs
SOURCE_TOKENIZER, TARGET_TOKENIZER, PROJECT_CONFIG = "tokenizer_source.json", "tokenizer_target.json", "project.json"
MARKER = "export.json"  # in every export: what export.py --overwrite may replace, and which files are its own
READ_ATTEMPTS = 3  # reads of an export that another replaced meanwhile, before giving up


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


def cpu_family() -> tuple[str, bool]:
    """This machine's CPU vendor ('GenuineIntel', 'AuthenticAMD', ...; '' where /proc/cpuinfo is
    not) and whether it has AVX-512."""
    try:
        info = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "", False
    vendor = re.search(r"^vendor_id\s*:\s*(\S+)", info, re.MULTILINE)
    flags = re.search(r"^flags\s*:(.*)$", info, re.MULTILINE)
    return (vendor[1] if vendor else ""), bool(flags and " avx512f" in f"{flags[1]} ")


def ct2_setup(compute_type: str, device: str, quantization: str,
              family: tuple[str, bool] | None = None) -> tuple[str, dict[str, str]]:
    """The compute type and the CPU-backend environment CTranslate2 runs a model exported as
    `quantization` with. `compute_type` other than `auto` is taken as given. `auto` is a fixed rule
    per device, CPU family and instruction set (never a timing, so outputs never depend on one),
    from the measurements in docs/serving.md, and never changes what the weights are:
    - CUDA: 16-bit (float16, or the export's own bfloat16 or int8_float16; int8 as int8_float16);
    - an Intel CPU with AVX-512: float32 on oneDNN (CT2_USE_MKL=0), from any export: there beam 5 ran
      at 302 sentences/s against 173 for int8 and 146 for float32 on CTranslate2's default MKL;
    - any other CPU (AMD: int8 on oneDNN, CTranslate2's default there, was 3.4x this project's
      PyTorch engine): the export's own type (`default`)."""
    if compute_type != "auto":
        return compute_type, {}
    if device == "cuda":
        return {"bfloat16": "bfloat16", "int8": "int8_float16", "int8_float16": "int8_float16"}.get(
            quantization, "float16"), {}
    vendor, avx512 = family if family is not None else cpu_family()
    if vendor == "GenuineIntel" and avx512:
        return "float32", {"CT2_USE_MKL": "0"}
    return "default", {}
