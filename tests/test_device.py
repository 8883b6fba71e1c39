"""device.py: one rule for every program. auto picks CUDA, then MPS, then the CPU; a device that is
not there is one line and exit 2 in train.py, translate.py, evaluate.py, export-free programs alike."""
from __future__ import annotations

import pytest
import torch

import bench
import evaluate
import train
import translate
from config import ConfigError
from device import pick_device

pytestmark = pytest.mark.skipif(torch.cuda.is_available() or torch.backends.mps.is_available(),
                                reason="these cases need a machine without CUDA and MPS")


def test_auto_is_the_cpu_here_and_named_devices_must_exist() -> None:
    assert pick_device("auto") == torch.device("cpu") == pick_device("cpu")
    for missing in ("cuda", "mps"):
        with pytest.raises(ConfigError, match=f"--device {missing}: .* not available"):
            pick_device(missing)


@pytest.mark.parametrize("program, argv", [
    (train.main, ["--preset", "tiny"]),
    (translate.main, ["Hello."]),
    (evaluate.main, []),
    (bench.main, ["--quick"]),
])
@pytest.mark.parametrize("device", ["cuda", "mps"])
def test_every_program_refuses_a_missing_device_in_one_line(program, argv: list[str], device: str,
                                                            capsys: pytest.CaptureFixture, tmp_path) -> None:
    try:
        code = program([*argv, "--device", device, *([] if program is bench.main else
                                                     ["--model_folder", str(tmp_path), "--store_folder",
                                                      str(tmp_path)])])
    except SystemExit as stop:
        code = stop.code
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and f"--device {device}" in lines[0], lines
