"""dataset.py: flat-array datasets with per-batch padding and masks, token-budget batches and the
batch plan. (Reading corpora is tested in tests/test_sources.py, the store in tests/test_store.py.)"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import dataset
from dataset import (BatchPlan, BilingualDataset, CorpusMix, MicroBatches, bucket_lengths, bucketed_batches,
                     padding_waste, token_batches)
from nmt.corpora.sources import DataError
from synthetic_data import synthetic_pairs
from nmt.corpora.tokenizer import EOS_ID, PAD_ID, SOS_ID, encode_ids, train_tokenizer


# ---------------------------------------------------------------------------- tensors and masks

@pytest.fixture(scope="module")
def tokenizers():
    pairs = synthetic_pairs(200, 1)
    return (train_tokenizer([s for s, _ in pairs], "wordlevel", 10_000, 1),
            train_tokenizer([t for _, t in pairs], "wordlevel", 10_000, 1))


def test_pairs_longer_than_seq_len_are_dropped_and_counted(tokenizers, capsys: pytest.CaptureFixture) -> None:
    tok_src, tok_tgt = tokenizers
    # "The cat." is 3 tokens, so 5 with [SOS]/[EOS]; its target "Il gatto." needs 3 + 1.
    pairs = [("The cat.", "Il gatto."), ("The cat sees the dog.", "Il gatto."), ("The cat.", "Il gatto vede il cane.")]
    dataset = BilingualDataset.from_pairs(pairs, tok_src, tok_tgt, seq_len=5, name="train")
    assert len(dataset) == 1  # exactly at the limit is kept
    assert [ids.tolist() for ids in dataset[0]] == [encode_ids(tok_src, "The cat."), encode_ids(tok_tgt, "Il gatto.")]
    assert "train: dropped 2 of 3 pairs longer than seq_len 5" in capsys.readouterr().err
    assert list(dataset.src_lens) == [5] and list(dataset.tgt_lens) == [4]


def test_collate_pads_to_the_longest_in_the_batch_only(tokenizers) -> None:
    tok_src, tok_tgt = tokenizers
    pairs = [("The cat.", "Il gatto."), ("The big old man sees the dog.", "Il grande vecchio uomo vede il cane.")]
    dataset = BilingualDataset.from_pairs(pairs, tok_src, tok_tgt, seq_len=64)
    batch = dataset.collate([0, 1])
    src0, tgt0 = encode_ids(tok_src, pairs[0][0]), encode_ids(tok_tgt, pairs[0][1])
    src1, tgt1 = encode_ids(tok_src, pairs[1][0]), encode_ids(tok_tgt, pairs[1][1])
    assert batch["encoder_input"].shape == (2, len(src1) + 2)  # not seq_len
    assert batch["decoder_input"].shape == batch["label"].shape == (2, len(tgt1) + 1)
    assert batch["encoder_input"][0].tolist() == [SOS_ID, *src0, EOS_ID] + [PAD_ID] * (len(src1) - len(src0))
    assert batch["decoder_input"][0].tolist() == [SOS_ID, *tgt0] + [PAD_ID] * (len(tgt1) - len(tgt0))
    assert batch["label"][0].tolist() == [*tgt0, EOS_ID] + [PAD_ID] * (len(tgt1) - len(tgt0))
    assert batch["encoder_input"][1].tolist() == [SOS_ID, *src1, EOS_ID]
    assert batch["label"][1].tolist() == [*tgt1, EOS_ID]
    alone = dataset.collate([0])
    assert alone["encoder_input"].shape == (1, len(src0) + 2)


def test_collate_masks_the_source_only_where_it_is_padded(tokenizers) -> None:
    """A src_mask (B, 1, 1, S), True on real positions, only when some source is padded; never a
    target mask: the decoder is causal without one (model.py)."""
    tok_src, tok_tgt = tokenizers
    pairs = synthetic_pairs(6, 4)
    dataset = BilingualDataset.from_pairs(pairs, tok_src, tok_tgt, seq_len=64)
    batch = dataset.collate(list(range(len(pairs))))
    assert len(set(dataset.src_lens.tolist())) > 1, "the batch should pad its sources"
    b, s = batch["encoder_input"].shape
    assert s == int(dataset.src_lens.max()) and batch["label"].size(1) == int(dataset.tgt_lens.max())  # on CUDA too
    assert "tgt_mask" not in batch
    assert batch["src_mask"].shape == (b, 1, 1, s) and batch["src_mask"].dtype == torch.bool
    assert torch.equal(batch["src_mask"][:, 0, 0], batch["encoder_input"] != PAD_ID)
    for unpadded in ([0], [3, 3]):
        assert set(dataset.collate(unpadded)) == {"encoder_input", "decoder_input", "label"}


# ---------------------------------------------------------------------------- batching

def tatoeba_like_lengths(count: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Lengths (with special tokens) shaped like tatoeba's: English median 9, Italian a little
    shorter and strongly correlated, a long tail up to 100."""
    rng = np.random.default_rng(seed)
    src = np.clip(np.round(rng.lognormal(np.log(9), 0.35, count)), 4, 100).astype(np.int64)
    tgt = np.clip(np.round(src * rng.normal(0.85, 0.12, count)), 3, 100).astype(np.int64)
    return src, tgt


@pytest.mark.parametrize("budget", [256, 1000, 4096])
def test_token_batches_respect_the_budget_and_cover_everything_once(budget: int) -> None:
    src, tgt = tatoeba_like_lengths(3000)
    src[:3] = 300  # longer than the smallest budget: each gets a batch of its own
    batches = token_batches(src, tgt, budget, np.random.default_rng(0))
    covered = np.concatenate(batches)
    assert sorted(covered.tolist()) == list(range(len(src)))
    for batch in batches:
        padded = len(batch) * int(np.maximum(src[batch], tgt[batch]).max())
        assert padded <= budget or len(batch) == 1
    assert sum(len(b) == 1 for b in batches) >= (3 if budget < 300 else 0)


@pytest.mark.parametrize("budget", [512, 3000, 4096])
def test_padding_waste_is_under_ten_percent_on_tatoeba_like_lengths(budget: int) -> None:
    src, tgt = tatoeba_like_lengths(15000)
    batches = token_batches(src, tgt, budget, np.random.default_rng(0))
    waste = padding_waste(batches, src, tgt)
    assert waste < 0.10, f"{waste:.1%} padding"
    # what padding every batch to the longest sentence of the corpus would waste, for scale
    naive = padding_waste([np.arange(len(src))], src, tgt)
    assert naive > 0.5


def test_padding_waste_counts_padded_positions() -> None:
    src, tgt = np.array([4, 6]), np.array([3, 5])
    assert padding_waste([np.array([0, 1])], src, tgt) == pytest.approx(1 - 18 / 22)
    assert padding_waste([np.array([0]), np.array([1])], src, tgt) == 0.0


def reference_token_batches(src_lens: np.ndarray, tgt_lens: np.ndarray, batch_tokens: int,
                            rng: np.random.Generator) -> list[np.ndarray]:
    """token_batches written as the plain loop over sentences that it vectorises."""
    tie_break = rng.random(len(src_lens))
    order = np.lexsort((tie_break, tgt_lens, src_lens, np.maximum(src_lens, tgt_lens)))
    batches, start, longest = [], 0, 0
    for position, index in enumerate(order):
        length = max(src_lens[index], tgt_lens[index])
        if position > start and max(longest, length) * (position - start + 1) > batch_tokens:
            batches.append(order[start:position])
            start, longest = position, 0
        longest = max(longest, length)
    if start < len(order):
        batches.append(order[start:])
    return [batches[i] for i in rng.permutation(len(batches))]


@pytest.mark.parametrize("budget", [40, 256, 1000, 4096])
def test_token_batches_equal_the_plain_loop(budget: int) -> None:
    src, tgt = tatoeba_like_lengths(5000, seed=4)
    src[:3] = 300
    ours = token_batches(src, tgt, budget, np.random.default_rng(5))
    reference = reference_token_batches(src, tgt, budget, np.random.default_rng(5))
    assert [b.tolist() for b in ours] == [b.tolist() for b in reference]


# ---------------------------------------------------------------------------- length buckets (CUDA graphs)

def test_bucket_lengths_rise_by_at_most_a_tenth_up_to_seq_len() -> None:
    for seq_len in (5, 9, 64, 128, 256):
        lengths = bucket_lengths(seq_len)
        assert lengths[-1] == seq_len and (np.diff(lengths) > 0).all()
        assert (lengths[1:] <= np.maximum(lengths[:-1] + 1, np.ceil(lengths[:-1] * 1.1))).all()
    assert (len(bucket_lengths(128)), len(bucket_lengths(256))) == (27, 34)  # dataset.py's comment


def lengths_dataset(src: np.ndarray, tgt: np.ndarray) -> BilingualDataset:
    """A dataset of the given lengths (special tokens counted as BilingualDataset counts them)."""
    offsets = np.zeros((2, len(src) + 1), dtype=np.int64)
    offsets[0, 1:], offsets[1, 1:] = np.cumsum(src - 2), np.cumsum(tgt - 1)
    return BilingualDataset(np.full(offsets[0, -1], 9), np.full(offsets[1, -1], 9), offsets)


@pytest.mark.parametrize("budget", [300, 1500, 4096])
def test_a_bucketed_epoch_has_at_most_one_batch_shape_per_bucket(budget: int) -> None:
    """The claim CUDA graphs rest on: every batch of an epoch, on every rank, is (budget // length,
    length) for a bucket's length, so an epoch has at most len(bucket_lengths(seq_len)) shapes; each
    holds its sentences, within the budget, and every pair is in one batch of the epoch."""
    src, tgt = tatoeba_like_lengths(6000, seed=2)
    src[:5], tgt[5:8] = 100, 120  # a long tail
    dataset, buckets = lengths_dataset(src, tgt), bucket_lengths(128)
    plan = BatchPlan(dataset, budget, seed=3, world_size=2, buckets=buckets)
    for epoch in (0, 1):
        batches = plan.epoch_batches(epoch)
        assert sorted(np.concatenate(batches).tolist()) == list(range(len(src)))
        shapes = {plan.shape_of(batch) for batch in batches}
        assert len(shapes) <= len(buckets) and {length for _, length in shapes} <= set(buckets.tolist())
        for batch in batches:
            rows, length = plan.shape_of(batch)
            assert len(batch) <= rows and rows * length <= budget
            assert max(src[batch].max(), tgt[batch].max()) <= length
        assert padding_waste(batches, src, tgt, plan.shape_of) < 0.3
    assert BatchPlan(dataset, budget, seed=3).shape_of(batches[0]) is None  # exact widths without buckets


def test_a_bucketed_batch_is_padded_to_its_shape_with_filler_rows_that_add_no_loss(tokenizers) -> None:
    tok_src, tok_tgt = tokenizers
    dataset = BilingualDataset.from_pairs(synthetic_pairs(3, 4), tok_src, tok_tgt, seq_len=64)
    batch = dataset.collate([0, 1], shape=(4, 40))
    assert {key: tuple(value.shape) for key, value in batch.items()} == {
        "encoder_input": (4, 40), "decoder_input": (4, 40), "label": (4, 40), "src_mask": (4, 1, 1, 40)}
    exact = dataset.collate([0, 1])
    source, target = exact["encoder_input"].size(1), exact["label"].size(1)
    assert torch.equal(batch["encoder_input"][:2, :source], exact["encoder_input"])
    assert torch.equal(batch["label"][:2, :target], exact["label"]) and (batch["label"][:, target:] == PAD_ID).all()
    assert batch["encoder_input"][2:, :3].tolist() == [[SOS_ID, EOS_ID, PAD_ID]] * 2  # filler
    assert (batch["label"][2:] == PAD_ID).all() and (batch["decoder_input"][2:] == PAD_ID).all()
    assert torch.equal(batch["src_mask"][:, 0, 0], batch["encoder_input"] != PAD_ID)
    with pytest.raises(ValueError, match="cannot hold one sentence padded to"):
        bucketed_batches(np.array([50]), np.array([50]), 40, bucket_lengths(64), np.random.default_rng(0))


@pytest.fixture(scope="module")
def plan_dataset(tokenizers) -> BilingualDataset:
    tok_src, tok_tgt = tokenizers
    return BilingualDataset.from_pairs(synthetic_pairs(400, 5), tok_src, tok_tgt, seq_len=64)


def as_lists(plan: list) -> list:
    return [(b.tolist(), tokens) for b, tokens in plan]


def test_batch_plan_order_is_a_function_of_seed_and_epoch(plan_dataset: BilingualDataset) -> None:
    plan = BatchPlan(plan_dataset, batch_tokens=200, seed=3)
    assert as_lists(plan.micro_batches(0)) == as_lists(BatchPlan(plan_dataset, 200, seed=3).micro_batches(0))
    assert as_lists(plan.micro_batches(0)) != as_lists(plan.micro_batches(1))
    assert as_lists(plan.micro_batches(0)) != as_lists(BatchPlan(plan_dataset, 200, seed=4).micro_batches(0))
    assert plan.steps_per_epoch(0) == len(plan.micro_batches(0)) > 10


@pytest.mark.parametrize("world_size", [2, 3])
def test_ranks_share_each_step_disjointly(plan_dataset: BilingualDataset, world_size: int) -> None:
    single = BatchPlan(plan_dataset, 200, seed=3, accum_steps=world_size)  # one process, same global step
    ranks = [BatchPlan(plan_dataset, 200, seed=3, world_size=world_size, rank=r) for r in range(world_size)]
    plans = [r.micro_batches(2) for r in ranks]
    assert len({len(p) for p in plans}) == 1 and all(r.steps_per_epoch(2) == single.steps_per_epoch(2) for r in ranks)
    steps = single.steps_per_epoch(2)
    full = single.micro_batches(2)
    for step in range(steps):
        from_ranks = [plans[r][step] for r in range(world_size)]
        expected = full[step * world_size:(step + 1) * world_size]
        assert sorted(tuple(b.tolist()) for b, _ in from_ranks) == sorted(tuple(b.tolist()) for b, _ in expected)
        # every rank normalises by the tokens of the whole global step
        assert {tokens for _, tokens in from_ranks} == {int(sum(plan_dataset.tgt_lens[b].sum() for b, _ in expected))}
    sentences = [i for p in plans for b, _ in p for i in b.tolist()]
    assert len(sentences) == len(set(sentences))  # disjoint
    whole = BatchPlan(plan_dataset, 200, seed=3).micro_batches(2)
    used = {i for b, _ in whole[:steps * world_size] for i in b.tolist()}
    assert set(sentences) == used


def test_micro_batches_from_a_step_are_the_tail_of_the_epoch(plan_dataset: BilingualDataset) -> None:
    for world_size, accum in ((1, 1), (1, 2), (2, 2)):
        plan = BatchPlan(plan_dataset, 200, seed=3, world_size=world_size, rank=world_size - 1, accum_steps=accum)
        full = as_lists(plan.micro_batches(1))
        for step in (0, 1, 3, plan.steps_per_epoch(1)):
            assert as_lists(plan.micro_batches(1, step * plan.per_step)) == full[step * accum:]
            assert plan.steps_per_epoch(1, step * plan.per_step) == plan.steps_per_epoch(1) - step


def test_micro_batches_dataset_yields_collated_batches(plan_dataset: BilingualDataset) -> None:
    plan = BatchPlan(plan_dataset, 200, seed=3, accum_steps=2)
    micro = MicroBatches(plan_dataset, plan.micro_batches(0))
    item = micro[0]
    indices, step_tokens = plan.micro_batches(0)[0]
    assert torch.equal(item["encoder_input"], plan_dataset.collate(indices)["encoder_input"])
    assert int(item["num_tokens"]) == int((item["label"] != PAD_ID).sum())
    assert int(item["step_tokens"]) == step_tokens >= int(item["num_tokens"])


def test_a_mix_that_would_draw_more_than_memory_can_plan_is_refused_before_allocating(
        plan_dataset: BilingualDataset, monkeypatch: pytest.MonkeyPatch) -> None:
    """Weights are at most 100, yet 100 x a corpus of millions of pairs is more than a machine's
    memory: the total is checked against it first, in one line."""
    monkeypatch.setattr(dataset, "physical_memory", lambda: 4 << 20)  # a plan of 32,768 pairs in half of it
    monkeypatch.setattr(BatchPlan, "epoch_rows", lambda *_: pytest.fail("the epoch was allocated"))
    mix, n = CorpusMix([plan_dataset, plan_dataset]), len(plan_dataset)
    with pytest.raises(DataError, match=rf"^the corpora's weights draw {101 * n:,} pairs an epoch \(1 x {n:,}, 100 x "
                                        rf"{n:,}\), whose batch plan would take about 0\.0 GiB of this machine's 0\.0 "
                                        rf"GiB: lower the weights"):
        BatchPlan(mix, 200, seed=3, weights=(1.0, 100.0))
    BatchPlan(mix, 200, seed=3, weights=(1.0, 50.0))  # within half of it
