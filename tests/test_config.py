"""config.py: defaults, typed --key overrides, presets, validation, and artefact paths."""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from config import (HELP, PRESETS, ConfigError, experiment_name, get_config, parse_config, runs_dir,
                    validate_config, weights_dir)


def test_defaults_are_the_papers_base_model_on_opus_books_en_it() -> None:
    config = get_config()
    assert config["datasource"] == "Helsinki-NLP/opus_books"
    assert (config["lang_src"], config["lang_tgt"]) == ("en", "it")
    assert (config["d_model"], config["num_layers"], config["num_heads"], config["d_ff"]) == (512, 6, 8, 2048)
    assert config["dropout"] == 0.1 and config["label_smoothing"] == 0.1
    assert config["preload"] == "latest"
    validate_config(config)
    assert parse_config([]) == get_config()


def test_overrides_are_typed_from_the_default() -> None:
    config = parse_config(["--d_model", "64", "--num_heads", "4", "--lr", "1", "--dropout", "0.25",
                           "--joint_vocab", "true", "--norm_first", "no", "--datasource", "somewhere",
                           "--lang_tgt", "fr"])
    assert config["d_model"] == 64 and type(config["d_model"]) is int
    assert config["lr"] == 1.0 and type(config["lr"]) is float
    assert config["dropout"] == 0.25
    assert config["joint_vocab"] is True and config["norm_first"] is False
    assert config["datasource"] == "somewhere" and config["lang_tgt"] == "fr"
    untouched = {k: v for k, v in get_config().items()
                 if k not in ("d_model", "num_heads", "lr", "dropout", "joint_vocab", "norm_first", "datasource",
                              "lang_tgt")}
    assert {k: config[k] for k in untouched} == untouched


@pytest.mark.parametrize("argv", [["--preset", "tiny", "--d_model", "64"], ["--d_model", "64", "--preset", "tiny"]])
def test_preset_applies_before_overrides_wherever_it_is_written(argv: list[str]) -> None:
    config = parse_config(argv)
    assert config["d_model"] == 64  # the override wins
    assert config["num_layers"] == PRESETS["tiny"]["num_layers"]  # the preset beats the default
    assert config["num_heads"] == PRESETS["tiny"]["num_heads"]


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_is_a_valid_config(name: str) -> None:
    assert set(PRESETS[name]) <= set(get_config())
    config = parse_config(["--preset", name])
    assert {k: config[k] for k in PRESETS[name]} == PRESETS[name]


def test_validate_config_names_the_key() -> None:
    for change, message in (({"surprise": 1}, "surprise"), ({"d_model": "512"}, "d_model"),
                            ({"d_model": 100}, "d_model"), ({"seq_len": 2}, "seq_len"), ({"lr": -1e-3}, "lr"),
                            ({"dropout": 1.0}, "dropout"), ({"tie_embeddings": True}, "joint_vocab")):
        with pytest.raises(ConfigError, match=message):
            validate_config({**get_config(), **change})
    config = {**get_config(), "lr": 1}
    validate_config(config)
    assert type(config["lr"]) is float  # an int where a float is expected is fine (e.g. from JSON)


def test_experiment_names_keep_pairs_and_datasources_apart(tmp_path: Path) -> None:
    base = get_config()
    en_it = experiment_name(base)
    en_fr = experiment_name({**base, "lang_tgt": "fr"})
    local = experiment_name({**base, "datasource": "../shared/data/tatoeba"})
    local_fr = experiment_name({**base, "datasource": "../shared/data/tatoeba/", "lang_tgt": "fr"})
    assert len({en_it, en_fr, local, local_fr}) == 4
    assert en_it == "opus_books_en-it" and local == "tatoeba_en-it"
    assert experiment_name({**base, "experiment_name": "mine"}) == "mine"
    config = {**base, "model_folder": str(tmp_path / "w"), "runs_folder": str(tmp_path / "r")}
    assert weights_dir(config) == tmp_path / "w" / en_it
    assert runs_dir(config) == tmp_path / "r" / en_it


# Bad command lines, each with the key its one-line message must name.
BAD_COMMAND_LINES = {
    "unknown key": (["--no_such_key", "1"], "no_such_key"),
    "int expected": (["--d_model", "big"], "d_model"),
    "not divisible": (["--d_model", "100", "--num_heads", "8"], "d_model"),
    "seq_len too small": (["--seq_len", "2"], "seq_len"),
    "negative lr": (["--lr", "-0.1"], "lr"),
}
MORE_BAD_COMMAND_LINES = {
    "bool expected": (["--joint_vocab", "maybe"], "joint_vocab"),
    "float expected": (["--dropout", "a lot"], "dropout"),
    "unknown preset": (["--preset", "huge"], "preset"),
    "unknown choice": (["--tokenizer_type", "chars"], "tokenizer_type"),
    "zero batch": (["--batch_tokens", "0"], "batch_tokens"),
    "dropout of 1": (["--dropout", "1.0"], "dropout"),
    "tied but separate vocabularies": (["--tie_embeddings", "true"], "joint_vocab"),
    "same language": (["--lang_tgt", "en"], "lang_tgt"),
}


@pytest.fixture(scope="module")
def bad_runs(cli) -> dict:
    """`python train.py <bad options>` for every case, run concurrently (each pays torch's import)."""
    with ThreadPoolExecutor(max_workers=len(BAD_COMMAND_LINES) + 1) as pool:
        futures = {name: pool.submit(cli, "train.py", *argv) for name, (argv, _) in BAD_COMMAND_LINES.items()}
        # A wide terminal: argparse would otherwise wrap (and hyphen-break) long defaults.
        futures["--help"] = pool.submit(cli, "train.py", "--help", env={**os.environ, "COLUMNS": "400"})
        return {name: future.result() for name, future in futures.items()}


@pytest.mark.parametrize("case", sorted(BAD_COMMAND_LINES))
def test_bad_value_exits_with_one_line_naming_the_key(bad_runs, case: str) -> None:
    result = bad_runs[case]
    key = BAD_COMMAND_LINES[case][1]
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert key in lines[0]
    assert result.stdout == ""


@pytest.mark.parametrize("case", sorted(MORE_BAD_COMMAND_LINES))
def test_more_bad_values_in_process(capsys: pytest.CaptureFixture, case: str) -> None:
    """The same parser in-process (each subprocess costs seconds of torch import)."""
    argv, key = MORE_BAD_COMMAND_LINES[case]
    with pytest.raises(SystemExit) as stop:
        parse_config(argv)
    assert stop.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and key in lines[0]


def test_help_lists_every_key_with_its_default(bad_runs) -> None:
    result = bad_runs["--help"]
    assert result.returncode == 0
    text = " ".join(result.stdout.split())  # long option names put their help on the next line
    for key, default in get_config().items():
        explained = f"{HELP[key]} (default: {default!r})" if key in HELP else f"default: {default!r}"
        assert f"--{key} {type(default).__name__.upper()} {explained}" in text
    assert "train.py's command line sets glibc's malloc to keep freed memory" in text
    assert "default: None" not in text  # argparse's own None ("not given") is not the default
    assert "--preset {" + ",".join(sorted(PRESETS)) + "}" in text
