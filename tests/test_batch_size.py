"""nmt/training/batch_size.py: the probe's search, on the CPU under a fake memory limit; the batch
decisions a run records (the CPU's budget, a resume's, --update_tokens' accumulation); the refusals."""
from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import train
from config import AUTO, PRESETS, ConfigError, get_config, parse_config
from dataset import BilingualDataset
from nmt.corpora.sources import DataError
from nmt.training import batch_size
from nmt.training.batch_size import CPU_BATCH_TOKENS, decide_batches, largest_fitting, probe_batch_tokens
from nmt.training.ranks import RankExchange, Ranks
from nmt.training.step import OutOfMemory
from synthetic_data import synthetic_pairs, write_hub_dataset


def test_largest_fitting_finds_the_threshold_by_bisection_after_the_cap() -> None:
    for threshold in (0, 1, 7, 63, 64, 1000):
        tries: list[int] = []

        def fits(rows: int) -> bool:
            tries.append(rows)
            return rows <= threshold

        assert largest_fitting(fits, 64) == min(threshold, 64)
        assert tries[0] == 64 and len(tries) <= 1 + math.ceil(math.log2(64)), tries
    assert largest_fitting(lambda rows: True, 0) == 0


class LargestTensor(TorchDispatchMode):
    """A fake device memory for the CPU: from `reset` to `peak`, the bytes of the largest tensor the
    probe's step creates (the loss's logits and gradient: rows x length x vocabulary), against
    `free` bytes; each measure kept in `measured`."""

    def __init__(self, free: int) -> None:
        super().__init__()
        self.free_bytes, self.largest, self.measured, self.resets = free, 0, [], 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        sizes = [t.numel() * t.element_size() for t in torch.utils._pytree.tree_leaves(out)
                 if isinstance(t, torch.Tensor)]
        self.largest = max([self.largest, *sizes])
        return out

    def free(self) -> int:
        return self.free_bytes

    def reset(self) -> None:
        self.largest, self.resets = 0, self.resets + 1
        self.__enter__()

    def peak(self) -> int:
        self.__exit__(None, None, None)
        self.measured.append(self.largest)
        return self.largest


def tiny_config() -> dict:
    return {**get_config(), **PRESETS["tiny"], "dropout": 0.1}


def step_bytes(config: dict, vocab: tuple[int, int], rows: int, length: int) -> int:
    """What the fake measures of the probe's step on `rows` rows (a probe whose cap is that batch)."""
    memory = LargestTensor(free=10 ** 15)
    assert probe_batch_tokens(config, vocab, torch.device("cpu"), length, rows * length, memory)[0] == rows * length
    return memory.measured[0]


def test_the_probe_finds_the_largest_batch_under_a_fake_memory_limit() -> None:
    """Real steps of the tiny model on the CPU, measured by LargestTensor: the budget the probe
    finds is the multiple of the longest length whose step fits MEMORY_SHARE of the memory while
    one row more does not; the memory is reset before every try, and no try ran out of memory."""
    config, vocab, length = tiny_config(), (50, 60), 12
    below, above = step_bytes(config, vocab, 40, length), step_bytes(config, vocab, 41, length)
    assert above > below
    memory = LargestTensor(free=math.ceil((below + above) / 2 / batch_size.MEMORY_SHARE))
    tokens, why = probe_batch_tokens(config, vocab, torch.device("cpu"), length, 64 * length, memory)
    assert tokens == 40 * length, why
    assert memory.resets >= len(memory.measured) >= 2 and "out of memory" not in why and f"40 x {length}" in why


def test_the_probe_refuses_in_one_line_where_one_row_does_not_fit() -> None:
    with pytest.raises(OutOfMemory, match=r"^one training pair of 12 tokens, the longest, does not fit in"):
        probe_batch_tokens(tiny_config(), (50, 60), torch.device("cpu"), 12, 120, LargestTensor(free=1000))


def test_the_probe_leaves_the_runs_random_numbers_alone() -> None:
    torch.manual_seed(3)
    expected = torch.rand(3)
    torch.manual_seed(3)
    step_bytes(tiny_config(), (50, 60), 2, 8)
    assert torch.equal(torch.rand(3), expected)


def dataset_of(longest: int) -> BilingualDataset:
    lengths = np.array([3, longest - 2, 5])
    offsets = np.zeros((2, 4), dtype=np.int64)
    offsets[0, 1:] = offsets[1, 1:] = np.cumsum(lengths)
    ids = np.full(int(lengths.sum()), 7)
    return BilingualDataset(ids, ids, offsets)


def decisions(config: dict, given: frozenset[str] = frozenset(), state: dict | None = None, world: int = 1,
              memory=None) -> dict:
    decided: dict = {}

    def decide(values: dict, by: str) -> None:
        config.update(values)
        decided.update({key: (value, by) for key, value in values.items()})

    ranks = Ranks(world_size=world)
    decide_batches(config, decide, given, torch.device("cpu"), RankExchange(Ranks(), None, torch.device("cpu")),
                   ranks, dataset_of(40), state, (50, 60), memory)
    return decided


def test_auto_on_a_cpu_is_its_budget_recorded_and_a_resume_keeps_the_checkpoints() -> None:
    config = {**get_config(), "seq_len": 64}
    assert config["batch_tokens"] == AUTO
    assert decisions(config) == {"batch_tokens": (CPU_BATCH_TOKENS, "--batch_tokens auto on a cpu device")}
    assert config["accum_steps"] == 1  # a CPU's accumulation stays accum_steps unless --update_tokens is given
    resumed = decisions({**get_config(), "seq_len": 64}, state={"batch_settings": {"batch_tokens": 2048}})
    assert resumed["batch_tokens"][0] == 2048
    assert decisions({**get_config(), "batch_tokens": 1500, "seq_len": 64}) == {}  # a preset's or given budget


def test_update_tokens_sets_the_accumulation_where_it_applies() -> None:
    given = frozenset({"update_tokens"})
    two_ranks = decisions({**get_config(), "batch_tokens": 1000, "update_tokens": 25000}, given, world=2)
    assert two_ranks["accum_steps"][0] == 13
    assert "accum_steps" not in decisions({**get_config(), "batch_tokens": 1000, "update_tokens": 1000}, given)
    # batches sized to the device (here a fake memory holding 100 rows of the longest pair, 40 tokens)
    # accumulate to --update_tokens unasked
    memory = LargestTensor(free=math.ceil(step_bytes(tiny_config(), (50, 60), 100, 40) / batch_size.MEMORY_SHARE))
    sized = decisions({**tiny_config(), "batch_tokens": AUTO, "update_tokens": 9000}, memory=memory)
    assert sized["batch_tokens"][0] == 4000 and sized["batch_tokens"][1].startswith("the probe")
    assert sized["accum_steps"] == (3, "--update_tokens 9000")
    with pytest.raises(ConfigError, match="--update_tokens and --accum_steps both set the size of a step"):
        decisions({**get_config(), "batch_tokens": 1000}, frozenset({"update_tokens", "accum_steps"}))


def test_a_budget_that_cannot_hold_the_longest_pair_is_refused_in_one_line() -> None:
    with pytest.raises(DataError, match=r"^--batch_tokens 39 cannot hold the longest training pair: 40 tokens; give "
                                        r"at least 40, or a shorter --seq_len"):
        decisions({**get_config(), "batch_tokens": 39})
    decisions({**get_config(), "batch_tokens": 40})


def test_train_py_records_the_cpus_budget_and_refuses_a_batch_too_small(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture) -> None:
    data = write_hub_dataset(tmp_path / "data", {"train": synthetic_pairs(60, 1), "validation": synthetic_pairs(6, 2)})
    args = ["--datasource", str(data), "--preset", "tiny", "--max_steps", "1", "--model_folder", str(tmp_path / "w"),
            "--runs_folder", str(tmp_path / "r"), "--store_folder", str(tmp_path / "s"), "--clean", "false"]
    trainer = train.Trainer(parse_config(args + ["--batch_tokens", "auto"]), torch.device("cpu"), Ranks(),
                            time.monotonic())
    trainer.start_or_resume()
    assert trainer.decided["batch_tokens"] == {"value": CPU_BATCH_TOKENS, "by": "--batch_tokens auto on a cpu device"}
    assert trainer.batches.batch_tokens == CPU_BATCH_TOKENS
    assert train.main(args + ["--batch_tokens", "3"]) == 1
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith(
        "train.py: error: --batch_tokens 3 cannot hold the longest training pair")
