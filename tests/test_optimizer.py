"""optimizer.py: weight decay on weight matrices only, the fused kernels, and the settings a resume applies."""
from __future__ import annotations

import pytest
import torch

from config import PRESETS, get_config
from model import build_model
from nmt.training.optimizer import apply_settings, build_optimizer


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


def test_a_resume_applies_the_configs_betas_eps_and_weight_decay_and_says_what_changed(capsys) -> None:
    config = {**get_config(), **PRESETS["tiny"], "weight_decay": 0.01}
    optimizer = build_optimizer(build_model(config, 40, 50), config)
    changed = {**config, "adam_beta2": 0.99, "adam_eps": 1e-6, "weight_decay": 0.05}
    apply_settings(optimizer, changed, config)
    decay, no_decay = optimizer.param_groups
    assert decay["betas"] == no_decay["betas"] == (config["adam_beta1"], 0.99)
    assert decay["eps"] == no_decay["eps"] == 1e-6 and (decay["weight_decay"], no_decay["weight_decay"]) == (0.05, 0.0)
    assert capsys.readouterr().err == ("resuming with changed optimizer settings, applied from here on: --weight_decay "
                                       "0.01 -> 0.05, --adam_beta2 0.98 -> 0.99, --adam_eps 1e-09 -> 1e-06\n")
    apply_settings(optimizer, changed, changed)
    assert capsys.readouterr().err == ""
