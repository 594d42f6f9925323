"""The FP8 linears under the zero-bubble split (backward_split.py): B (input gradients) then W (weight
gradients) equals the ordinary backward bit for bit, W alone runs the weight-gradient GEMMs and fires each
weight's post-accumulate-grad hook (DDP's) once: the FP8 weight gradient lands in W like any linear's."""
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from megatron.core.comm import PlanGroup
from megatron.core.fp8.step import after_step
from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
from tests.split_check import check_split


class Fp8Block(nn.Module):
    def __init__(self, recipe, h=128, f=256):
        super().__init__()
        fp8 = SimpleNamespace(fp8_recipe=recipe, fp8_format="hybrid", fp8_margin=0, fp8_amax_history_len=2,
                              fp8_amax_compute_algo="max")
        one = PlanGroup(1)
        self.fc1 = ColumnParallelLinear(h, f, group=one, fp8=fp8)
        self.fc2 = RowParallelLinear(f, h, group=one, fp8=fp8)
        g = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(x)[0]))[0]


def _steps(n=2):
    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(4, 2, 128, generator=g), torch.randn(4, 2, 128, generator=g) * 1e-2) for _ in range(n)]

    def step(m, x, gy):
        inp = x.clone().requires_grad_()
        return m(inp), gy, inp
    return [lambda m, x=x, gy=gy: step(m, x, gy) for x, gy in data]


@pytest.mark.parametrize("recipe", ["tensorwise", "delayed", "blockwise"])
def test_fp8_linears_split_exactly(recipe):
    m = nn.Sequential(Fp8Block(recipe), Fp8Block(recipe))
    figures = check_split(m, _steps())
    assert figures["w_gemms"] > 0 and figures["b_gemms"] > 0
    if recipe == "delayed":  # and again with scales from the history
        after_step(m, None)
        check_split(m, _steps())


class _Sink:
    """DDP's grad-sink contract (wgrad_fusion.py): a zeroed fp32 buffer per parameter, gradients counted."""

    def __init__(self, params):
        self.main = {id(p): torch.zeros(p.shape) for p in params}
        self.added = {id(p): 0 for p in params}

    def grad_target(self, p):
        return self.main[id(p)]

    def grad_is_first(self, p):
        return False

    def grad_added(self, p):
        self.added[id(p)] += 1


@pytest.mark.parametrize("recipe", ["tensorwise", "blockwise"])
def test_fp8_weight_gradient_goes_to_the_grad_sink(recipe):
    """Gradient-accumulation fusion: the FP8 weight gradient is added into the sink in fp32, bit for bit the
    one autograd returns without a sink, and no .grad is made."""
    from megatron.core.tensor_parallel.param_meta import set_grad_sink
    m = Fp8Block(recipe)
    step = _steps(1)[0]
    out, gy, _ = step(m)
    out.backward(gy)
    want = {n: p.grad.clone() for n, p in m.named_parameters()}
    m.zero_grad(set_to_none=True)
    weights = [m.fc1.weight, m.fc2.weight]
    sink = _Sink(weights)
    for w in weights:
        set_grad_sink(w, sink)
    out, gy, _ = step(m)
    out.backward(gy)
    for name, w in (("fc1.weight", m.fc1.weight), ("fc2.weight", m.fc2.weight)):
        assert w.grad is None and sink.added[id(w)] == 1
        assert torch.equal(sink.main[id(w)], want[name])
    assert torch.equal(m.fc1.bias.grad, want["fc1.bias"])
