"""device.py: one rule for every program. auto picks CUDA, then MPS, then the CPU; a device that is
not there is one line and exit 2 in train.py, translate.py, evaluate.py, export-free programs alike;
an NVIDIA GPU that torch cannot use is named, with the likely cause, in one line."""
from __future__ import annotations

import re

import pytest
import torch

from nmt import device
import evaluate
import train
import translate
from benchmarks import bench
from config import ConfigError
from nmt.device import pick_device

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
        folders = {bench.main: [], translate.main: ["--model_folder", str(tmp_path)]}.get(
            program, ["--model_folder", str(tmp_path), "--store_folder", str(tmp_path)])
        code = program([*argv, "--device", device, *folders])
    except SystemExit as stop:
        code = stop.code
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and f"--device {device}" in lines[0], lines


# ---------------------------------------------------------------------------- a GPU torch cannot use

DRIVER = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023\n"


@pytest.fixture
def nvidia_driver(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """This machine as one with an NVIDIA driver: the file its kernel module writes."""
    version = tmp_path / "nvidia-version"
    version.write_text(DRIVER)
    monkeypatch.setattr(device, "NVIDIA_DRIVER_VERSION", version)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    device.warn_unusable_gpu.cache_clear()  # said once per process
    yield
    device.warn_unusable_gpu.cache_clear()


@pytest.mark.parametrize("cuda_version, visible, cause", [
    (None, None, "torch .* is a CPU-only build"),
    ("13.0", None, "driver 535.104.05 is likely too old for CUDA 13.0, which this torch was built for"),
    ("13.0", "", "torch .* sees none: CUDA_VISIBLE_DEVICES='' may hide it"),
])
def test_auto_names_an_nvidia_gpu_that_torch_cannot_use(nvidia_driver, cuda_version: str | None, visible: str | None,
                                                        cause: str, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setattr(torch.version, "cuda", cuda_version)
    if visible is not None:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert pick_device("auto") == pick_device("auto") == torch.device("cpu")
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and re.fullmatch(f"warning: this machine has an NVIDIA GPU, but .*{cause}.*; running "
                                            f"on the CPU", lines[0]), lines
    with pytest.raises(ConfigError, match=f"^--device cuda: CUDA is not available: .*{cause}"):
        pick_device("cuda")


def test_every_program_names_the_unused_gpu(nvidia_driver, tmp_path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as stop:  # no run to translate with: the second line
        translate.main(["Hello.", "--model_folder", str(tmp_path / "none")])
    assert stop.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("warning: this machine has an NVIDIA GPU") and len(lines) == 2, lines


def test_no_word_without_an_nvidia_driver(tmp_path, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setattr(device, "NVIDIA_DRIVER_VERSION", tmp_path / "absent")
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi either
    device.warn_unusable_gpu.cache_clear()
    assert pick_device("auto") == torch.device("cpu")
    assert capsys.readouterr().err == ""
    with pytest.raises(ConfigError, match=r"^--device cuda: CUDA is not available \(use --device cpu or auto\)$"):
        pick_device("cuda")


def test_cuda_takes_attention_off_cudnn_whose_plans_are_built_per_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    """On an H200, cuDNN's attention made a training step of a new shape cost 342 ms instead of 40
    (benchmarks/bench_new_shapes.py, docs/speed.md): CUDA leaves it out; the CPU touches nothing."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    torch.backends.cuda.enable_cudnn_sdp(True)
    try:
        assert pick_device("cpu") == torch.device("cpu") and torch.backends.cuda.cudnn_sdp_enabled()
        assert pick_device("cuda", 1) == torch.device("cuda", 1)
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        assert torch.backends.cuda.flash_sdp_enabled() and torch.backends.cuda.mem_efficient_sdp_enabled()
    finally:
        torch.backends.cuda.enable_cudnn_sdp(True)
