"""MoE under the zero-bubble backward split (tensor_parallel/weight_grad.py), one process: with
splitting on, B (a backward inside deferring()) leaves every expert's, the router's and the shared
experts' weight gradients untouched and fires no parameter hook; W (apply) then gives the ordinary
backward's gradients, each parameter's hook once per microbatch (what DDP's buckets count). Loop and
grouped experts, GeLU and SwiGLU, with and without biases. The layer runs in fp64 (the two paths sum in
other orders: compared within the chain bound of tests/rounding.py), where the grouped experts take the
loop of matmuls (torch._grouped_mm takes fp32 and bf16 only); the grouped kernel itself under the split
is the fp32 test at the end, each gradient within the rounding bound of its one GEMM or sum."""
import pytest
import torch

from megatron.core.tensor_parallel import weight_grad
from megatron.core.transformer.moe import aux_losses
from megatron.core.transformer.moe.grouped_gemm import grouped_linear, grouped_mm
from tests.rounding import assert_chain_close, assert_within, matmul_bound, sum_bound
from tests.unit.test_moe import cfg, layer

DT = torch.float64
CASES = {
    "loop-gelu": dict(),
    "loop-swiglu-shared": dict(swiglu=True, moe_shared_expert_intermediate_size=12),
    "loop-gelu-bias": dict(add_bias_linear=True),
    "grouped-gelu": dict(moe_grouped_gemm=True),
    "grouped-swiglu": dict(moe_grouped_gemm=True, swiglu=True),
    "grouped-swiglu-bias": dict(moe_grouped_gemm=True, swiglu=True, add_bias_linear=True),
}


def _run(m, xs, grads, split):
    """Forward and backward of each microbatch; with split, B then W and the checks between them.
    Returns (param grads, input grads, hook calls per parameter)."""
    calls = {}
    handles = [p.register_post_accumulate_grad_hook(lambda p, n=n: calls.__setitem__(n, calls.get(n, 0) + 1))
               for n, p in m.named_parameters()]
    xs = [x.detach().requires_grad_() for x in xs]
    for i, (x, gy) in enumerate(zip(xs, grads)):
        with weight_grad.splitting(split):
            y = m(x)
        if not split:
            y.backward(gy)
            continue
        before = {n: None if p.grad is None else p.grad.clone() for n, p in m.named_parameters()}
        with weight_grad.splitting(), weight_grad.deferring() as work:  # B: input gradients only
            y.backward(gy)
        assert x.grad is not None
        assert all(v == i for v in calls.values()) and len(calls) in (0, len(before)), calls
        for n, p in m.named_parameters():
            assert (p.grad is None) if before[n] is None else torch.equal(p.grad, before[n]), f"{n} changed in B"
        weight_grad.apply(work)  # W
        assert len(calls) == len(before) and all(v == i + 1 for v in calls.values()), calls
    for h in handles:
        h.remove()
    return {n: p.grad.clone() for n, p in m.named_parameters()}, [x.grad for x in xs], calls


@pytest.mark.parametrize("name", list(CASES))
def test_expert_weight_grads_wait_for_w_and_equal_the_ordinary_backward(name):
    m = layer(cfg(moe_router_topk=2, moe_aux_loss_coeff=0.1, moe_z_loss_coeff=0.01, params_dtype=DT, **CASES[name]))
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():  # biases start at zero: make their gradients' path matter
        for n, p in m.named_parameters():
            if "bias" in n:
                p.copy_(torch.randn(p.shape, generator=g, dtype=DT))
    aux_losses.start_iteration(1.0, 2)
    xs = [torch.randn(5, 3, 16, generator=g, dtype=DT) for _ in range(2)]
    grads = [torch.randn(5, 3, 16, generator=g, dtype=DT) for _ in range(2)]
    want, want_x, want_calls = _run(m, xs, grads, split=False)
    m.zero_grad(set_to_none=True)
    got, got_x, calls = _run(m, xs, grads, split=True)
    assert calls == want_calls and set(calls) == {n for n, _ in m.named_parameters()}
    assert any(".local_experts." in n for n in got) and "router.weight" in got
    for n in want:
        assert_chain_close(got[n], want[n], n)
    for a, b in zip(got_x, want_x):
        assert_chain_close(a, b, "input gradient")


@pytest.mark.parametrize("bias", [False, True])
def test_grouped_linear_with_an_empty_group_defers_zero_gradients(bias):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(10, 16, generator=g, requires_grad=True)
    ws = [torch.randn(8, 16, generator=g, requires_grad=True) for _ in range(3)]
    bs = [torch.randn(8, generator=g, requires_grad=True) for _ in range(3)] if bias else [None] * 3
    counts = [4, 0, 6]  # fp32, rows of 64 bytes: torch._grouped_mm where this torch has it
    ref = grouped_mm(x, torch.stack(ws).transpose(1, 2), counts)
    if bias:
        ref = ref + torch.cat([b.expand(n, 8) for b, n in zip(bs, counts)])
    gy = torch.randn(ref.shape, generator=g)
    params = [x] + ws + [b for b in bs if b is not None]
    want = torch.autograd.grad(ref, params, gy)
    y = grouped_linear(x, ws, bs, counts)
    assert torch.equal(y, ref)
    with weight_grad.deferring() as work:
        y.backward(gy)
    assert all(p.grad is None for p in params[1:]) and len(work) == 1
    weight_grad.apply(work)
    # each gradient is one GEMM or sum per group, computed by the two paths in other orders
    rows = list(zip(x.detach().split(counts), gy.split(counts)))
    bounds = [torch.cat([matmul_bound(gi, w.detach()) for (_, gi), w in zip(rows, ws)])]
    bounds += [matmul_bound(gi.t(), xi) for xi, gi in rows]
    bounds += [sum_bound(gi, 0) for (_, gi), b in zip(rows, bs) if b is not None]
    for p, w, bound in zip(params, want, bounds):
        assert_within(p.grad, w, bound, "grouped linear gradient")
    assert not ws[1].grad.any() and (not bias or not bs[1].grad.any())
