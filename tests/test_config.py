"""config.py: the schema, typed --key overrides, presets, --config files, validation, each program's
command line, the run a program picks, and artefact paths."""
from __future__ import annotations

import contextlib
import io
import json
import math
import subprocess
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import clean
import evaluate
import export
import serve
import train
import translate
from config import (AUTO, EVERY, GROUPS, OPTIONS, PRESETS, PROGRAMS, ConfigError, Range, Resolved, choose_run,
                    experiment_name, get_config, options_table, parse_args, parse_config, runs_dir, validate_config,
                    weights_dir)
from nmt.inference.translator import DecodingOptions

PARSERS = {"clean": clean.argument_parser, "train": train.argument_parser, "translate": translate.argument_parser,
           "evaluate": evaluate.argument_parser, "export": export.argument_parser, "serve": serve.argument_parser}
ROOT = Path(__file__).resolve().parents[1]


def test_every_key_is_declared_once_with_type_help_group_and_programs() -> None:
    for key, option in OPTIONS.items():
        assert option.help and option.group in GROUPS, key
        assert option.kind in (int, float, str, bool), key
        assert option.programs and option.programs <= EVERY, key
        assert not option.choices or option.default in option.choices, key
        assert option.range is None or option.default == AUTO and option.auto or option.range.admits(option.default), key
        # an option that takes infinity says what it means
        assert option.range is None or not option.range.admits(math.inf) or "inf" in option.help, key
    validate_config(get_config())


def test_defaults_are_the_papers_base_model_on_opus_books_en_it_decoded_with_beam_5() -> None:
    config = get_config()
    assert config["datasource"] == "Helsinki-NLP/opus_books"
    assert (config["lang_src"], config["lang_tgt"]) == ("en", "it")
    assert (config["d_model"], config["num_layers"], config["num_heads"], config["d_ff"]) == (512, 6, 8, 2048)
    assert config["dropout"] == 0.1 and config["label_smoothing"] == 0.1
    assert config["preload"] == "latest"
    # The README's headline decoding is beam 5: every program and the API decode so unless told.
    assert config["beam_size"] == 5 and DecodingOptions().beam_size == 5
    assert parse_config([]) == get_config()


def test_sampling_implies_a_beam_of_one_unless_a_beam_is_asked_for(capsys: pytest.CaptureFixture) -> None:
    assert parse_config(["--sampling_topk", "10"], "translate")["beam_size"] == 1
    assert parse_config(["--sampling_topp", "0.9"], "serve")["beam_size"] == 1
    with pytest.raises(SystemExit):
        parse_config(["--sampling_topk", "10", "--beam_size", "3"], "translate")
    assert "sampling_topk" in capsys.readouterr().err


def test_overrides_are_typed_from_the_default() -> None:
    config = parse_config(["--d_model", "64", "--num_heads", "4", "--lr", "1", "--dropout", "0.25",
                           "--joint_vocab", "true", "--norm_first", "no", "--datasource", "somewhere",
                           "--lang_tgt", "fr"])
    assert config["d_model"] == 64 and type(config["d_model"]) is int
    assert config["lr"] == 1.0 and type(config["lr"]) is float
    assert config["dropout"] == 0.25
    assert config["joint_vocab"] is True and config["norm_first"] is False
    assert config["datasource"] == "somewhere" and config["lang_tgt"] == "fr"
    changed = ("d_model", "num_heads", "lr", "dropout", "joint_vocab", "norm_first", "datasource", "lang_tgt")
    untouched = {k: v for k, v in get_config().items() if k not in changed}
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
                            ({"dropout": 1.0}, "dropout"), ({"tie_embeddings": True}, "joint_vocab"),
                            ({"beam_size": 0}, "beam_size"), ({"amp": "fp8"}, "amp"),
                            ({"lr_sheduler": "cosine"}, "did you mean --lr_schedule")):
        with pytest.raises(ConfigError, match=message):
            validate_config({**get_config(), **change})
    config = {**get_config(), "lr": 1}
    validate_config(config)
    assert type(config["lr"]) is float  # an int where a float is expected is fine (e.g. from JSON)


def test_a_runs_config_file_reproduces_it_and_options_win(tmp_path: Path) -> None:
    argv = ["--preset", "cpu", "--datasource", "data/tatoeba", "--seed", "7", "--max_minutes", "3"]
    config = parse_config(argv)
    (tmp_path / "config.json").write_text(json.dumps(config))  # as train.py writes weights/<run>/config.json
    assert parse_config(["--config", str(tmp_path / "config.json")]) == config
    again = parse_config(["--config", str(tmp_path / "config.json"), "--seed", "8"])
    assert again == {**config, "seed": 8}
    # A file a user writes: TOML, flat or in tables named by the groups.
    (tmp_path / "mine.toml").write_text('datasource = "corpus"\n[model]\nd_model = 64\nnum_heads = 2\n'
                                        '[optimisation]\nlr = 1\n')
    mine = parse_config(["--config", str(tmp_path / "mine.toml")])
    assert (mine["datasource"], mine["d_model"], mine["num_heads"], mine["lr"]) == ("corpus", 64, 2, 1.0)


@pytest.mark.parametrize("name, text, message", [
    ("bad.json", '{"d_modle": 64}', "did you mean --d_model"),
    ("bad.json", '{"d_model": "wide"}', "'d_model' must be int"),
    ("bad.json", '{"d_model": ', "not valid JSON"), ("bad.json", '[1, 2]', "a table of keys"),
    # numbers that are not numbers, in JSON (which Python reads as NaN and Infinity) and TOML
    ("bad.json", '{"max_minutes": NaN}', "--max_minutes must be a finite number, >= 0, got nan"),
    ("bad.json", '{"optimisation": {"lr": Infinity}}', "--lr must be a finite number, > 0, got inf"),
    ("bad.toml", "max_minutes = nan\n", "--max_minutes must be a finite number"),
    ("bad.toml", "[run]\nmax_minutes = inf\n", "--max_minutes must be a finite number"),
    ("bad.toml", "[serving]\nserve_drain_grace_s = inf\n", "--serve_drain_grace_s must be a finite number"),
    # a key under another group's table, or given twice
    ("bad.toml", "[model]\nd_model = 64\n[run]\nd_model = 128\n", "d_model belongs in [model], not in [run]"),
    ("bad.toml", "d_model = 64\n[model]\nd_model = 128\n", "d_model is given twice (at the top level and in [model])"),
    ("bad.json", '{"model": {"d_model": 64}, "d_model": 128}', "d_model is given twice (in [model] and at the top"),
    ("bad.json", '{"d_model": 64, "d_model": 128}', "d_model is given twice in one table"),
    ("bad.json", '{"model": {"lr": 1}}', "lr belongs in [optimisation], not in [model]"),
])
def test_a_bad_config_file_is_one_line_naming_the_file(tmp_path: Path, capsys: pytest.CaptureFixture, name: str,
                                                       text: str, message: str) -> None:
    (tmp_path / name).write_text(text)
    with pytest.raises(SystemExit) as stop:
        parse_config(["--config", str(tmp_path / name)])
    lines = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(lines) == 1
    assert name in lines[0] and message in lines[0]


@pytest.mark.parametrize("argv, message", [(["--max_minutes", "inf"], "--max_minutes must be a finite number"),
                                           (["--max_minutes", "nan"], "--max_minutes must be a finite number"),
                                           (["--max_minutes=-inf"], "--max_minutes must be a finite number"),
                                           (["--lr", "nan"], "--lr must be a finite number"),
                                           (["--dropout", "NaN"], "--dropout must be a finite number"),
                                           (["--serve_request_timeout_s", "inf"], "--serve_request_timeout_s must be")])
def test_numbers_that_are_not_numbers_are_one_line_naming_the_option(capsys: pytest.CaptureFixture, argv: list[str],
                                                                     message: str) -> None:
    program = "serve" if argv[0].startswith("--serve") else "train"
    with pytest.raises(SystemExit) as stop:
        parse_config(argv, program)
    lines = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(lines) == 1 and message in lines[0]


def test_a_range_admits_infinity_only_where_a_closed_bound_names_it() -> None:
    assert not Range(0).admits(math.nan) and not Range(0).admits(math.inf) and Range(0).admits(1e308)
    assert not Range(0, 1).admits(math.nan) and not Range(None, 0).admits(-math.inf)
    assert Range(0, math.inf).admits(math.inf) and not Range(0, math.inf, high_open=True).admits(math.inf)


@pytest.mark.parametrize("name", ["mine.json", "mine.toml"])
def test_a_config_file_saved_with_a_byte_order_mark_is_read(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                            name: str) -> None:
    text = '{"d_model": 64, "num_heads": 2}' if name.endswith(".json") else "[model]\nd_model = 64\nnum_heads = 2\n"
    (tmp_path / name).write_bytes(b"\xef\xbb\xbf" + text.encode("utf-8"))
    assert parse_config(["--config", str(tmp_path / name)])["d_model"] == 64
    (tmp_path / name).write_bytes(text.encode("utf-16"))  # Notepad's "Unicode"
    with pytest.raises(SystemExit):
        parse_config(["--config", str(tmp_path / name)])
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and f"--config {tmp_path / name} is not UTF-8 text (byte 0): it is UTF-16" in lines[0]


def run_layout(config: dict, given: list[str], preset: str | None, **more: object) -> str:
    """A run's config.json as train.py writes it, by hand."""
    return json.dumps({"config": config, "given": given, "preset": preset,
                       "decided": {"num_layers": {"value": 2, "by": "the plan: a CPU too slow for the epochs"},
                                   "length_ratio": {"value": 1.1, "by": "the training data"}}, **more})


def test_a_runs_config_json_gives_only_its_given_keys_and_its_presets(tmp_path: Path) -> None:
    config = parse_config(["--preset", "cpu", "--datasource", "data/tatoeba", "--seed", "7", "--d_model", "128"])
    path = tmp_path / "config.json"
    path.write_text(run_layout(config, ["datasource", "seed", "d_model"], "cpu"))
    args, resolved = parse_args("train", ["--config", str(path)])
    # "config"'s values, none of "decided"'s: the run decides again
    assert resolved.config == config and resolved.config["num_layers"] == 3 and resolved.config["length_ratio"] == 0
    assert resolved.given == {"datasource", "seed", "d_model"}
    assert resolved.preset == set(PRESETS["cpu"]) - {"d_model"}
    # options given here win and count as given; a --preset here is the preset
    _, again = parse_args("train", ["--config", str(path), "--num_layers", "2", "--preset", "tiny"])
    assert again.given == {"datasource", "seed", "d_model", "num_layers"}
    assert again.preset == set(PRESETS["tiny"]) - again.given and again.config["lr"] == PRESETS["tiny"]["lr"]
    assert (again.config["d_model"], again.config["num_layers"]) == (PRESETS["tiny"]["d_model"], 2)
    path.write_text(run_layout(config, [], None))
    assert parse_args("train", ["--config", str(path)])[1].preset == set()


@pytest.mark.parametrize("change, message", [
    ({"gven": []}, "unknown key 'gven' in a run's config.json (its keys: config, given, preset, decided); did you "
                   "mean given?"),
    ({"given": ["seed", "surprise"]}, "'given' names 'surprise', which 'config' does not hold"),
    ({"given": "seed"}, "'given' must be the list of the keys"),
    ({"preset": "huge"}, "'preset' must be one of base, big, cpu, tiny or null, got 'huge'"),
    ({"config": {"d_modle": 64}, "given": []}, "unknown key 'd_modle'; did you mean --d_model?"),
    ({"config": {"lr": math.nan}, "given": []}, "--lr must be a finite number"),
    ({"decided": [1]}, "'decided' must be a table"),
])
def test_a_bad_runs_config_json_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture, change: dict,
                                            message: str) -> None:
    data = json.loads(run_layout({"seed": 7}, ["seed"], "cpu"))
    (tmp_path / "config.json").write_text(json.dumps({**data, **change}))
    with pytest.raises(SystemExit):
        parse_config(["--config", str(tmp_path / "config.json")])
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], lines


def test_print_config_prints_the_resolved_config(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as stop:
        parse_config(["--preset", "tiny", "--seed", "3", "--print_config"])
    assert stop.value.code == 0
    assert json.loads(capsys.readouterr().out) == parse_config(["--preset", "tiny", "--seed", "3"])


@pytest.mark.parametrize("program", PROGRAMS)
def test_each_program_takes_and_explains_exactly_the_keys_it_uses(program: str) -> None:
    parser = PARSERS[program]()
    flags = {action.option_strings[-1][2:]: action for action in parser._actions if action.option_strings}
    used = {key for key, option in OPTIONS.items() if program in option.programs}
    assert used <= set(flags)
    assert not (set(OPTIONS) - used) & set(flags), "a key this program has no use for"
    for name, action in flags.items():
        assert action.help and action.help != "==SUPPRESS==", name
        if name in OPTIONS:
            assert OPTIONS[name].help in action.help and "(default: " in action.help
            if OPTIONS[name].choices:
                assert action.metavar == "{" + ",".join(map(str, OPTIONS[name].choices)) + "}"
    if program == "translate":
        assert len(flags) <= 45  # -h included


def test_help_shows_groups_and_no_foreign_flag() -> None:
    text = " ".join(translate.argument_parser().format_help().split())
    assert "decoding: how text is segmented and translations are searched" in text and "--beam_size INT beam width; 1: greedy search" in text
    for foreign in ("--adam_beta1", "--serve_drain_grace_s", "--lr ", "--preset", "optimisation:"):
        assert foreign not in text
    assert "--serve_max_queued_work" in serve.argument_parser().format_help()
    assert "--serve_max_queued_work" not in train.argument_parser().format_help()


@pytest.mark.parametrize("program, argv, message", [
    ("translate", ["--beam", "5"], "did you mean --beam_size?"),
    ("translate", ["--adam_beta1", "0.9"], "has no use for --adam_beta1 (train.py takes it)"),
    ("train", ["--lr_sheduler", "cosine"], "did you mean --lr_schedule?"),
    ("serve", ["--warmup_steps", "4"], "has no use for --warmup_steps (train.py takes it)"),
])
def test_an_unknown_flag_names_the_closest_or_the_program_that_takes_it(
        capsys: pytest.CaptureFixture, program: str, argv: list[str], message: str) -> None:
    with pytest.raises(SystemExit) as stop:
        PARSERS[program]().parse_args(argv)
    lines = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(lines) == 1 and message in lines[0]


def run_folder(root: Path, *names: str) -> str:
    for name in names:
        (root / name).mkdir(parents=True)
        (root / name / "config.json").write_text("{}")
    return str(root)


def resolved_for(model_folder: str, *argv: str, program: str = "translate") -> Resolved:
    return parse_args(program, [*argv, "--model_folder", model_folder])[1]


def test_with_no_run_named_the_only_run_is_used_and_said(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    folder = run_folder(tmp_path / "weights", "mine_en-it")
    (tmp_path / "weights" / "not_a_run").mkdir()
    resolved = resolved_for(folder)
    assert choose_run(resolved) == "mine_en-it" and resolved.config["experiment_name"] == "mine_en-it"
    assert "using the only run" in capsys.readouterr().err
    # Named runs win: by name, or by the datasource and pair train.py named it from.
    assert choose_run(resolved_for(folder, "--experiment_name", "other")) == "other"
    assert choose_run(resolved_for(folder, "--datasource", "data/tatoeba")) == "tatoeba_en-it"
    # evaluate.py's --datasource is the data to score: one that names no run is scored with the only run.
    assert choose_run(resolved_for(folder, "--datasource", "flores", program="evaluate"), fall_back=True) == \
        "mine_en-it"


def recorded_run(root: Path, name: str, datasource: str, lang_src: str, lang_tgt: str, layout: bool = False) -> str:
    """A run folder whose config.json records what it translates: flat, or in train.py's new layout."""
    values = {**get_config(), "datasource": datasource, "lang_src": lang_src, "lang_tgt": lang_tgt}
    (root / name).mkdir(parents=True)
    (root / name / "config.json").write_text(json.dumps(
        {"config": values, "given": ["datasource"], "preset": "cpu", "decided": {}} if layout else values))
    return str(root)


def test_a_flag_that_matches_the_only_run_finds_it(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    folder = recorded_run(tmp_path / "weights", "tatoeba_en-it", "data/tatoeba", "en", "it")
    for argv in (["--lang_src", "en"], ["--lang_tgt", "it"], ["--datasource", str(ROOT / "data" / "tatoeba") + "/"],
                 ["--lang_src", "en", "--datasource", "data/tatoeba"]):
        assert choose_run(resolved_for(folder, *argv)) == "tatoeba_en-it", argv
    assert capsys.readouterr().err.count("using the only run under") == 2  # the others name it as train.py did
    # evaluate.py: the languages must agree; its --datasource is the data to score
    assert choose_run(resolved_for(folder, "--lang_src", "en", "--datasource", "flores", program="evaluate"),
                      fall_back=True) == "tatoeba_en-it"
    mine = recorded_run(tmp_path / "new", "mine", "corpus", "en", "fr", layout=True)
    assert choose_run(resolved_for(mine, "--lang_tgt", "fr")) == "mine"


@pytest.mark.parametrize("argv, program", [(["--lang_src", "fr"], "translate"),
                                           (["--lang_tgt", "de", "--datasource", "data/tatoeba"], "translate"),
                                           (["--datasource", "europarl"], "serve"),
                                           (["--lang_tgt", "fr", "--datasource", "flores"], "evaluate")])
def test_a_flag_that_disagrees_with_the_only_run_says_which_there_is(tmp_path: Path, argv: list[str],
                                                                      program: str) -> None:
    folder = recorded_run(tmp_path / "weights", "tatoeba_en-it", "data/tatoeba", "en", "it")
    with pytest.raises(ConfigError, match=r"no run under .*weights/ matches --.*: the only run there is "
                                          r"tatoeba_en-it \(en->it from data/tatoeba\)"):
        choose_run(resolved_for(folder, *argv, program=program), fall_back=program == "evaluate")


def test_among_several_runs_the_one_that_matches_is_used(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    root = tmp_path / "weights"
    recorded_run(root, "tatoeba_en-it", "data/tatoeba", "en", "it")
    folder = recorded_run(root, "tatoeba_en-fr", "data/tatoeba", "en", "fr", layout=True)
    assert choose_run(resolved_for(folder, "--lang_tgt", "fr")) == "tatoeba_en-fr"
    assert "the one run that matches --lang_tgt fr" in capsys.readouterr().err
    with pytest.raises(ConfigError, match=r"2 runs under .* match --lang_src en: name one with --experiment_name "
                                          r"\(tatoeba_en-fr \(en->fr from data/tatoeba\), tatoeba_en-it"):
        choose_run(resolved_for(folder, "--lang_src", "en"))
    with pytest.raises(ConfigError, match="no run under .* matches --lang_tgt de: the runs there are tatoeba_en-fr"):
        choose_run(resolved_for(folder, "--lang_tgt", "de"))


def test_several_runs_or_none_is_one_line_listing_them(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="2 runs under .*: name one with --experiment_name \\(a_en-it, b_en-it\\)"):
        choose_run(resolved_for(run_folder(tmp_path / "two", "a_en-it", "b_en-it")))
    with pytest.raises(ConfigError, match="no trained run under"):
        choose_run(resolved_for(str(tmp_path / "none")))


def test_docs_options_table_is_derived_from_the_schema() -> None:
    table = (ROOT / "docs" / "options.md").read_text(encoding="utf-8")
    assert options_table() in table, ("docs/options.md is out of date: regenerate its table with "
                                      "python -c 'import config; print(config.options_table())'")


def test_experiment_names_keep_pairs_and_datasources_apart(tmp_path: Path) -> None:
    base = get_config()
    en_it = experiment_name(base)
    en_fr = experiment_name({**base, "lang_tgt": "fr"})
    local = experiment_name({**base, "datasource": "data/tatoeba"})
    local_fr = experiment_name({**base, "datasource": "data/tatoeba/", "lang_tgt": "fr"})
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


# The cases run as `python train.py` processes, one refused by the parser and one by a relation
# between keys; the others call train.main in this process, with what it prints captured and its
# SystemExit taken as the exit code (another exception's traceback fails the test): the same code refuses
# them, and each process pays seconds of torch's import.
AS_PROCESSES = ("unknown key", "not divisible")


def train_main_as_a_process(argv: list[str]) -> subprocess.CompletedProcess:
    """train.main(argv) in this process: its exit code, stdout and stderr, as a process's."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = train.main(argv)
        except SystemExit as exit:
            code = exit.code if isinstance(exit.code, int) else 1
        except Exception:  # noqa: BLE001  (as the interpreter would report it)
            traceback.print_exc()
            code = 1
    return subprocess.CompletedProcess(["train.py", *argv], code, out.getvalue(), err.getvalue())


@pytest.fixture(scope="module")
def bad_runs(cli) -> dict:
    """`python train.py <bad options>` for each case of AS_PROCESSES, run concurrently (each pays
    torch's import); train.main on the others' options meanwhile."""
    with ThreadPoolExecutor(max_workers=len(AS_PROCESSES)) as pool:
        futures = {name: pool.submit(cli, "train.py", *BAD_COMMAND_LINES[name][0]) for name in AS_PROCESSES}
        runs = {name: train_main_as_a_process(argv) for name, (argv, _) in BAD_COMMAND_LINES.items()
                if name not in AS_PROCESSES}
        return runs | {name: future.result() for name, future in futures.items()}


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


def test_any_path_can_be_named_and_weights_are_bounded(tmp_path: Path) -> None:
    from config import corpus_entries, escape_source
    odd = tmp_path / "2024-01-01T10:00" / "a,b"
    odd.mkdir(parents=True)
    assert corpus_entries(str(odd)) == [(str(odd), 1.0, "")]  # an existing path is that path, whole
    mix = f"{escape_source(str(odd))}:2:<BT>,news:0.5"
    assert corpus_entries(mix) == [(str(odd), 2.0, "<BT>"), ("news", 0.5, "")]
    for weight in ("1e300", "1e7", "0", "nan"):
        with pytest.raises(ConfigError, match=f"the weight of 'news' must be above 0 and at most 100, got '{weight}'"):
            corpus_entries(f"news:{weight}")
    (tmp_path / "mix.toml").write_text(f'[[datasource]]\nsource = {json.dumps(str(odd))}\nweight = 2\ntag = "<BT>"\n'
                                       '[[datasource]]\nsource = "news"\n')
    assert corpus_entries(parse_config(["--config", str(tmp_path / "mix.toml")])["datasource"]) == \
        [(str(odd), 2.0, "<BT>"), ("news", 1.0, "")]
