"""Whatever a user types, pastes or points at: a translation, or one clear line and a non-zero
exit; never a traceback, never a hang."""
from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import train
from nmt.corpora.sources import DataError
from nmt.corpora.store import text_store
from config import get_config
from synthetic_data import synthetic_pairs, tiny_corpus, write_hub_dataset

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def checkpoint_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("hostile")
    data = tiny_corpus(tmp / "data")
    assert train.main(["--datasource", str(data), "--preset", "tiny", "--max_steps", "3", "--model_folder",
                       str(tmp / "weights"), "--runs_folder", str(tmp / "runs"), "--store_folder", str(tmp / "stores"),
                       "--val_max_sentences", "2"]) == 0
    return max((tmp / "weights").glob("*/ckpt_*.pt"))


def translate(checkpoint: Path, *args: bytes | str, stdin: bytes = b"") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "translate.py", "--checkpoint", str(checkpoint), *args], cwd=ROOT,
                          input=stdin, capture_output=True, timeout=120)


@pytest.fixture(scope="module")
def translated(checkpoint_path: Path) -> dict[object, subprocess.CompletedProcess]:
    """Every `python translate.py` command line of the tests below, run at once (each pays torch's
    import, mostly on one core): its result, keyed as the tests look them up."""
    cannot = ("empty", "whitespace only", "invalid UTF-8")
    commands = {"batch": ((), b"\n".join(line for _, line in HOSTILE_LINES) + b"\n"),
                "arguments": (tuple(line for name, line in HOSTILE_LINES if name not in cannot), b"")}
    commands.update({argument: ((argument,), b"") for argument, _ in BAD_ARGUMENTS})
    with ThreadPoolExecutor(max_workers=len(commands)) as pool:
        futures = {key: pool.submit(translate, checkpoint_path, *args, stdin=stdin)
                   for key, (args, stdin) in commands.items()}
        return {key: future.result() for key, future in futures.items()}


HOSTILE_LINES = [
    ("ordinary", b"The cat sees the dog."),
    ("empty", b""),
    ("whitespace only", b"   \t  "),
    ("100,000 characters", b"the cat " * 12_500),
    ("control characters", b"the \x01\x02\x1b[31m cat\x7f"),
    ("right-to-left", "مرحبا بالعالم".encode()),
    ("emoji", "the 🐈 sees the 🐕".encode()),
    ("invalid UTF-8", b"the \xff\xfe cat"),
    ("only unknown words", b"zyzzyva quux xylophone"),
]


def test_batch_mode_translates_the_good_lines_and_names_the_bad(translated: dict) -> None:
    result = translated["batch"]  # translate.py with HOSTILE_LINES on stdin
    stdout, stderr = result.stdout.decode(), result.stderr.decode()
    assert "Traceback" not in stderr
    assert result.returncode == 1, "some lines could not be translated"
    outputs = stdout.split("\n")[:-1]
    assert len(outputs) == len(HOSTILE_LINES), "one output line per input line"
    for number, ((name, line), output) in enumerate(zip(HOSTILE_LINES, outputs), start=1):
        if name in ("empty", "whitespace only"):
            assert output == line.decode() and f"line {number}" not in stderr  # blank lines are text
        elif name == "invalid UTF-8":
            assert output == "" and f"line {number}: not valid UTF-8" in stderr
        else:
            assert output.strip(), f"{name}: no translation"
    # 100,000 bytes: past max_line_bytes (65,536), read in two pieces, each a sentence over the model's
    # limit translated in pieces, on one output line
    assert "2 sentence(s) over the model's limit of" in stderr and "truncat" not in stderr


BAD_ARGUMENTS = [
    (b"", "sentence 1 is empty"),
    (b"   ", "sentence 1 is empty"),
    (b"\xff\xfe", "sentence 1 is not valid UTF-8"),
]


@pytest.mark.parametrize("argument, message", BAD_ARGUMENTS)
def test_bad_argument_is_one_line(translated: dict, argument: bytes, message: str) -> None:
    result = translated[argument]  # translate.py ARGUMENT
    stderr = result.stderr.decode()
    assert result.returncode == 2 and message in stderr
    assert len(stderr.strip().splitlines()) == 1 and "Traceback" not in stderr


def test_hostile_arguments_translate(translated: dict) -> None:
    """All in one command line (each process pays torch's import): one translation per argument."""
    cannot = ("empty", "whitespace only", "invalid UTF-8")
    hostile = [(name, line) for name, line in HOSTILE_LINES if name not in cannot]
    result = translated["arguments"]  # translate.py with each hostile line an argument
    assert result.returncode == 0, result.stderr.decode()
    outputs = result.stdout.decode().split("\n")[:-1]
    assert len(outputs) == len(hostile), "one output line per argument"
    for (name, _), output in zip(hostile, outputs):
        assert output.strip(), f"{name}: no translation"


def config_for(folder: Path, **overrides) -> dict:
    return dict(get_config(), datasource=str(folder), store_folder=str(folder.parent / "stores"), **overrides)


def test_malformed_rows_are_skipped_and_counted(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    good = synthetic_pairs(20)
    bad_rows = [
        {"id": "a", "translation": {"en": "Only English."}},  # missing the language key
        {"id": "b", "translation": {"en": None, "it": "Ciao."}},
        {"id": "c", "translation": {"en": 42, "it": "Ciao."}},
        {"id": "d", "translation": {"en": "", "it": "Ciao."}},
        {"id": "e", "translation": "not a mapping"},
    ]
    folder = write_hub_dataset(tmp_path / "d", {"train": good + bad_rows, "validation": good[:5], "test": good[:5]})
    assert text_store(config_for(folder)).pairs("train") == [(s.strip(), t.strip()) for s, t in good]
    err = capsys.readouterr().err
    assert "train: skipped 5 of 25 rows (1 empty side, 2 missing side, 1 no translation field, 1 non-text side)" in err


def test_invalid_json_line_is_named(tmp_path: Path) -> None:
    folder = write_hub_dataset(tmp_path / "d", {"train": synthetic_pairs(10) + ['{"id": "x", "translation": {'],
                                                "validation": synthetic_pairs(3), "test": synthetic_pairs(3)})
    with pytest.raises(DataError, match=r"train\.jsonl:11 is not valid JSON"):
        text_store(config_for(folder))


def test_missing_language_pair_is_named(tmp_path: Path) -> None:
    folder = tiny_corpus(tmp_path / "d")
    with pytest.raises(DataError, match="no en-fr language pair"):
        text_store(config_for(folder, lang_tgt="fr"))


@pytest.mark.parametrize("args, key", [
    (["--no_such_key", "1"], "--no_such_key"),
    (["--d_model", "big"], "--d_model"),
    (["--d_model", "100", "--num_heads", "3"], "--d_model"),
    (["--seq_len", "2"], "--seq_len"),
    (["--lr", "-0.001"], "--lr"),
    (["--norm_first", "maybe"], "--norm_first"),
])
def test_bad_config_is_refused_before_any_work(args: list[str], key: str, tmp_path: Path,
                                               capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_info:
        train.main(args + ["--model_folder", str(tmp_path / "w")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and key in err[0]
    assert not (tmp_path / "w").exists(), "nothing may be written before the config is accepted"

