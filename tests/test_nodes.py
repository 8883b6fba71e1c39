"""nmt/training/nodes.py: which rank writes a node's folder (by rank 0's run lock), the stores of a
node without rank 0's disk (built from its own copy, refused when the copy differs), and the step
every rank resumes. Two real nodes under torchrun: tests/test_distributed.py."""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from config import parse_config
from nmt.corpora.sources import DataError
from nmt.corpora.store import text_stores, token_stores
from nmt.corpora.tokenizer import train_tokenizer
from nmt.training.nodes import common_step, lock_run_folder, node_stores, store_files
from nmt.training.ranks import Ranks
from nmt.training.run_lock import RunLock, RunLockError
from synthetic_data import synthetic_pairs, tiny_corpus, write_hub_dataset


class Rank0Says:
    """The exchange as a rank other than 0 sees it: rank 0's value, whatever this rank passes."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def from_rank0(self, value: Any = None) -> Any:
        return self.value


def test_rank_0_and_one_rank_of_a_node_with_its_own_folder_write_it(tmp_path: Path) -> None:
    rank0 = RunLock(tmp_path / "shared")
    assert lock_run_folder(rank0, Ranks(world_size=2), Rank0Says(os.getpid())) is True
    try:
        # another node whose folder is rank 0's (a shared disk): rank 0 holds its lock
        assert lock_run_folder(RunLock(tmp_path / "shared"), Ranks(2, 1, 0), Rank0Says(os.getpid())) is False
        # a node with a folder of its own locks it and writes it; its other ranks do not
        own = RunLock(tmp_path / "own")
        assert lock_run_folder(own, Ranks(2, 1, 0), Rank0Says(os.getpid())) is True
        assert lock_run_folder(RunLock(tmp_path / "other"), Ranks(3, 2, 1), Rank0Says(os.getpid())) is False
        # a folder another run holds is refused, as ever
        with pytest.raises(RunLockError, match="in use by another training run"):
            lock_run_folder(RunLock(tmp_path / "own"), Ranks(2, 1, 0), Rank0Says(os.getpid() + 1))
        own.release()
    finally:
        rank0.release()


def test_the_step_every_rank_resumes_is_the_newest_all_folders_hold() -> None:
    assert common_step([None, None]) is None
    assert common_step([8, 8]) == 8 and common_step([12, 8]) == 8  # killed between two nodes' writes
    assert common_step([8, None]) == "missing"


def test_a_node_builds_its_own_stores_from_its_copy_and_refuses_a_different_copy(tmp_path: Path) -> None:
    """Rank 0's stores on its disk; a node that does not see them builds them in its own folder from
    its own copy of the corpus: the same files, byte for byte. A copy with one pair changed is
    refused in one line naming the store."""
    corpus = tiny_corpus(tmp_path / "rank0" / "data", train=80, validation=8, test=8)
    pairs = synthetic_pairs(80, 1)
    tokenizer = train_tokenizer((text for pair in pairs for text in pair), "wordlevel", 500, 1)

    def config_in(folder: Path) -> dict:
        return parse_config(["--datasource", str(folder / "data"), "--preset", "tiny", "--clean", "false",
                             "--store_folder", str(folder / "s")])

    texts = text_stores(config_in(tmp_path / "rank0"))
    rank0 = [texts[0], *token_stores(config_in(tmp_path / "rank0"), texts, tokenizer, tokenizer)]
    folders, files = [str(store.folder) for store in rank0], store_files(rank0)
    node = tmp_path / "node1"
    shutil.copytree(corpus, node / "data")
    shutil.rmtree(tmp_path / "rank0")  # rank 0's disk is out of this node's sight
    held_out, tokens = node_stores(config_in(node), folders, files, None, tokenizer, tokenizer)
    assert store_files([held_out, *tokens]) == files and held_out.folder.parent == node / "s"
    other = tmp_path / "node2"
    write_hub_dataset(other / "data", {"train": [("a changed pair", "una coppia cambiata"), *pairs[1:]],
                                       "validation": synthetic_pairs(8, 2), "test": synthetic_pairs(8, 3)})
    with pytest.raises(DataError, match=r"copy of the corpora differs from rank 0's: its data store .* is not rank "
                                        r"0's .* file for file; give every node the same corpus files$"):
        node_stores(config_in(other), folders, files, None, tokenizer, tokenizer)
