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
        after_step(m, ())
        check_split(m, _steps())
