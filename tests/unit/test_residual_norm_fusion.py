"""--residual-norm-fusion (transformer/norm.py residual_then): the residual add and the next norm as one compiled
function on CUDA; elsewhere the add, then the norm, exactly as the layer ran them before. The compiled functions run
here under inductor's CPU backend against the eager add-then-norm, values and both inputs' gradients."""
import dataclasses

import pytest
import torch
import torch.nn.functional as F

from megatron.core.config import TransformerConfig
from megatron.core.fusions import norm as norm_front
from megatron.core.parallel_layout import ParallelLayout
from megatron.core.transformer import norm as norm_module
from megatron.core.transformer.layer import TransformerLayer

H = 64


def _inputs(dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    x, residual = (torch.randn(8, 3, H, generator=g).to(dtype) for _ in range(2))
    weight, bias = 1 + 0.1 * torch.randn(H, generator=g), 0.1 * torch.randn(H, generator=g)
    grads = [torch.randn(8, 3, H, generator=g).to(dtype) for _ in range(2)]  # for the sum, for the norm
    return x, residual, weight.to(dtype), bias.to(dtype), grads


def _reference(rms, x, residual, weight, bias):
    s = residual + x
    if rms:
        sf = s.to(torch.promote_types(s.dtype, torch.float32))
        return s, (sf * torch.rsqrt(sf.pow(2).mean(-1, keepdim=True) + 1e-5)).to(s.dtype) * weight
    return s, F.layer_norm(s, (H,), weight, bias, 1e-5)


def _run(fn, rms, x, residual, weight, bias, grads):
    leaves = [t.clone().requires_grad_() for t in (x, residual, weight, bias)]
    args = leaves[:3] + ([] if rms else [leaves[3]]) + [1e-5]
    s, y = fn(*args)
    torch.autograd.backward([s, y], grads)
    return [s.detach(), y.detach()] + [t.grad for t in leaves[:(3 if rms else 4)]]


@pytest.mark.parametrize("rms", [False, True], ids=["layernorm", "rmsnorm"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_functions_match_add_then_norm(rms, dtype):
    x, residual, weight, bias, grads = _inputs(dtype)
    fn = norm_front.residual_rms_norm if rms else norm_front.residual_layer_norm
    got = _run(torch.compile(fn, dynamic=False), rms, x, residual, weight, bias, grads)
    # the reference in fp64 from the same inputs: the add, then the norm, as the layer runs them unfused
    wide = [t.double() for t in (x, residual, weight, bias)] + [[g.double() for g in grads]]
    want = _run(lambda *a: _reference(rms, *(a[:3] + (None,) if rms else a[:4])), rms, *wide)
    for name, a, b in zip(["sum", "norm", "d x", "d residual", "d weight", "d bias"], got, want):
        b = b.float()
        # fp32: reduction orders; bf16: a few roundings of the result, and sums of 24 rows for the weights'
        tol = 1e-5 * (1 + b.abs()) if dtype == torch.float32 else 2.0 ** -6 * (b.abs() + b.abs().max())
        assert ((a.float() - b).abs() <= tol).all(), (name, (a.float() - b).abs().max())
    assert torch.equal(got[2], got[3])  # x and the residual get one gradient: the sum's plus the norm's


def _layer(fusion, rms):
    cfg = TransformerConfig(num_layers=1, hidden_size=H, num_attention_heads=4, ffn_hidden_size=4 * H,
                            hidden_dropout=0.0, attention_dropout=0.0, init_method_std=0.02,
                            normalization="RMSNorm" if rms else "LayerNorm", residual_norm_fusion=fusion)
    torch.manual_seed(1)
    layer = TransformerLayer(cfg, ParallelLayout(1).plan_groups(0), 1)
    for p in layer.parameters():
        torch.nn.init.normal_(p, std=0.05)
    return layer


def _without_and_with(rms):
    """[output, input gradient, parameter gradients] of the layer without, then with the flag."""
    x = torch.randn(8, 2, H, generator=torch.Generator().manual_seed(2))
    out = []
    for fusion in (False, True):
        layer, xi = _layer(fusion, rms), x.clone().requires_grad_()
        y = layer(xi)
        y.pow(2).sum().backward()
        out.append([y.detach(), xi.grad] + [p.grad for p in layer.parameters()])
    return out


@pytest.mark.parametrize("rms", [False, True], ids=["layernorm", "rmsnorm"])
def test_a_layer_with_the_flag_off_cuda_is_the_layer_without_it_bit_for_bit(rms):
    assert all(torch.equal(a, b) for a, b in zip(*_without_and_with(rms)))


def test_the_layer_runs_the_compiled_function_where_it_fits(monkeypatch):
    """Made to fit on the CPU: the layer's second norm runs the compiled function (forward and backward) and the
    layer's output and gradients stay within fp32 rounding of the unfused layer's."""
    ran = []
    monkeypatch.setattr(norm_front, "residual_fusion_fits", lambda *t: True)
    monkeypatch.setattr(norm_module, "compiled", lambda fn: ran.append(fn.__name__) or torch.compile(fn, dynamic=False))
    out = _without_and_with(False)
    assert ran == ["residual_layer_norm"]
    for a, b in zip(*out):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-6)


def test_config_default_is_off():
    field = next(f for f in dataclasses.fields(TransformerConfig) if f.name == "residual_norm_fusion")
    assert field.default is False


def test_the_start_up_log_names_where_it_runs(monkeypatch):
    from megatron.core import fusions
    c = TransformerConfig(num_layers=1, hidden_size=H, num_attention_heads=4, residual_norm_fusion=True)
    assert dict(fusions.describe(c, "cpu"))["residual add + norm"].startswith("the add, then the norm")
    monkeypatch.setattr(fusions._common, "importable", lambda module: True)  # as on a GPU machine with triton
    assert dict(fusions.describe(c, "cuda"))["residual add + norm"].startswith("one kernel (torch.compile")
    post = dataclasses.replace(c, post_norm=True)
    assert "pre-norm layers" in dict(fusions.describe(post, "cuda"))["residual add + norm"]
    assert "residual add + norm" not in dict(fusions.describe(dataclasses.replace(c, residual_norm_fusion=False),
                                                              "cuda"))
