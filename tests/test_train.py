"""train.py end to end on a tiny Hub-layout corpus written by the tests: train, checkpoint,
resume where it stopped, log to TensorBoard, score like sacrebleu, translate; and the refusals
(another architecture, --preload new over checkpoints, an unreachable Hub)."""
from __future__ import annotations

import json
import os
import re
import socket
import time
from collections import defaultdict
from pathlib import Path

import pytest
import sacrebleu
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
from torch.utils.tensorboard import SummaryWriter

from nmt.corpora import sources
import train
from nmt.training.checkpoint import MANIFEST, checkpoint_name, load_checkpoint, load_for_inference, load_latest
from config import TRAIN, parse_args, parse_config, runs_dir, validate_config, weights_dir
from nmt.corpora.store import text_store, token_store
from synthetic_data import synthetic_pairs, write_hub_dataset, write_parallel_files
from nmt.inference.decoding import repeat_free_ngram_size
from nmt.training.loss import loss_sum
from nmt.training.resume import check_resumable
from nmt.training.schedule import Schedule
from nmt.training.validation import run_validation, validation_subset
from nmt.inference.scoring import corpus_scores
from nmt.corpora.tokenizer import PAD_ID, tokenizer_from_json
from nmt.inference.translator import DecodingOptions, TorchTranslator

SCALARS = {"train/loss", "train/lr", "train/tokens_per_second", "train/skipped_steps", "val/loss", "val/bleu",
           "val/chrf", "val/bleu_nrefs1", "val/chrf_nrefs1", "val/cer", "val/wer"}


def steps_per_epoch(stderr: str) -> int:
    return int(re.search(r"(\d+) steps per epoch", stderr).group(1))


def error_lines(stderr: str) -> list[str]:
    return stderr.strip().splitlines()


def test_first_run_stops_at_max_steps_with_a_checkpoint(trained_run) -> None:
    run = trained_run
    state = run.first_state
    assert state["global_step"] == run.FIRST_MAX_STEPS
    assert run.first_manifest["latest"] == checkpoint_name(run.FIRST_MAX_STEPS)
    assert 0 < state["step_in_epoch"] < steps_per_epoch(run.first.stderr), "premise: the run stopped mid-epoch"
    assert f"reached --max_steps {run.FIRST_MAX_STEPS}" in run.first.stderr
    assert "train: skipped 2 of 202 rows" in run.first.stderr
    # everything a resume needs, as plain data
    assert {"model", "optimizer", "scheduler", "epoch", "batches_done", "step_in_epoch", "global_step",
            "batch_settings", "config", "tokenizers", "metrics"} <= set(state)
    config = dict(state["config"])
    validate_config(config)
    # length_ratio: target over source tokens of the training pairs, both counting [EOS]
    tok_src, tok_tgt = tokenizer_from_json(state["tokenizers"]["src"]), tokenizer_from_json(state["tokenizers"]["tgt"])
    pairs = synthetic_pairs(200, 1)
    source_tokens = sum(len(tok_src.encode(s, add_special_tokens=False).ids) + 1 for s, _ in pairs)
    target_tokens = sum(len(tok_tgt.encode(t, add_special_tokens=False).ids) + 1 for _, t in pairs)
    length_ratio = round(target_tokens / source_tokens, 4)
    assert f"length_ratio {length_ratio}:" in run.first.stderr
    assert config == {**run.config, "max_steps": run.FIRST_MAX_STEPS, "length_ratio": length_ratio}
    assert state["decided"] == {"length_ratio": {"value": length_ratio, "by": "the training data"}}
    # tokenizers and the run's config sit beside the checkpoints: what was given (the second run's
    # command line), apart from what the run decided
    record = json.loads((run.folder / "config.json").read_text())
    assert record["config"]["max_steps"] == run.SECOND_MAX_STEPS and record["config"]["length_ratio"] == 0
    assert "max_steps" in record["given"] and record["decided"] == state["decided"] and record["preset"] == "tiny"
    # --config of it gives the run's config again, its given keys given and its preset's the preset's
    again = parse_args(TRAIN, ["--config", str(run.folder / "config.json")])[1]
    assert again.config == record["config"] and again.given == set(record["given"]) and again.preset_name == "tiny"
    assert (run.folder / "tokenizer_en.json").read_text() == state["tokenizers"]["src"]
    assert (run.folder / "tokenizer_it.json").read_text() == state["tokenizers"]["tgt"]
    assert set(state["metrics"]) == {"loss", "bleu", "chrf", "bleu_nrefs1", "chrf_nrefs1", "cer", "wer"}  # validated


def test_resume_continues_the_global_step_schedule_and_epoch(trained_run) -> None:
    run = trained_run
    path, state = run.latest()
    assert path.name == checkpoint_name(run.SECOND_MAX_STEPS)
    assert state["global_step"] == run.SECOND_MAX_STEPS
    first = run.first_state
    assert (f"resuming from {run.folder / checkpoint_name(run.FIRST_MAX_STEPS)} (epoch {first['epoch']}, "
            f"step {run.FIRST_MAX_STEPS})") in run.second.stderr
    per_epoch = steps_per_epoch(run.second.stderr)
    assert per_epoch == steps_per_epoch(run.first.stderr)
    # the resumed run finished the interrupted epoch instead of starting a new one
    assert state["epoch"] * per_epoch + state["step_in_epoch"] == run.SECOND_MAX_STEPS
    assert state["scheduler"]["last_epoch"] == run.SECOND_MAX_STEPS
    assert {int(s["step"]) for s in state["optimizer"]["state"].values()} == {run.SECOND_MAX_STEPS}
    assert state["tokenizers"] == first["tokenizers"]
    assert len(list(run.folder.glob("ckpt_*.pt"))) <= run.config["keep_checkpoints"] + 1
    # the resumed run read neither the datasource nor tokenized again: the stores were reused
    assert "building the data store" in run.first.stderr and "tokenizing into" in run.first.stderr
    assert "building the data store" not in run.second.stderr and "tokenizing into" not in run.second.stderr


def test_tensorboard_holds_every_scalar_and_no_step_twice(trained_run) -> None:
    run = trained_run
    events = EventAccumulator(str(run.runs), size_guidance={"scalars": 0})
    events.Reload()
    assert SCALARS <= set(events.Tags()["scalars"])
    assert "val/examples/text_summary" in events.Tags()["tensors"]

    files = sorted(run.runs.glob("events.out.tfevents.*"))
    assert len(files) == 2  # one per run
    steps: dict[str, list[int]] = defaultdict(list)
    for file in files:
        for event in EventFileLoader(str(file)).Load():
            for value in event.summary.value:
                steps[value.tag].append(event.step)
    for tag, logged in steps.items():
        assert len(logged) == len(set(logged)), f"{tag} logged twice at one step"
    assert sorted(steps["train/loss"]) == list(range(2, run.SECOND_MAX_STEPS + 1, 2))  # log_every 2, both runs
    assert {run.FIRST_MAX_STEPS, run.SECOND_MAX_STEPS} <= set(steps["val/bleu"])
    losses = [e.value for e in events.Scalars("train/loss")]
    assert losses[-1] < losses[0]  # it trains


def test_pipeline_bleu_equals_sacrebleu_on_its_own_outputs(trained_run) -> None:
    run = trained_run
    path, state = run.latest()
    translator = TorchTranslator.load(path, run.folder, torch.device("cpu"))
    config = translator.model_config
    validation = text_store(config).pairs("validation")
    sources, references = [s for s, _ in validation], [t for _, t in validation]
    hypotheses = translator.translate_best(sources, DecodingOptions.from_config(config,
                                                                            beam_size=config["val_beam_size"]))
    # these are the outputs the run produced: its last printed examples
    printed = [line[len("OUTPUT: "):] for line in run.second.stdout.splitlines() if line.startswith("OUTPUT: ")]
    assert printed[-config["num_examples"]:] == hypotheses[:config["num_examples"]]
    assert state["metrics"]["bleu"] == sacrebleu.corpus_bleu(hypotheses, [references]).score > 5  # it learned
    assert state["metrics"]["chrf"] == sacrebleu.corpus_chrf(hypotheses, [references]).score
    events = EventAccumulator(str(run.runs), size_guidance={"scalars": 0})
    events.Reload()
    logged = {e.step: e.value for e in events.Scalars("val/bleu")}
    assert logged[run.SECOND_MAX_STEPS] == pytest.approx(state["metrics"]["bleu"], rel=1e-6, abs=1e-6)


def test_validation_scores_raw_text_and_teacher_forced_loss(trained_run, monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    """With known hypotheses (some right, some not), the pipeline's numbers equal sacrebleu's on
    the raw references, and its loss equals the per-sentence cross-entropy. A source given twice
    with two references is decoded once; BLEU and chrF score it once against both (sacreBLEU's
    multi-reference score), the line-by-line scores once per line."""
    run = trained_run
    path, _ = run.latest()
    model, tok_src, tok_tgt, config, _ = load_for_inference(path, run.folder, torch.device("cpu"))
    text = text_store(config)
    split = text.pairs("validation")
    pairs = split + [(split[1][0], "Un altro riferimento."), (split[4][0], split[4][1])]
    sources = list(dict.fromkeys(s for s, _ in pairs))
    assert len(sources) == len(split)
    fixed = {s: t if i % 3 == 0 else " ".join(t.split()[:-1]) + "." if i % 3 == 1 else "Il gatto."
             for i, (s, t) in enumerate(split)}
    seen_sources = []

    def fixed_translations(translator, sentences, options):
        seen_sources.extend(sentences)
        return [fixed[s] for s in sentences]

    monkeypatch.setattr(TorchTranslator, "translate_best", fixed_translations)
    val_ds = token_store(config, text, tok_src, tok_tgt).dataset("validation")
    writer = SummaryWriter(str(tmp_path))
    metrics = run_validation(model, val_ds, pairs, tok_src, tok_tgt, config, torch.device("cpu"), writer, 77)
    writer.close()
    assert seen_sources == sources
    lines = [fixed[s] for s, _ in pairs]
    references = [t for _, t in pairs]
    expected = corpus_scores(lines, references)
    assert metrics["bleu_nrefs1"] == sacrebleu.corpus_bleu(lines, [references]).score
    assert metrics["chrf_nrefs1"] == sacrebleu.corpus_chrf(lines, [references]).score
    assert (metrics["cer"], metrics["wer"]) == (expected["cer"], expected["wer"])
    # The second stream holds the repeated sources' second references, None elsewhere.
    second = [dict(pairs[len(split):]).get(s) for s in sources]
    streams = [[t for _, t in split], second]
    assert metrics["bleu"] == sacrebleu.corpus_bleu([fixed[s] for s in sources], streams).score
    assert metrics["chrf"] == sacrebleu.corpus_chrf([fixed[s] for s in sources], streams).score
    assert 0 < metrics["bleu"] < 100 and metrics["bleu"] != metrics["bleu_nrefs1"]
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    for name, value in metrics.items():
        [logged] = events.Scalars(f"val/{name}")
        assert logged.step == 77 and logged.value == pytest.approx(value, rel=1e-6, abs=1e-7)
    assert [e.step for e in events.Tensors("val/examples/text_summary")] == [77]
    assert [e.step for e in events.Images("val/attention")] == [77]  # the first example's heatmap
    assert f"BLEU {metrics['bleu']:.2f}" in capsys.readouterr().out

    total, tokens = 0.0, 0
    with torch.no_grad():
        for index in range(len(val_ds)):
            batch = val_ds.collate([index])
            logits = model(batch["encoder_input"], batch["decoder_input"], batch.get("src_mask"))
            total += float(loss_sum(logits, batch["label"], 0.0))
            tokens += int((batch["label"] != PAD_ID).sum())
    assert metrics["loss"] == pytest.approx(total / tokens, rel=1e-4)


def test_the_repeat_ban_is_picked_from_the_training_targets_unless_given(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture) -> None:
    """no_repeat_ngram_size -1 (the default): train.py picks the size from its training targets,
    says it, and stores it in the checkpoint's config, which translators read; a size given stays."""
    pairs = synthetic_pairs(200, 1)
    data = write_hub_dataset(tmp_path / "data", {"train": pairs, "validation": synthetic_pairs(8, 2)})
    args = ["--datasource", str(data), "--preset", "tiny", "--max_steps", "2", "--val_max_sentences", "2",
            "--confidence_sentences", "0", "--clean", "false", "--store_folder", str(tmp_path / "s"),
            "--runs_folder", str(tmp_path / "r")]
    assert train.main([*args, "--model_folder", str(tmp_path / "picked")]) == 0
    state = load_checkpoint(weights_dir(parse_config([*args, "--model_folder", str(tmp_path / "picked")])) /
                            checkpoint_name(2))
    tok_tgt = tokenizer_from_json(state["tokenizers"]["tgt"])
    limit = repeat_free_ngram_size([tok_tgt.encode(t, add_special_tokens=False).ids for _, t in pairs])
    assert limit >= 3 and state["config"]["no_repeat_ngram_size"] == limit
    assert f"no_repeat_ngram_size {limit}: the smallest n-gram size from 3" in capsys.readouterr().err
    assert train.main([*args, "--model_folder", str(tmp_path / "given"), "--no_repeat_ngram_size", "0"]) == 0
    given = load_checkpoint(weights_dir(parse_config([*args, "--model_folder", str(tmp_path / "given")])) /
                            checkpoint_name(2))
    assert given["config"]["no_repeat_ngram_size"] == 0 and "no_repeat_ngram_size" not in capsys.readouterr().err


def test_translate_prints_the_translation_on_stdout(trained_run, cli) -> None:
    run = trained_run
    result = cli("translate.py", "--datasource", str(run.datasource), "--model_folder", str(run.model_folder),
                 "The cat sees the dog.")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 1 and lines[0].strip()
    assert checkpoint_name(run.SECOND_MAX_STEPS) in result.stderr
    translator = TorchTranslator.load(None, run.folder, torch.device("cpu"))
    assert lines[0] == translator.translate_best(["The cat sees the dog."], DecodingOptions())[0]


@pytest.mark.parametrize("change, key", [(["--d_model", "64"], "d_model"), (["--num_layers", "2"], "num_layers"),
                                         (["--min_frequency", "3"], "min_frequency"), (["--seed", "7"], "seed")])
def test_resume_with_another_model_or_vocabulary_is_refused(trained_run, capsys: pytest.CaptureFixture,
                                                            change: list[str], key: str) -> None:
    run = trained_run
    manifest = (run.folder / MANIFEST).read_text()
    code = train.main(run.args + ["--max_steps", str(run.SECOND_MAX_STEPS + 10)] + change)
    assert code == 2
    lines = error_lines(capsys.readouterr().err)
    assert len(lines) == 1 and f"--{key}" in lines[0] and checkpoint_name(run.SECOND_MAX_STEPS) in lines[0]
    assert (run.folder / MANIFEST).read_text() == manifest


def test_a_checkpoint_from_before_the_corpus_keys_can_be_resumed(trained_run) -> None:
    """Config keys added since a checkpoint was written (valid_data, test_data, reserved_tags, ...)
    take their defaults when it is resumed, as they do for inference, instead of being missing."""
    path, state = trained_run.latest()
    added = ("valid_data", "test_data", "reserved_tags", "target_lang", "best_metric", "warmup_fraction")
    state["config"] = {key: value for key, value in state["config"].items() if key not in added}
    best = state.pop("best_value")
    state["best_bleu"] = best  # the key before --best_metric, when the best was always BLEU's
    check_resumable(state, parse_config(trained_run.args), path)
    assert state["best_value"] == best and "best_bleu" not in state


def test_preload_new_over_existing_checkpoints_is_refused(trained_run, capsys: pytest.CaptureFixture) -> None:
    run = trained_run
    code = train.main(run.args + ["--max_steps", str(run.SECOND_MAX_STEPS + 10), "--preload", "new"])
    assert code == 2
    lines = error_lines(capsys.readouterr().err)
    assert len(lines) == 1 and "already holds checkpoints" in lines[0] and "--preload latest" in lines[0]
    assert run.latest()[1]["global_step"] == run.SECOND_MAX_STEPS


def test_finished_run_is_not_trained_again(trained_run, capsys: pytest.CaptureFixture) -> None:
    run = trained_run
    before = sorted(p.name for p in run.folder.glob("ckpt_*.pt"))
    events = sorted(run.runs.rglob("events.out.tfevents.*"))
    assert train.main(run.args + ["--max_steps", str(run.SECOND_MAX_STEPS)]) == 0
    assert f"already trained {run.SECOND_MAX_STEPS} steps" in capsys.readouterr().err
    assert sorted(p.name for p in run.folder.glob("ckpt_*.pt")) == before
    assert sorted(run.runs.rglob("events.out.tfevents.*")) == events  # no empty TensorBoard run


def test_unreachable_hub_is_one_line_without_hanging(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setattr(sources, "_hub_reachable", lambda timeout=5.0: False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    started = time.monotonic()
    code = train.main(["--preset", "tiny", "--model_folder", str(tmp_path / "w"), "--runs_folder",
                       str(tmp_path / "r")])  # the default datasource: the Hub's opus_books
    assert code == 1 and time.monotonic() - started < 10
    lines = error_lines(capsys.readouterr().err)
    assert len(lines) == 1
    assert "cannot reach the Hugging Face Hub" in lines[0] and "--datasource ../shared/data/tatoeba" in lines[0]


def test_unreachable_hub_from_the_command_line(tmp_path: Path, cli) -> None:
    """The real probe, pointed at a local port nobody listens on (no network needed)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    env["HF_ENDPOINT"] = f"http://127.0.0.1:{port}"
    result = cli("train.py", "--preset", "tiny", "--model_folder", str(tmp_path / "w"), "--runs_folder",
                 str(tmp_path / "r"), env=env, timeout=60)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    lines = error_lines(result.stderr)
    assert len(lines) == 1 and "Helsinki-NLP/opus_books" in lines[0] and "--datasource" in lines[0]


# ---------------------------------------------------------------------------- a corpus edited between runs

def prefix_args(prefix: Path, tmp_path: Path) -> list[str]:
    return ["--datasource", str(prefix), "--preset", "tiny", "--num_epochs", "100", "--val_max_sentences", "2",
            "--num_examples", "0", "--model_folder", str(tmp_path / "w"), "--runs_folder", str(tmp_path / "r"),
            "--store_folder", str(tmp_path / "s")]


def test_a_corpus_edited_between_runs_is_not_resumed_unasked(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """The issue's run: 5 steps on plain files, pairs appended to both, run again: it resumed, built
    a new store and carved its test split anew, from pairs it had trained on. Now the edit is refused
    in one line saying both ways on; --data_changed keep_held_out goes on with the run's validation
    and test splits, and so does every later resume; the same files under another path resume."""
    prefix = write_parallel_files(tmp_path / "data" / "corpus", synthetic_pairs(240, 1))
    args = prefix_args(prefix, tmp_path)
    assert train.main(args + ["--max_steps", "2"]) == 0
    record_path = weights_dir(parse_config(args)) / "data.json"
    record = json.loads(record_path.read_text())
    write_parallel_files(prefix, synthetic_pairs(60, 9), mode="a")
    capsys.readouterr()
    assert train.main(args + ["--max_steps", "3"]) == 1
    lines = error_lines(capsys.readouterr().err)
    assert len(lines) == 1 and f"corpus {prefix} holds other data than it did" in lines[0], lines
    assert "--data_changed keep_held_out" in lines[0] and "--experiment_name" in lines[0]
    assert newest(args)["global_step"] == 2

    assert train.main(args + ["--max_steps", "3", "--data_changed", "keep_held_out"]) == 0
    assert "validating and testing on the run's held-out splits as they were" in capsys.readouterr().err
    kept = json.loads(record_path.read_text())
    assert kept["held_out"] == record["held_out"] and kept["held_out_from"] == record["stores"][0]
    assert kept["corpora"] != record["corpora"] and newest(args)["data"] == kept
    assert train.main(args + ["--max_steps", "4"]) == 0
    assert json.loads(record_path.read_text())["held_out"] == record["held_out"]

    moved = write_parallel_files(tmp_path / "elsewhere" / "corpus", [])
    for lang in ("en", "it"):
        Path(f"{moved}.{lang}").write_bytes(Path(f"{prefix}.{lang}").read_bytes())
    capsys.readouterr()
    assert train.main(prefix_args(moved, tmp_path) + ["--max_steps", "5"]) == 0
    assert f"the corpora moved ({prefix} -> {moved}) with the same content: resuming" in capsys.readouterr().err
    assert newest(args)["global_step"] == 5


# ---------------------------------------------------------------------------- resuming with other settings

@pytest.fixture
def stopped_mid_epoch(tmp_path: Path) -> list[str]:
    """The options of a tiny run stopped by --max_steps 5, in the middle of its first epoch."""
    data = write_hub_dataset(tmp_path / "data", {"train": synthetic_pairs(300, 1), "validation": synthetic_pairs(8, 2),
                                                 "test": synthetic_pairs(8, 3)})
    # --clean false: the schedules below are counted on the synthetic pairs as written (cleaning would
    # remove their near-duplicates); --confidence_sentences 0: 8 validation sentences fit no
    # calibrator, and the tests read training's warnings; --num_examples 0: no examples, nor their
    # attention heatmap (matplotlib: a third of these runs' time)
    args = ["--datasource", str(data), "--preset", "tiny", "--batch_tokens", "256", "--num_epochs", "100",
            "--val_max_sentences", "4", "--model_folder", str(tmp_path / "w"), "--runs_folder", str(tmp_path / "r"),
            "--store_folder", str(tmp_path / "s"), "--clean", "false", "--confidence_sentences", "0",
            "--num_examples", "0"]
    assert train.main(args + ["--max_steps", "5"]) == 0
    return args


def newest(args: list[str]) -> dict:
    config = parse_config(args)
    return load_checkpoint(max(weights_dir(config).glob("ckpt_*.pt")))


def test_out_of_memory_in_a_step_is_one_line_naming_the_batch(stopped_mid_epoch: list[str],
                                                               capsys: pytest.CaptureFixture,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The allocator's error is raised where a CUDA one would surface (the loss of step 7's batch);
    what is tested is the handler: one error line, the batch's shape, exit 1, no traceback, the
    checkpoint kept."""
    real_loss_sum, calls = train.loss_sum, []

    def running_out(logits, label, smoothing):
        calls.append(label.shape)
        if len(calls) == 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real_loss_sum(logits, label, smoothing)

    monkeypatch.setattr(train, "loss_sum", running_out)
    capsys.readouterr()
    assert train.main(stopped_mid_epoch + ["--max_steps", "9"]) == 1
    err = capsys.readouterr().err
    lines = [line for line in error_lines(err) if line.startswith("train.py")]
    sentences, target = calls[1]
    assert len(lines) == 1 and lines[0].startswith("train.py: error: out of device memory at step 7, on a batch of "
                                                   f"{sentences} sentences x ") and \
        f"and {target} target positions (--batch_tokens 256)" in lines[0], lines
    assert "Traceback" not in err
    assert newest(stopped_mid_epoch)["global_step"] == 5


def test_other_optimizer_settings_on_resume_are_applied_and_logged(stopped_mid_epoch: list[str],
                                                                   capsys: pytest.CaptureFixture) -> None:
    capsys.readouterr()
    changed = ["--lr", "5e-3", "--weight_decay", "0.01", "--adam_beta2", "0.99", "--max_steps", "6"]
    assert train.main(stopped_mid_epoch + changed) == 0
    assert ("resuming with changed optimizer settings, applied from here on: --lr 0.003 -> 0.005, "
            "--weight_decay 0.0 -> 0.01, --adam_beta2 0.98 -> 0.99") in capsys.readouterr().err
    state = newest(stopped_mid_epoch)
    config = state["config"]
    assert (config["lr"], config["weight_decay"], config["adam_beta2"]) == (5e-3, 0.01, 0.99)
    decay, no_decay = state["optimizer"]["param_groups"]
    assert decay["betas"] == no_decay["betas"] == (0.9, 0.99)
    assert (decay["weight_decay"], no_decay["weight_decay"]) == (0.01, 0.0)
    assert decay["lr"] == pytest.approx(5e-3 * Schedule.from_config(config, config["max_steps"]).factor(6))


def test_other_accum_steps_mid_epoch_resume_at_the_next_batch(stopped_mid_epoch: list[str],
                                                             capsys: pytest.CaptureFixture) -> None:
    capsys.readouterr()
    assert train.main(stopped_mid_epoch + ["--accum_steps", "2", "--max_steps", "6"]) == 0
    assert "resuming at batch 5 of epoch 0, now 2 batches per step (--accum_steps 1 -> 2): no batch is skipped " \
           "or repeated" in capsys.readouterr().err
    state = newest(stopped_mid_epoch)
    assert (state["epoch"], state["batches_done"], state["step_in_epoch"]) == (0, 5 + 2, 6)
    assert state["batch_settings"]["accum_steps"] == 2


def test_other_batch_tokens_mid_epoch_resume_at_the_next_epoch(stopped_mid_epoch: list[str],
                                                              capsys: pytest.CaptureFixture) -> None:
    capsys.readouterr()
    assert train.main(stopped_mid_epoch + ["--batch_tokens", "300", "--max_steps", "7"]) == 0
    warning = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning: --batch_tokens")]
    assert warning == ["warning: --batch_tokens 256 -> 300 since the checkpoint changes this epoch's batches; the "
                       "rest of epoch 0 is skipped and training resumes at the start of epoch 1"]
    state = newest(stopped_mid_epoch)
    assert (state["epoch"], state["batches_done"], state["global_step"]) == (1, 2, 7)


def test_other_cleaning_settings_mid_epoch_resume_at_the_next_epoch(stopped_mid_epoch: list[str],
                                                                  capsys: pytest.CaptureFixture) -> None:
    """A cleaning setting is a filter: the checkpoint records what the data store was cleaned with."""
    capsys.readouterr()
    cleaning = ["--clean", "true", "--clean_max_length_ratio", "2.5"]
    assert train.main(stopped_mid_epoch + cleaning + ["--max_steps", "7"]) == 0
    warning = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning: cleaning")]
    assert warning == ["warning: cleaning: rules off -> on since the checkpoint changes this epoch's batches; the "
                       "rest of epoch 0 is skipped and training resumes at the start of epoch 1"]
    state = newest(stopped_mid_epoch)
    assert state["epoch"] == 1 and state["config"]["clean_max_length_ratio"] == 2.5
    cleaned = state["batch_settings"]["cleaning"]
    assert cleaned["rules"]["max_length_ratio"] == 2.5 and cleaned["scoring"] is False
    # Resumed again with the same settings: the store is reused and its counts read back, logged and
    # written to TensorBoard at the step the run starts from, as the run before wrote them at its own.
    assert train.main(stopped_mid_epoch + cleaning + ["--max_steps", "8"]) == 0
    err = capsys.readouterr().err
    assert "warning" not in err and "building the data store" not in err
    report = text_store(parse_config(stopped_mid_epoch + cleaning)).cleaning()["rules"]
    assert report["removed"]["near_duplicate"] > 0
    assert f"data: cleaning en-it: kept {report['kept']} of {report['seen']} pairs" in err
    events = EventAccumulator(str(runs_dir(parse_config(stopped_mid_epoch))), size_guidance={"scalars": 0})
    events.Reload()
    for name, count in (("seen", report["seen"]), ("kept", report["kept"]), ("swapped", report["swapped"]),
                        ("near_duplicate", report["removed"]["near_duplicate"]), ("score", 0)):
        assert [(e.step, e.value) for e in events.Scalars(f"data/cleaning/{name}")] == [(5, count), (7, count)]


# ---------------------------------------------------------------------------- stopping rules

def test_max_minutes_stops_with_a_validated_checkpoint(stopped_mid_epoch: list[str],
                                                       capsys: pytest.CaptureFixture) -> None:
    """--max_minutes 0.1: the run stops after the first step at which the time since it started plus
    the length of its last validation reaches 6 s, then validates and saves. Judged from the wall
    times TensorBoard records for each step and validation, so a slow or loaded machine, which
    trains fewer steps in 6 s, passes as well as a fast one."""
    args = stopped_mid_epoch + ["--experiment_name", "timed", "--max_minutes", "0.1", "--log_every", "1"]
    budget = 6.0
    started = time.time()
    assert train.main(args) == 0
    elapsed = time.time() - started
    stop = int(re.search(r"reached --max_minutes 0.1 \((\d+) steps\)", capsys.readouterr().err).group(1))
    state = newest(args)
    assert state["global_step"] == stop and set(state["metrics"]) >= {"bleu", "loss"}
    assert elapsed < 30

    events = EventAccumulator(str(runs_dir(parse_config(args))), size_guidance={"scalars": 0})
    events.Reload()
    logged = {e.step: e.wall_time - started for e in events.Scalars("train/loss")}  # after the step's time check
    validated = {e.step: e.wall_time - started for e in events.Scalars("val/loss")}
    assert sorted(logged) == list(range(1, stop + 1)) and stop in validated

    def last_validation(step: int) -> tuple[float, float]:
        """Bounds of the length of the last validation before `step`'s time check (none: 0): it
        starts after its step is logged, logs val/loss, and ends before the next step is logged."""
        before = [v for v in validated if v < step]
        if not before:
            return 0.0, 0.0
        v = max(before)
        return validated[v] - logged[v], logged[v + 1] - logged[v]

    # Not too early: at the stop step's check, the time plus the last validation had reached the budget.
    assert logged[stop] + last_validation(stop)[1] >= budget, (logged, validated)
    # Not too late: at the check of the step before (after step stop - 2 was logged), they had not.
    if stop >= 3:
        assert logged[stop - 2] + last_validation(stop - 1)[0] < budget + 0.25, (logged, validated)


def test_validation_on_a_step_schedule_also_after_a_mid_epoch_resume(stopped_mid_epoch: list[str],
                                                                     capsys: pytest.CaptureFixture) -> None:
    """--validate_every_steps 3, 10 steps per epoch: validated at the multiples of 3, the epoch's end
    (10) and the stop (14), each once, with BLEU in TensorBoard at each; the run stopped at step 5
    (mid-epoch, not a multiple) and resumed validates where the unbroken one does from there on."""
    schedule = ["--validate_every_steps", "3", "--max_steps", "14"]

    def validated(out: str) -> list[int]:
        return [int(step) for step in re.findall(r"^step (\d+): val loss", out, re.M)]

    capsys.readouterr()
    assert train.main(stopped_mid_epoch + schedule + ["--experiment_name", "unbroken"]) == 0
    assert validated(capsys.readouterr().out) == [3, 6, 9, 10, 12, 14]
    assert train.main(stopped_mid_epoch + schedule) == 0
    assert validated(capsys.readouterr().out) == [6, 9, 10, 12, 14]
    events = EventAccumulator(str(runs_dir(parse_config(stopped_mid_epoch))), size_guidance={"scalars": 0})
    events.Reload()
    assert [e.step for e in events.Scalars("val/bleu")] == [5, 6, 9, 10, 12, 14]
    assert newest(stopped_mid_epoch)["global_step"] == 14


def test_the_validation_subset_is_fixed_by_the_seed_and_keeps_every_reference() -> None:
    pairs = [(f"source {i % 7}", f"reference {i}") for i in range(20)]  # 7 distinct sources, 2 or 3 references each
    chosen = validation_subset(pairs, 3, seed=1)
    sources = {source for source, _ in chosen}
    assert len(sources) == 3 and chosen == [pair for pair in pairs if pair[0] in sources]
    assert validation_subset(pairs, 3, seed=1) == chosen
    assert {s for s, _ in validation_subset(pairs, 3, seed=2)} != sources
    assert validation_subset(pairs, 0, seed=1) == validation_subset(pairs, 7, seed=1) == pairs


def test_early_stopping_after_patience_validations_without_a_better_bleu(stopped_mid_epoch: list[str],
                                                                         capsys: pytest.CaptureFixture) -> None:
    # lr 1e-12: nothing is learnt, so BLEU never beats the first validation's
    args = stopped_mid_epoch + ["--experiment_name", "patient", "--lr", "1e-12", "--min_lr", "0", "--warmup_steps",
                                "0", "--early_stopping_patience", "2"]
    assert train.main(args) == 0
    assert "stopped early: no better validation BLEU in 2 validations" in capsys.readouterr().err
    state = newest(args)
    assert state["epoch"] == 3 and state["stale_validations"] == 2  # validations after epochs 0, 1, 2


# ---------------------------------------------------------------------------- fine-tuning

def first_logged_loss(runs: Path) -> float:
    events = EventAccumulator(str(runs), size_guidance={"scalars": 0})
    events.Reload()
    return events.Scalars("train/loss")[0].value


def test_init_from_fine_tunes_a_model_in_a_folder_of_its_own(trained_run, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture) -> None:
    base_path, base = trained_run.latest()
    base_files = sorted(p.name for p in trained_run.folder.iterdir())
    second = write_hub_dataset(tmp_path / "second", {"train": synthetic_pairs(200, 11),
                                                    "validation": synthetic_pairs(8, 12), "test": synthetic_pairs(8, 13)})
    common = ["--datasource", str(second), "--batch_tokens", "256", "--lr", "1e-3", "--num_epochs", "100",
              "--log_every", "1", "--val_max_sentences", "4", "--model_folder", str(tmp_path / "w"),
              "--runs_folder", str(tmp_path / "r"), "--store_folder", str(tmp_path / "s"), "--clean", "false"]
    assert train.main(common + ["--preset", "tiny", "--experiment_name", "scratch", "--max_steps", "3"]) == 0
    tuned = common + ["--init_from", str(base_path), "--experiment_name", "tuned"]
    capsys.readouterr()
    assert train.main(tuned + ["--max_steps", "3"]) == 0
    assert f"starting from {base_path}" in capsys.readouterr().err
    # it starts where the first model ended, not from scratch
    assert first_logged_loss(tmp_path / "r" / "tuned") < 0.5 * first_logged_loss(tmp_path / "r" / "scratch")
    state = load_checkpoint(tmp_path / "w" / "tuned" / checkpoint_name(3))
    assert state["global_step"] == 3 and {int(s["step"]) for s in state["optimizer"]["state"].values()} == {3}
    assert state["tokenizers"] == base["tokenizers"]
    assert {k: state["config"][k] for k in ("d_model", "num_layers", "d_ff")} == \
        {k: base["config"][k] for k in ("d_model", "num_layers", "d_ff")}
    assert state["config"]["datasource"] == str(second) and state["config"]["init_from"] == str(base_path)
    assert sorted(p.name for p in trained_run.folder.iterdir()) == base_files, "the first model is untouched"
    # the same command again resumes the fine-tuned run
    assert train.main(tuned + ["--max_steps", "5"]) == 0
    assert f"resuming from {tmp_path / 'w' / 'tuned' / checkpoint_name(3)}" in capsys.readouterr().err


@pytest.mark.parametrize("extra, message", [
    (["--d_model", "64", "--experiment_name", "tuned"], "--d_model 64 conflicts with --init_from"),
    (["--lang_tgt", "fr", "--experiment_name", "tuned"], "--lang_tgt 'fr' conflicts"),
    ([], "is a checkpoint of this very experiment"),
])
def test_init_from_refuses_conflicts_in_one_line(trained_run, capsys: pytest.CaptureFixture, extra: list[str],
                                                 message: str) -> None:
    base_path, _ = trained_run.latest()
    code = train.main(trained_run.args + ["--init_from", str(base_path), "--max_steps", "70", *extra])
    lines = error_lines(capsys.readouterr().err)
    assert code == 2 and len(lines) == 1 and message in lines[0], lines


def test_the_last_checkpoints_are_averaged_for_inference(stopped_mid_epoch: list[str],
                                                         capsys: pytest.CaptureFixture) -> None:
    args = stopped_mid_epoch + ["--num_epochs", "3", "--average_checkpoints", "2"]
    assert train.main(args) == 0
    folder = weights_dir(parse_config(args))
    averaged = folder / "ckpt_00000030_avg2.pt"
    assert f"saved {averaged}, the average of ckpt_00000030.pt, ckpt_00000020.pt" in capsys.readouterr().err
    state = load_checkpoint(averaged)
    assert state["averaged_from"] == ["ckpt_00000030.pt", "ckpt_00000020.pt"] and "optimizer" not in state
    last, before = (load_checkpoint(folder / name)["model"] for name in state["averaged_from"])
    for name, tensor in state["model"].items():
        torch.testing.assert_close(tensor, (last[name] + before[name]) / 2)
    # what translate.py uses with --checkpoint_choice average
    assert load_for_inference(None, folder, torch.device("cpu"), choice="average")[4] == averaged
    assert load_latest(folder)[0].name == "ckpt_00000030.pt"  # what a resume uses
    # training on: a new average replaces the old one, which no longer belongs to the newest checkpoint
    assert train.main(stopped_mid_epoch + ["--num_epochs", "4", "--average_checkpoints", "2"]) == 0
    assert not averaged.exists() and (folder / "ckpt_00000040_avg2.pt").is_file()
    assert load_for_inference(None, folder, torch.device("cpu"), choice="average")[4] == folder / "ckpt_00000040_avg2.pt"
