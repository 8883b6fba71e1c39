"""precision.py: `--amp auto` by compute capability and CPU instructions, TF32 where the GPU has it,
resumes across any two `--amp` settings, and fp16 overflows that skip their step, are counted,
logged, and stop a run that keeps overflowing. Training runs for real under CPU autocast with `GradScaler("cpu")`."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from nmt import precision
import train
from nmt.training.checkpoint import load_latest
from config import parse_config, runs_dir, weights_dir


# ---------------------------------------------------------------------------- the rule

@pytest.mark.parametrize("capability, expected", [
    ((7, 0), torch.float16),  # V100
    ((7, 5), torch.float16),  # T4
    ((8, 0), torch.bfloat16),  # A100
    ((8, 6), torch.bfloat16),  # RTX 30xx
    ((9, 0), torch.bfloat16),  # H100
])
def test_auto_amp_is_bf16_only_where_the_gpu_has_it_natively(capability: tuple[int, int], expected: torch.dtype,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    # What torch says on every one of them: bf16 "supported", counting emulation.
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    assert precision.amp_dtype({"amp": "auto"}, torch.device("cuda", 0)) == expected
    assert precision.inference_dtype(torch.device("cuda", 0)) == expected  # what the PyTorch engine decodes in


@pytest.mark.parametrize("avx512_bf16, amx, expected", [
    (False, False, None),  # AVX2 or AVX-512 without BF16: bf16 would be emulated, slower than fp32
    (True, False, torch.bfloat16),  # AMD Zen 4
    (False, True, torch.bfloat16),  # Intel with AMX
])
def test_auto_amp_on_the_cpu_is_bf16_only_with_bf16_instructions(avx512_bf16: bool, amx: bool,
                                                                 expected: torch.dtype | None,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    cpu = torch.device("cpu")
    assert precision.amp_dtype({"amp": "auto"}, cpu) == expected
    assert precision.inference_dtype(cpu) is None  # decoding on a CPU stays fp32
    assert precision.amp_dtype({"amp": "off"}, cpu) is None


def test_auto_amp_is_off_on_mps_and_explicit_choices_hold_everywhere() -> None:
    assert precision.amp_dtype({"amp": "auto"}, torch.device("mps")) is None
    for device in (torch.device("cpu"), torch.device("mps")):
        assert precision.inference_dtype(device) is None
        assert precision.amp_dtype({"amp": "fp16"}, device) == torch.float16
        assert precision.amp_dtype({"amp": "bf16"}, device) == torch.bfloat16
    cpu = torch.device("cpu")
    assert precision.grad_scaler(cpu, torch.float16).is_enabled()
    assert not precision.grad_scaler(cpu, torch.bfloat16).is_enabled()
    assert not precision.grad_scaler(cpu, None).is_enabled()


@pytest.mark.parametrize("capability, tf32", [((7, 5), False), ((8, 0), True), ((9, 0), True)])
def test_tf32_only_on_cuda_gpus_that_have_it(capability: tuple[int, int], tf32: bool,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)  # restored afterwards
    assert precision.allow_tf32(torch.device("cpu")) is False
    assert torch.backends.cuda.matmul.allow_tf32 is False and torch.backends.mkldnn.matmul.fp32_precision == "none"
    assert precision.allow_tf32(torch.device("cuda", 0)) is tf32
    assert torch.backends.cuda.matmul.allow_tf32 is tf32
    assert torch.backends.mkldnn.matmul.fp32_precision == "none", "the CPU's products stay fp32"


# ---------------------------------------------------------------------------- real runs

def resumable_copy(trained_run, tmp_path: Path) -> list[str]:
    """Options that resume a copy of the tiny trained run (step 60, fp32) in tmp_path."""
    shutil.copytree(trained_run.model_folder, tmp_path / "weights")
    args = list(trained_run.args)
    args[args.index("--model_folder") + 1] = str(tmp_path / "weights")
    args[args.index("--runs_folder") + 1] = str(tmp_path / "runs")
    return args + ["--val_max_sentences", "1", "--num_examples", "0", "--log_every", "1"]


def newest(args: list[str]) -> dict:
    _, state = load_latest(weights_dir(parse_config(args)))
    return state


def test_a_run_resumes_across_any_change_of_amp(trained_run, tmp_path: Path,
                                                capsys: pytest.CaptureFixture) -> None:
    args = resumable_copy(trained_run, tmp_path)
    step = trained_run.SECOND_MAX_STEPS
    # fp32 -> fp16 -> bf16 -> fp16 -> fp32: each direction of a scaler appearing or going away.
    for amp, note in [("fp16", "the checkpoint has no fp16 loss scale: starting a fresh one at 65536"),
                      ("bf16", "dropping the checkpoint's fp16 loss scale (65536): this run does not use fp16"),
                      ("fp16", "the checkpoint has no fp16 loss scale"),
                      ("off", "dropping the checkpoint's fp16 loss scale")]:
        before = newest(args)
        assert train.main(args + ["--amp", amp, "--max_steps", str(step + 1)]) == 0, amp
        err = capsys.readouterr().err
        assert f"step {step})" in err and note in err, err
        assert "Traceback" not in err
        state = newest(args)
        assert state["global_step"] == step + 1 and state["config"]["amp"] == amp
        assert state["scheduler"]["last_epoch"] == before["scheduler"]["last_epoch"] + 1, "the step was applied"
        assert bool(state["scaler"]) == (amp == "fp16")
        step += 1


def test_fp16_overflows_skip_their_step_are_counted_logged_and_stop_the_run(
        trained_run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    args = resumable_copy(trained_run, tmp_path)
    before = newest(args)
    # A loss scale no fp16 gradient survives: every step overflows, for real, until the scale is
    # down to about 2**16, which takes far more steps than --max_nonfinite_steps allows.
    monkeypatch.setattr(precision, "INITIAL_SCALE", 2.0 ** 40)
    start = trained_run.SECOND_MAX_STEPS
    code = train.main(args + ["--amp", "fp16", "--max_steps", str(start + 20), "--max_nonfinite_steps", "3"])
    err = capsys.readouterr().err
    assert code == 1, err
    assert f"step {start + 1}: non-finite loss or gradient, step skipped (1 in a row); the fp16 loss scale is " \
           f"halved" in err
    assert err.strip().splitlines()[-1] == f"stopped after 3 non-finite steps in a row at step {start + 3}; the " \
                                          f"checkpoint holds the last good weights (try a lower --lr or --amp off)"
    state = newest(args)
    assert state["global_step"] == start + 3
    assert state["scheduler"]["last_epoch"] == before["scheduler"]["last_epoch"], "skipped steps keep the schedule"
    assert state["optimizer"]["param_groups"][0]["lr"] == before["optimizer"]["param_groups"][0]["lr"]
    assert state["scaler"]["scale"] == 2.0 ** 37, "halved at each overflow"
    for name, tensor in state["model"].items():
        assert torch.equal(tensor, before["model"][name]), f"{name} changed by a skipped step"
    events = EventAccumulator(str(runs_dir(parse_config(args))), size_guidance={"scalars": 0})
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("train/skipped_steps")] == \
        [(start + 1, 1.0), (start + 2, 1.0), (start + 3, 1.0)]
    assert [e.value for e in events.Scalars("train/loss_scale")] == [2.0 ** 39, 2.0 ** 38, 2.0 ** 37]


def test_autocast_for_captured_work_keeps_no_cast_weights() -> None:
    """CUDA graphs' capture wants autocast's cache off (cuda_graphs.py); everything else keeps it."""
    cpu = torch.device("cpu")
    with precision.autocast_context(cpu, torch.bfloat16):
        assert torch.is_autocast_enabled("cpu") and torch.is_autocast_cache_enabled()
    with precision.autocast_context(cpu, torch.bfloat16, cache=False):
        assert torch.is_autocast_enabled("cpu") and not torch.is_autocast_cache_enabled()
