"""The backward split in B and W (pipeline_parallel/backward_split.py) on each parallel layer and norm,
one process: B then W gives the ordinary backward's gradients bit for bit, each parameter's
post-accumulate-grad hook (DDP's) once per microbatch in W and none in B (tests/split_check.py); with
gradient-accumulation fusion too, the linears' weights then reaching their grad sink in W."""
import pytest
import torch
import torch.nn.functional as F

from megatron.core.comm import PlanGroup
from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding
from megatron.core.transformer.norm import LayerNorm, RMSNorm
from tests.split_check import check_split

ONE = PlanGroup(1)


def _layers():
    yield "column", ColumnParallelLinear(6, 8, group=ONE)
    yield "row", RowParallelLinear(8, 6, group=ONE)
    yield "column no bias", ColumnParallelLinear(6, 8, group=ONE, bias=False)
    yield "embedding", VocabParallelEmbedding(16, 6, group=ONE, unpadded_vocab_size=16)
    yield "layernorm", LayerNorm(6)
    yield "rmsnorm", RMSNorm(6)


def _randomise(module):
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g))


def _out(module, x):
    y = module(x)
    return y[0] if isinstance(y, tuple) else y


def _steps(module, n):
    g = torch.Generator().manual_seed(2)
    steps = []
    for _ in range(n):
        if isinstance(module, VocabParallelEmbedding):  # token ids: no input gradient (a first stage)
            x, inp = torch.randint(0, 16, (5, 2), generator=g), None
        else:
            x, inp = torch.randn(5, 2, module.weight.shape[-1], generator=g), True
        gy = torch.randn(_out(module, x).shape, generator=g)
        steps.append(lambda m, x=x, gy=gy, inp=inp: _step(m, x, gy, inp))
    return steps


def _step(module, x, gy, inp):
    x = x.clone().requires_grad_() if inp else x
    return _out(module, x), gy, x if inp else None


@pytest.mark.parametrize("fusion", [False, True], ids=["autograd", "fused"])
@pytest.mark.parametrize("name,module", list(_layers()), ids=lambda v: v if isinstance(v, str) else "")
def test_b_then_w_equals_the_ordinary_backward(name, module, fusion):
    """fusion: gradient-accumulation fusion, the linears' weight gradients added into a grad sink in W."""
    _randomise(module)
    figures = check_split(module, _steps(module, 2), fusion=fusion)
    linear = name.startswith(("column", "row"))
    assert (figures["b_gemms"] > 0) == linear
    if fusion:
        assert figures["fused"] == (["weight"] if linear else [])


def test_a_table_used_twice_in_a_stage_gets_one_summed_gradient():
    """The table is looked up (its gradient joins the chain below the input) and multiplies the result
    (a source above it): one group with two sources, the chain between them run again in W."""
    emb = VocabParallelEmbedding(16, 6, group=ONE, unpadded_vocab_size=16)
    _randomise(emb)
    g = torch.Generator().manual_seed(0)
    ids, x = torch.randint(0, 16, (5, 2), generator=g), torch.randn(5, 2, 6, generator=g)

    def step(m):
        inp = x.clone().requires_grad_()
        return F.linear(torch.tanh(inp + m(ids)), m.weight).square().sum(), None, inp
    check_split(emb, [step, step], reruns=1)  # the product's input gradient, again in W
