"""MoE under the zero-bubble backward split (pipeline_parallel/backward_split.py), one process: B leaves
every expert's, the router's and the shared experts' weight gradients untouched and fires no parameter
hook; W then gives the ordinary backward's gradients bit for bit, each parameter's hook once per
microbatch (what DDP's buckets count); B's and W's GEMMs are the ordinary backward's, none twice
(tests/split_check.py), with and without gradient-accumulation fusion. Loop and grouped experts
(torch._grouped_mm and its loop fallback), GeLU and SwiGLU, with and without biases, and an expert that
receives no token."""
import pytest
import torch

from megatron.core.pipeline_parallel.backward_split import backward_input
from megatron.core.transformer.moe import grouped_gemm, step_hooks
from megatron.core.transformer.moe.grouped_gemm import grouped_mm
from tests.split_check import check_split
from tests.unit.test_moe import cfg, layer

CASES = {
    "loop-gelu": dict(),
    "loop-swiglu-shared": dict(swiglu=True, moe_shared_expert_intermediate_size=12),
    "loop-gelu-bias": dict(add_bias_linear=True),
    "grouped-gelu": dict(moe_grouped_gemm=True),
    "grouped-swiglu": dict(moe_grouped_gemm=True, swiglu=True),
    "grouped-swiglu-bias": dict(moe_grouped_gemm=True, swiglu=True, add_bias_linear=True),
    # the grouped path's loop of matmuls (a torch without _grouped_mm, or shapes it does not take)
    "grouped-fallback-gelu": dict(moe_grouped_gemm=True, fallback=True),
    "grouped-fallback-swiglu-bias": dict(moe_grouped_gemm=True, swiglu=True, add_bias_linear=True, fallback=True),
}


@pytest.mark.parametrize("fusion", [False, True], ids=["autograd", "fused"])
@pytest.mark.parametrize("name", list(CASES))
def test_expert_weight_grads_wait_for_w_and_equal_the_ordinary_backward(name, monkeypatch, fusion):
    kw = dict(CASES[name])
    monkeypatch.setattr(grouped_gemm, "_HAS_GROUPED", grouped_gemm._HAS_GROUPED and not kw.pop("fallback", False))
    m = layer(cfg(moe_router_topk=2, moe_aux_loss_coeff=0.1, moe_z_loss_coeff=0.01, **kw))
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():  # biases start at zero: make their gradients' path matter
        for n, p in m.named_parameters():
            if "bias" in n:
                p.copy_(torch.randn(p.shape, generator=g))
    names = [n for n, _ in m.named_parameters()]
    assert any(".local_experts." in n for n in names) and "router.weight" in names
    step_hooks.bind(m).start_iteration(1.0, 4)  # the balance losses of both runs of two microbatches
    xs = [torch.randn(5, 3, 16, generator=g) for _ in range(2)]
    grads = [torch.randn(5, 3, 16, generator=g) for _ in range(2)]

    def step(module, x, gy):
        inp = x.clone().requires_grad_()
        return module(inp), gy, inp
    figures = check_split(m, [lambda module, x=x, gy=gy: step(module, x, gy) for x, gy in zip(xs, grads)],
                          fusion=fusion)
    assert figures["b_gemms"] > 0 and figures["w_gemms"] > 0
    if fusion:  # gradient-accumulation fusion: every expert's, the router's and shared experts' weights
        assert figures["fused"] == sorted(n for n in names if n.endswith(("weight", "_weight"))), figures["fused"]


@pytest.mark.parametrize("bias", [False, True])
def test_grouped_mm_with_an_empty_group_gives_its_weight_a_zero_gradient_in_w(bias):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(10, 16, generator=g)
    ws = [torch.randn(8, 16, generator=g, requires_grad=True) for _ in range(3)]
    bs = [torch.randn(8, generator=g, requires_grad=True) for _ in range(3)] if bias else []
    counts, gy = [4, 0, 6], torch.randn(10, 8, generator=g)

    def forward(inp):
        y = grouped_mm(inp, torch.stack(ws).transpose(1, 2), counts)
        return y + torch.cat([b.expand(n, 8) for b, n in zip(bs, counts)]) if bias else y
    inp = x.clone().requires_grad_()
    want = torch.autograd.grad(forward(inp), [inp] + ws + bs, gy)
    inp = x.clone().requires_grad_()
    work = backward_input(forward(inp), gy, inp, {})
    assert torch.equal(inp.grad, want[0]) and all(p.grad is None for p in ws + bs)
    work.run()
    for p, w in zip(ws + bs, want[1:]):
        assert torch.equal(p.grad, w)
    assert not ws[1].grad.any() and (not bias or not bs[1].grad.any())
