"""Several nodes, each with its own disk or all on a shared one: what each node's ranks need.

Under `torchrun --nnodes N`, every node has its own working folder unless it shares one; nothing
here needs a shared filesystem, and one is used where there is one:
- The run's folder (`lock_run_folder`): rank 0 writes it as before; so does the first rank of every
  other node whose folder is not rank 0's. It tells by the run lock (run_lock.py): a folder whose
  lock rank 0 holds is rank 0's, seen through a shared disk; any other it locks itself. Under DDP
  every rank's weights and AdamW state are the same, so each such rank writes the same checkpoints
  (and tokenizers, config.json, data.json) into its own folder, and can resume from them.
- The data stores (`node_stores`): a rank opens rank 0's stores where it sees them with rank 0's
  content, and otherwise builds its own from its node's copy of the corpora (the stores' build lock
  makes one rank per node build while the others wait); a store is a deterministic build of its
  corpus, so the copies must hold rank 0's files byte for byte (their sha256 in meta.json), and a
  copy that does not is refused in one line naming the store.
- The tokenizers of a new run: rank 0's, as JSON through the job's store (run_data.prepare_data).
- A resume (`common_start`): every rank resumes from its own folder, all at the newest step that
  every folder holds, or the run stops in one line saying which rank lacks its checkpoints.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

from nmt.corpora.sources import DataError
from nmt.corpora.store import TextStore, TokenStore, text_stores, token_stores
from nmt.inference.pair_scoring import pair_scorer
from nmt.training.checkpoint import CheckpointError, checkpoint_name
from nmt.training.ranks import RankExchange, Ranks
from nmt.training.resume import StartPoint, checkpoint_to_resume
from nmt.training.run_lock import RunLock


def held_by_another(path: Path) -> bool:
    """Whether a process holds the flock on `path` (a run lock) now."""
    try:
        import fcntl
    except ImportError:  # not POSIX: no locks (atomic_files.lock_file)
        return False
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(handle, fcntl.LOCK_UN)
        return False


def lock_run_folder(lock: RunLock, ranks: Ranks, exchange: RankExchange) -> bool:
    """Lock the run's folder where this rank writes it (module docstring); whether it does."""
    if ranks.is_main:
        lock.acquire()
    owner = exchange.from_rank0(os.getpid() if ranks.is_main else None)
    if ranks.is_main or ranks.local_rank != 0:
        return ranks.is_main
    if lock.path.is_file() and lock.path.read_text().strip() == str(owner) and held_by_another(lock.path):
        return False  # rank 0's own lock, through a disk this node shares
    lock.acquire()
    return True


def store_files(stores: list[TextStore | TokenStore]) -> list[dict[str, Any]]:
    """What a store's content is: each of its files' size and sha256 (its meta.json)."""
    return [store.meta["files"] for store in stores]


def node_stores(config: dict[str, Any], folders: list[str], files: list[dict[str, Any]], held_out_from: str | None,
                tok_src: Any, tok_tgt: Any) -> tuple[TextStore, list[TokenStore]]:
    """The held-out text store and the token stores of a rank other than 0, given rank 0's `folders`
    and their `files` (module docstring)."""
    try:
        seen = [TextStore.open(folders[0], verify=False),
                *(TokenStore.open(name, verify=False) for name in folders[1:])]
    except DataError:  # not there, or not whole: this node builds its own
        seen = []
    if seen and store_files(seen) == files:
        return seen[0], seen[1:]
    texts = text_stores(config, held_out_from, pair_scorer(config))
    tokens = token_stores(config, texts, tok_src, tok_tgt)
    for mine, name, theirs in zip([texts[0], *tokens], folders, files):
        if mine.folder.name != Path(name).name or mine.meta["files"] != theirs:
            raise DataError(f"rank {os.environ.get('RANK', '?')}'s copy of the corpora differs from rank 0's: its data "
                            f"store {mine.folder} is not rank 0's {name} file for file; give every node the same "
                            f"corpus files")
    return texts[0], tokens


def common_step(steps: list[int | None]) -> int | None | str:
    """Rank 0's choice from every rank's newest checkpoint step (None: it has none): the oldest of
    them, which every folder holds (keep_checkpoints keeps the one before the newest: a kill can
    land between two nodes' writes of a checkpoint); None for a new run; "missing" when some have one
    and others none."""
    if all(step is None for step in steps):
        return None
    return "missing" if None in steps else min(steps)


def common_start(exchange: RankExchange, ranks: Ranks, folder: Path, config: dict[str, Any],
                 adopt: Callable[[dict[str, Any]], None]) -> StartPoint:
    """Where every rank starts (module docstring): each its checkpoint_to_resume from its own folder,
    the same step on every rank (the newest every folder holds where the newest differ), with rank
    0's word on whether the corpora changed (its data check)."""
    start = checkpoint_to_resume(folder, config, adopt, ranks.is_main)
    step = start.state["global_step"] if start.state is not None else None
    steps = exchange.gather_to_rank0("start", step)  # on rank 0; None on the others
    common = exchange.from_rank0(common_step(steps) if steps is not None else None)
    if common == "missing":
        raise CheckpointError(f"the ranks' folders disagree: rank {ranks.rank} has "
                              f"{f'step {step}' if step is not None else 'no checkpoint'} in {folder}, and some "
                              f"other rank {'none' if step is not None else 'one'}: give every node's folder rank "
                              f"0's checkpoints (and checkpoints.json), or start a new run")
    if common != step:
        path = folder / checkpoint_name(common)
        if not path.is_file():
            raise CheckpointError(f"rank {ranks.rank} cannot resume step {common}, the newest every rank holds: {path} "
                                  f"is gone; give this node's folder rank 0's checkpoints")
        start = checkpoint_to_resume(folder, {**config, "preload": str(path)}, adopt, ranks.is_main)
    return start._replace(data_changed=exchange.from_rank0(start.data_changed))
