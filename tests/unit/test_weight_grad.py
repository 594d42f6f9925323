"""The backward split in B and W (tensor_parallel/weight_grad.py), one process: B then W gives
the ordinary backward's gradients, and each parameter's post-accumulate-grad hook (DDP's)
fires once per microbatch. In fp64 (the two paths sum in other orders), compared within the chain
bound of tests/rounding.py."""
import pytest
import torch

from megatron.core.comm import PlanGroup
from megatron.core.tensor_parallel import weight_grad
from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding
from megatron.core.transformer.norm import LayerNorm, RMSNorm
from tests.rounding import assert_chain_close

ONE = PlanGroup(1)
DT = torch.float64


def _layers():
    yield "column", ColumnParallelLinear(6, 8, group=ONE).to(DT), DT
    yield "row", RowParallelLinear(8, 6, group=ONE).to(DT), DT
    yield "column no bias", ColumnParallelLinear(6, 8, group=ONE, bias=False).to(DT), DT
    yield "embedding", VocabParallelEmbedding(16, 6, group=ONE, unpadded_vocab_size=16).to(DT), torch.long
    yield "layernorm", LayerNorm(6).to(DT), DT
    yield "rmsnorm", RMSNorm(6).to(DT), DT


def _randomise(module):
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype))


def _inputs(module, dtype, n):
    g = torch.Generator().manual_seed(2)
    width = module.weight.shape[-1] if not isinstance(module, VocabParallelEmbedding) else None
    if dtype == torch.long:
        return [torch.randint(0, 16, (5, 2), generator=g) for _ in range(n)]
    return [torch.randn(5, 2, width, generator=g, dtype=dtype).requires_grad_() for _ in range(n)]


def _out(module, x):
    y = module(x)
    return y[0] if isinstance(y, tuple) else y


@pytest.mark.parametrize("name,module,dtype", list(_layers()), ids=lambda v: v if isinstance(v, str) else "")
def test_b_then_w_equals_the_ordinary_backward(name, module, dtype):
    _randomise(module)
    calls = []
    for p in module.parameters():
        p.register_post_accumulate_grad_hook(lambda p: calls.append(p))
    params = list(module.parameters())
    xs = _inputs(module, dtype, 2)
    g = torch.Generator().manual_seed(3)
    grads = [torch.randn(_out(module, x).shape, generator=g, dtype=DT) for x in xs]

    for x, gy in zip(xs, grads):  # reference: two microbatches, ordinary backward
        _out(module, x).backward(gy)
    want = [p.grad.clone() for p in params]
    want_x = [x.grad.clone() for x in xs if x.requires_grad]
    assert len(calls) == 2 * len(params)

    module.zero_grad()
    calls.clear()
    xs = [x.detach().requires_grad_() if x.is_floating_point() else x for x in xs]
    with weight_grad.splitting():
        outs = [_out(module, x) for x in xs]
    for i, (y, gy) in enumerate(zip(outs, grads)):
        before = [None if p.grad is None else p.grad.clone() for p in params]
        with weight_grad.deferring() as work:  # B: the input gradient only
            y.backward(gy)
        assert len(calls) == len(params) * i  # no hook, no .grad change
        assert all((p.grad is None) if b is None else torch.equal(p.grad, b) for p, b in zip(params, before))
        weight_grad.apply(work)  # W: each parameter's hook once for this microbatch
        assert len(calls) == len(params) * (i + 1)
    for p, w in zip(params, want):
        assert_chain_close(p.grad, w, name)
    for x, w in zip([x for x in xs if x.requires_grad], want_x):
        assert_chain_close(x.grad, w, name + " input")


def test_a_table_used_twice_in_a_microbatch_gets_one_summed_gradient():
    emb = VocabParallelEmbedding(16, 6, group=ONE, unpadded_vocab_size=16).to(DT)
    _randomise(emb)
    ids = torch.randint(0, 16, (5, 2), generator=torch.Generator().manual_seed(0))

    def loss():
        return (weight_grad.linear(emb(ids), emb.weight) if weight_grad.split_enabled()
                else torch.nn.functional.linear(emb(ids), emb.weight)).square().sum()

    loss().backward()
    want = emb.weight.grad.clone()
    emb.zero_grad()
    calls = []
    emb.weight.register_post_accumulate_grad_hook(lambda p: calls.append(p))
    with weight_grad.splitting():
        y = loss()
    with weight_grad.deferring() as work:
        y.backward()
    assert emb.weight.grad is None and len(work) == 2
    weight_grad.apply(work)
    assert len(calls) == 1 and not work
    assert_chain_close(emb.weight.grad, want, "table")


def test_outside_deferring_the_split_functions_compute_everything():
    lin = ColumnParallelLinear(6, 8, group=ONE)
    _randomise(lin)
    x = torch.randn(5, 2, 6, generator=torch.Generator().manual_seed(4))
    with weight_grad.splitting():
        lin(x)[0].sum().backward()
    assert lin.weight.grad is not None and lin.bias.grad is not None
    assert not weight_grad.split_enabled()
