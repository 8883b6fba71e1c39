"""optimizer.py: weight decay on weight matrices only, and the learning-rate schedules."""
from __future__ import annotations

import pytest
import torch

from config import PRESETS, get_config
from model import build_model
from nmt.training.optimizer import build_optimizer, lr_factor


def test_weight_decay_applies_to_weight_matrices_only() -> None:
    """Decay on the linear layers' weights; never on biases, LayerNorms or embeddings (nor on the
    projection when it is the tied embedding matrix)."""
    for tied in (False, True):
        config = dict(get_config(), d_model=16, num_heads=2, d_ff=32, num_layers=1, seq_len=16, weight_decay=0.01,
                      joint_vocab=tied, tie_embeddings=tied)
        model = build_model(config, 30, 30)
        decay, no_decay = build_optimizer(model, config).param_groups
        names = {id(p): name for name, p in model.named_parameters()}
        decayed = {names[id(p)] for p in decay["params"]}
        kept = {names[id(p)] for p in no_decay["params"]}
        assert (decay["weight_decay"], no_decay["weight_decay"]) == (0.01, 0.0)
        assert decayed | kept == set(names.values()) and not decayed & kept
        assert "encoder.layers.0.self_attention.w_q.weight" in decayed
        assert "decoder.layers.0.feed_forward.linear_2.weight" in decayed
        assert "encoder.layers.0.self_attention.w_q.bias" in kept and "decoder.norm.weight" in kept
        assert "src_embed.embedding.weight" in kept
        assert ("projection_layer.proj.weight" in decayed) is not tied


def test_inverse_sqrt_schedule_without_warmup_decays_from_the_first_step() -> None:
    config = dict(get_config(), lr=1e-3, warmup_steps=0, warmup_fraction=0.0)
    assert [lr_factor(step, config, 100) for step in (0, 3, 99)] == pytest.approx([1.0, 0.5, 0.1])


def test_inverse_sqrt_schedule_peaks_at_warmup() -> None:
    config = dict(get_config(), lr=1e-3, warmup_steps=100)
    factors = [lr_factor(step, config, 1000) for step in range(400)]
    assert factors[99] == pytest.approx(1.0)
    assert factors[0] == pytest.approx(0.01)
    assert factors[399] == pytest.approx((100 / 400) ** 0.5)
    assert max(factors) == pytest.approx(1.0)


def test_warmup_is_a_fraction_of_the_run_unless_given_in_steps() -> None:
    config = dict(get_config(), lr=1e-3)  # the defaults: warmup_steps 0, warmup_fraction 0.1
    factors = [lr_factor(step, config, 4600) for step in range(4600)]
    assert factors.index(max(factors)) == 459 and factors[459] == pytest.approx(1.0)
    assert factors[-1] == pytest.approx((460 / 4600) ** 0.5)
    assert lr_factor(99, dict(config, warmup_steps=100), 4600) == pytest.approx(1.0)


def test_cosine_schedule_ends_at_min_lr() -> None:
    config = dict(get_config(), lr=1e-3, warmup_steps=10, lr_schedule="cosine", min_lr=1e-5)
    assert lr_factor(9, config, 100) == pytest.approx(1.0)
    assert lr_factor(99, config, 100) == pytest.approx(1e-2)


def test_wsd_holds_the_peak_then_decays_linearly_to_min_lr() -> None:
    # 10 steps of warmup, 90 after it: the last 30% (27 steps) decay, the 63 before hold the peak.
    config = dict(get_config(), lr=1e-3, warmup_steps=10, lr_schedule="wsd", decay_fraction=0.3, min_lr=1e-5)
    factors = [lr_factor(step, config, 100) for step in range(100)]
    assert factors[9:73] == pytest.approx([1.0] * 64)
    assert factors[73] < 1.0 and factors[99] == pytest.approx(1e-2)
    drops = [a - b for a, b in zip(factors[72:], factors[73:])]
    assert drops == pytest.approx([drops[0]] * len(drops)) and drops[0] == pytest.approx(0.99 / 27)


def test_a_decay_whose_end_moved_goes_on_from_where_it_stood_to_min_lr_at_the_new_end() -> None:
    """Re-timed at step 85 of 100 (time_budget.decay_retime_step), the run now ends at 95: from
    step 85 on the decay is linear from the multiplier it stood at to min_lr at step 95, no jump."""
    config = dict(get_config(), lr=1e-3, warmup_steps=10, lr_schedule="wsd", decay_fraction=0.3, min_lr=1e-5)
    anchor = (85, lr_factor(85, config, 100))
    moved = [lr_factor(step, config, 95, 10, anchor) for step in range(95)]
    assert moved[:85] == pytest.approx([lr_factor(step, config, 95) for step in range(85)])  # before it: the schedule's
    assert moved[85] == anchor[1] and moved[94] == pytest.approx(1e-2)
    drops = [a - b for a, b in zip(moved[85:], moved[86:])]
    assert drops == pytest.approx([(anchor[1] - 1e-2) / 9] * 9)
    assert lr_factor(85, config, 95) < anchor[1] - 0.1  # the schedule of 95 steps alone jumps down at 85


def test_adamw_is_fused_on_cuda_and_the_cpu_and_torch_s_default_on_meta() -> None:
    """The parameters' device decides; on 'cuda' fake tensors (no GPU needed) the fused kernel is asked for."""
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
    config = {**get_config(), **PRESETS["tiny"]}
    model = build_model(config, 40, 50)
    assert build_optimizer(model, config).defaults["fused"] is True
    assert not build_optimizer(build_model(config, 40, 50).to("meta"), config).defaults["fused"]
    mode = FakeTensorMode()
    for module in model.modules():
        for name, parameter in list(module._parameters.items()):
            module._parameters[name] = torch.nn.Parameter(FakeTensor(mode, parameter.detach().to("meta"),
                                                                     torch.device("cuda", 0)))
    with mode:
        assert build_optimizer(model, config).defaults["fused"] is True


def test_the_fused_cpu_step_is_adamw_s_step() -> None:
    """Three steps of the fused kernel give the weights the per-tensor loop gives, weight decay included."""
    config = {**get_config(), **PRESETS["tiny"], "weight_decay": 0.1}
    torch.manual_seed(0)
    fused, plain = build_model(config, 40, 50), build_model(config, 40, 50)
    plain.load_state_dict(fused.state_dict())
    optimizers = [build_optimizer(fused, config), build_optimizer(plain, config)]
    for group in optimizers[1].param_groups:
        group["fused"], group["foreach"] = False, False
    for step in range(3):
        for model, optimizer in zip((fused, plain), optimizers):
            torch.manual_seed(step)
            for parameter in model.parameters():
                parameter.grad = torch.randn_like(parameter)
            optimizer.step()
    assert optimizers[0].param_groups[0]["fused"] and not optimizers[1].param_groups[0]["fused"]
    for a, b in zip(fused.parameters(), plain.parameters()):
        torch.testing.assert_close(a, b)
