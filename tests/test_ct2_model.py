"""ct2_model.py: the files beside CTranslate2's in a model directory, written and read back, and the
fixed rule that picks a model's compute type and CPU backend per machine."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from config import get_config
from ct2_model import PROJECT_CONFIG, ct2_setup, read_project_files, write_project_files
from tokenizer import train_tokenizer


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


@pytest.mark.parametrize("device, quantization, family, expected", [
    ("cuda", "float32", ("GenuineIntel", True), ("float16", {})),
    ("cuda", "int8", ("AuthenticAMD", False), ("int8_float16", {})),
    ("cuda", "bfloat16", ("", False), ("bfloat16", {})),
    ("cpu", "int8", ("GenuineIntel", True), ("float32", {"CT2_USE_MKL": "0"})),  # 302 against 173 sentences/s
    ("cpu", "float32", ("GenuineIntel", True), ("float32", {"CT2_USE_MKL": "0"})),
    ("cpu", "int8", ("AuthenticAMD", False), ("default", {})),  # int8 on oneDNN, 3.4x the PyTorch engine
    ("cpu", "int8", ("AuthenticAMD", True), ("default", {})),
    ("cpu", "float32", ("GenuineIntel", False), ("default", {})),
])
def test_the_default_set_up_is_a_fixed_rule_per_machine(device: str, quantization: str, family: tuple[str, bool],
                                                         expected: tuple[str, dict]) -> None:
    assert ct2_setup("auto", device, quantization, family) == expected
    assert ct2_setup("int16", device, quantization, family) == ("int16", {})  # an explicit choice holds
