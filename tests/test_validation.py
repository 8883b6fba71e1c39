"""validation.py's estimate of a validation's cost, which a run planned to its clock plans with: a
sample decoded to its references' length, whatever a young model writes, timed on its second decode.
Whole runs of train.py on the counting clock of test_clock_plan.py."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import train
from nmt.corpora.tokenizer import EOS_ID
from test_clock_plan import CountingClock, planned, run  # noqa: F401  (planned: a fixture)


def test_the_validation_estimate_decodes_to_the_references_length_not_the_cap(
        planned: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A young model rarely ends a sentence: decoded to the cap, a validation's estimate would be
    several times what validations cost later, and the plan would leave much of its budget unused."""
    from nmt.inference.decoding import max_output_tokens
    from nmt.inference.translator import TorchTranslator
    calls, decode = [], TorchTranslator.translate_batch

    def recorded(self, sources, options, max_tokens, *constraints):
        calls.append((max_tokens, max_output_tokens(max(len(source.ids) for source in sources), self.seq_len)))
        return decode(self, sources, options, max_tokens, *constraints)

    monkeypatch.setattr(TorchTranslator, "translate_batch", recorded)
    assert run(planned, tmp_path, CountingClock(), monkeypatch) == 0
    assert any(bound < cap for bound, cap in calls), calls  # the estimate's, below the cap validation decodes to



def test_a_sample_that_ends_at_once_is_timed_as_if_it_ran_to_the_references_length(
        planned: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A young model may end every sentence at its first step and decode the estimate's sample in
    a moment; validations later run to the references' length. The plan's decodes run to the bound
    they are given whatever the model writes."""
    from model import Transformer
    from nmt.inference.translator import TorchTranslator
    project, decode, ran = Transformer.project, TorchTranslator.translate_batch, []

    def ends_at_once(self, x):  # in evaluation, [EOS] first, far ahead of every other token
        logits = project(self, x)
        return logits if self.training else logits.index_fill(-1, torch.tensor([EOS_ID], device=x.device), 1e4)

    def recorded(self, sources, options, max_tokens, *constraints):
        found = decode(self, sources, options, max_tokens, *constraints)
        ran.append((max_tokens, {hypotheses[0].length for hypotheses in found}))
        return found

    monkeypatch.setattr(Transformer, "project", ends_at_once)
    monkeypatch.setattr(TorchTranslator, "translate_batch", recorded)
    assert run(planned, tmp_path, CountingClock(), monkeypatch) == 0
    # The plan's decodes come first, each twice (the second timed): validation's, then the fit's.
    assert len({bound for bound, _ in ran[:4]}) == 1 and all(lengths == {bound} for bound, lengths in ran[:4]), ran
    assert ran[4][1] == {1}, ran[4]  # validation itself: the model ends every sentence at once


def test_the_validation_estimate_times_a_decode_whose_shapes_it_has_seen(
        planned: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """A first decode pays once for its new shapes (on a GPU: kernels loaded, memory allocated), which
    a validation pays once, not once per batch: the plan times the sample's second decode."""
    from nmt.inference.translator import TorchTranslator
    decode, estimates = TorchTranslator.translate_batch, {}
    for first in ("cold", "warm"):
        calls = []

        def first_decodes_cold(self, sources, options, max_tokens, *constraints):
            calls.append(options)
            if first == "cold" and calls.count(options) == 1:
                for _ in range(50):  # 10 s on the counting clock
                    train.clock()
            return decode(self, sources, options, max_tokens, *constraints)

        monkeypatch.setattr(TorchTranslator, "translate_batch", first_decodes_cold)
        assert run(planned, tmp_path / first, CountingClock(), monkeypatch) == 0
        first_plan = re.search(r"(?<!re-timed )plan for [^;]*? and ([0-9.]+) s a validation", capsys.readouterr().err)
        estimates[first] = float(first_plan.group(1))
    assert estimates["cold"] == estimates["warm"], estimates
