"""ct2_model.py: the files beside CTranslate2's in a model directory, written and read back; the
compute type and CPU backend `auto` picks on each simulated CPU family, by rule or by a timing
(simulated here; tests/test_export.py times a real model), cached per machine."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from config import get_config
from nmt.inference import ct2_model
from nmt.inference.ct2_model import (ONEDNN, PROJECT_CONFIG, TIMINGS, CpuInfo, Rule, auto_rule, cpu_info, ct2_setup,
                       export_quantization, read_project_files, write_project_files)
from nmt.corpora.tokenizer import train_tokenizer


def test_project_files_round_trip_and_new_config_keys_take_their_defaults(tmp_path: Path) -> None:
    tok_src = train_tokenizer(["the cat sees the dog"], "wordlevel", 100, 1)
    tok_tgt = train_tokenizer(["il gatto vede il cane"], "wordlevel", 100, 1)
    config = dict(get_config(), seq_len=24)
    del config["beam_size"]  # a key added to the config after the export
    write_project_files(tmp_path, tok_src, tok_tgt, {"checkpoint": "ckpt.pt", "quantization": "int8",
                                                     "config": config})
    project, model_config, read_src, read_tgt = read_project_files(tmp_path)
    assert project["quantization"] == "int8" and model_config["seq_len"] == 24
    assert model_config["beam_size"] == get_config()["beam_size"]
    assert (read_src.to_str(), read_tgt.to_str()) == (tok_src.to_str(), tok_tgt.to_str())
    (tmp_path / PROJECT_CONFIG).write_text(json.dumps({"config": {**config, "seq_len": -1}}), encoding="utf-8")
    with pytest.raises(ValueError, match="seq_len"):
        read_project_files(tmp_path)


ZEN3 = CpuInfo("AuthenticAMD", "AMD EPYC 7B13", frozenset("fma avx f16c avx2".split()))
SKYLAKE = CpuInfo("GenuineIntel", "Intel(R) Xeon(R) Gold 6148", frozenset("avx2 avx512f avx512bw".split()))
ZEN4 = CpuInfo("AuthenticAMD", "AMD EPYC 9B14", frozenset("avx2 avx512f avx512_vnni avx512_bf16".split()))
CASCADE_LAKE = CpuInfo("GenuineIntel", "Intel(R) Xeon(R) 8280", frozenset("avx2 avx512f avx512_vnni".split()))
SAPPHIRE_RAPIDS = CpuInfo("GenuineIntel", "Intel(R) Xeon(R) 8481C", frozenset(
    "avx2 avx512f avx512_vnni avx512_bf16 amx_bf16 amx_tile amx_int8".split()))
GRAVITON = CpuInfo("", "", frozenset())  # aarch64's /proc/cpuinfo has "Features", no "flags"
OLD_X86 = CpuInfo("GenuineIntel", "Intel(R) Xeon(R) E5-2670", frozenset("sse4_2 avx".split()))
TIMED = Rule(("float32", "int8"), ONEDNN)


def simulate_timings(monkeypatch: pytest.MonkeyPatch, rates: dict[str, float], weights: list | None = None) -> list:
    """ct2_model.time_compute_types simulated with `rates`; returns the list of its calls (the types
    timed), and appends to `weights`, for each call, the weights each type would have run on."""
    calls = []

    def simulated(folders: dict[str, Path], threads: int) -> dict[str, float]:
        calls.append(tuple(folders))
        if weights is not None:
            weights.append({name: ct2_model.weights(folder) for name, folder in folders.items()})
        return {name: rates[name] for name in folders}

    monkeypatch.setattr(ct2_model, "time_compute_types", simulated)
    return calls


@pytest.fixture
def timings(monkeypatch: pytest.MonkeyPatch) -> list:
    """Simulated timings where int8 is the faster."""
    return simulate_timings(monkeypatch, {"float32": 300.0, "int8": 400.0})


def test_cpu_info_reads_vendor_model_and_flags(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\n"
                       "model name\t: AMD EPYC 9B14\nflags\t\t: fpu avx2 avx512f avx512_vnni\n\nprocessor\t: 1\n"
                       "flags\t\t: fpu\n")
    assert cpu_info(cpuinfo) == CpuInfo("AuthenticAMD", "AMD EPYC 9B14",
                                        frozenset("fpu avx2 avx512f avx512_vnni".split()), "family 25 model 17")
    assert cpu_info(tmp_path / "absent") == CpuInfo("", "", frozenset())


@pytest.mark.parametrize("info, family", [(ZEN3, "AVX2"), (SKYLAKE, "AVX-512"), (ZEN4, "AVX-512 VNNI/BF16"),
                                          (CASCADE_LAKE, "AVX-512 VNNI/BF16"), (SAPPHIRE_RAPIDS, "AMX"),
                                          (GRAVITON, "other"), (OLD_X86, "other")])
def test_a_cpu_family_is_what_its_flags_can_do(info: CpuInfo, family: str) -> None:
    assert info.family == family


@pytest.mark.parametrize("device, quantization, info, expected", [
    ("cuda", "float32", SAPPHIRE_RAPIDS, Rule(("float16",), {})),
    ("cuda", "int8", ZEN3, Rule(("int8_float16",), {})),
    ("cuda", "bfloat16", GRAVITON, Rule(("bfloat16",), {})),
    ("cpu", "int8", ZEN3, Rule(("int8",), ONEDNN)),  # int8 beat float32 on the Zen 3, greedy and beam 5
    ("cpu", "int8_float16", ZEN3, Rule(("int8",), ONEDNN)),
    ("cpu", "int8", SKYLAKE, TIMED),
    ("cpu", "int8", ZEN4, TIMED),  # int8 the faster on one day and model, float32 on another
    ("cpu", "int8", CASCADE_LAKE, TIMED),
    ("cpu", "int8", SAPPHIRE_RAPIDS, TIMED),  # float32 on oneDNN 302 sentences/s, int8 on MKL 173
    ("cpu", "float32", ZEN3, Rule(("float32",), ONEDNN)),  # float weights are never run as int8
    ("cpu", "float32", ZEN4, Rule(("float32",), ONEDNN)),
    ("cpu", "bfloat16", SAPPHIRE_RAPIDS, Rule(("float32",), ONEDNN)),
    ("cpu", "int16", SKYLAKE, Rule(("default",), {})),  # MKL's type
    ("cpu", "int8", GRAVITON, Rule(("default",), {})),
    ("cpu", "float32", OLD_X86, Rule(("default",), {})),
])
def test_auto_chooses_by_what_the_cpu_can_do(device: str, quantization: str, info: CpuInfo, expected: Rule) -> None:
    assert auto_rule(device, quantization, info) == expected


@pytest.mark.parametrize("info, expected", [(ZEN3, "int8"), (GRAVITON, "int8"), (ZEN4, None), (SKYLAKE, None),
                                            (SAPPHIRE_RAPIDS, None)])
def test_export_quantization_follows_the_same_rule(info: CpuInfo, expected: str | None) -> None:
    assert export_quantization(info) == expected


@pytest.mark.usefixtures("backend_env")
def test_a_fixed_rule_is_never_timed_and_sets_onednn(tmp_path: Path, timings: list) -> None:
    assert ct2_setup("auto", "cpu", "int8", tmp_path, 2, ZEN3) == "int8"
    assert os.environ["CT2_USE_MKL"] == "0" and timings == []
    assert ct2_setup("auto", "cpu", "float32", tmp_path, 2, ZEN4) == "float32"
    assert ct2_setup("auto", "cpu", "int8", tmp_path, 2, GRAVITON) == "default"
    assert ct2_setup("auto", "cuda", "int8", tmp_path, 2, SKYLAKE) == "int8_float16"
    assert timings == [] and not (tmp_path / TIMINGS).exists()


@pytest.mark.usefixtures("backend_env")
def test_a_user_backend_and_an_explicit_compute_type_hold(tmp_path: Path, timings: list,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    assert ct2_setup("float32", "cpu", "int8", tmp_path, 2, ZEN4) == "float32"
    assert "CT2_USE_MKL" not in os.environ and timings == []
    monkeypatch.setenv("CT2_USE_MKL", "1")
    assert ct2_setup("auto", "cpu", "int8", tmp_path, 2, ZEN3) == "int8"
    assert os.environ["CT2_USE_MKL"] == "1"


@pytest.mark.usefixtures("backend_env")
@pytest.mark.parametrize("info", [SKYLAKE, ZEN4, CASCADE_LAKE, SAPPHIRE_RAPIDS])
def test_where_the_rule_cannot_tell_the_faster_is_timed_once_per_machine(tmp_path: Path, timings: list,
                                                                         info: CpuInfo) -> None:
    assert ct2_setup("auto", "cpu", "int8", tmp_path, 2, info) == "int8"
    assert timings == [("float32", "int8")] and os.environ["CT2_USE_MKL"] == "0"
    [entry] = json.loads((tmp_path / TIMINGS).read_text(encoding="utf-8"))["machines"].values()
    assert entry["compute_type"] == "int8" and entry["family"] == info.family
    assert entry["sentences_per_s"] == {"float32": 300.0, "int8": 400.0}
    assert entry["weights"] == {"float32": "?", "int8": "?"}  # the folder holds no project.json
    assert ct2_setup("auto", "cpu", "int8", tmp_path, 2, info) == "int8" and len(timings) == 1  # cached
    ct2_setup("auto", "cpu", "int8", tmp_path, 1, info)  # another thread count: another machine
    ct2_setup("auto", "cpu", "int8", tmp_path, 2, CpuInfo(info.vendor, info.model, info.flags | {"sha_ni"}))
    assert len(timings) == 3 and len(json.loads((tmp_path / TIMINGS).read_text())["machines"]) == 3


@pytest.mark.usefixtures("backend_env")
def test_a_cached_choice_wins_over_a_new_timing(tmp_path: Path, timings: list) -> None:
    ct2_setup("auto", "cpu", "int8", tmp_path, 2, ZEN4)
    cache = json.loads((tmp_path / TIMINGS).read_text(encoding="utf-8"))
    [entry] = cache["machines"].values()
    entry["compute_type"] = "float32"  # as if float32 had been the faster when it was timed
    (tmp_path / TIMINGS).write_text(json.dumps(cache), encoding="utf-8")
    assert ct2_setup("auto", "cpu", "int8", tmp_path, 2, ZEN4) == "float32" and len(timings) == 1


@pytest.mark.usefixtures("backend_env")
@pytest.mark.parametrize("content", ["not json", "[]", '{"machines": []}', '{"machines": {"x": 1}}'])
def test_an_unreadable_cache_is_timed_again_and_replaced(tmp_path: Path, timings: list, content: str) -> None:
    (tmp_path / TIMINGS).write_text(content, encoding="utf-8")
    assert ct2_setup("auto", "cpu", "int8", tmp_path, 2, ZEN4) == "int8" and len(timings) == 1
    assert len(json.loads((tmp_path / TIMINGS).read_text(encoding="utf-8"))["machines"]) >= 1


@pytest.mark.usefixtures("backend_env")
def test_a_folder_that_cannot_be_written_still_gets_the_faster_type(tmp_path: Path, timings: list,
                                                                    capsys: pytest.CaptureFixture) -> None:
    missing = tmp_path / "gone"  # the cache's folder gone: the write fails as on a read-only one
    assert ct2_setup("auto", "cpu", "int8", missing, 2, ZEN4) == "int8"
    [line] = capsys.readouterr().err.splitlines()
    assert "float32 on ? weights 300.0, int8 on ? weights 400.0 sentences/s: int8, not cached" in line
    assert "timed again" in line
