"""FP8 linears on a GPU (torch._scaled_mm; NOT run where this was written: no GPU there). Each recipe's
forward, input and weight gradients against fp64 products of the same FP8 values, within the fp32
accumulation bound of tests/unit/test_fp8_recipes.py. Blockwise runs row-scaled _scaled_mm calls with an
fp32 output, which some torch/cuBLAS versions refuse (row-wise scaling with bf16 output only): a failure
here says the GPU path of gemm.blockwise_mm needs another kernel."""
import pytest

from megatron.core.fp8.linear import fp8_linear
from megatron.core.fp8.recipes import build_recipe
from tests.unit.test_fp8_recipes import _accumulation_bound, _case, _references, _settings


@pytest.mark.parametrize("name", ["tensorwise", "delayed", "blockwise"])
def test_fp8_linear_on_gpu_equals_fp64_of_the_same_fp8_values(name):
    x, w, grad = _case(0)
    xr, wr = x.cuda().requires_grad_(), w.cuda().requires_grad_()
    y = fp8_linear(xr, wr, None, build_recipe(_settings(name), (), ()))
    y.backward(grad.cuda())
    for which, got in (("forward", y), ("dgrad", xr.grad), ("wgrad", wr.grad)):
        a, b = _references(name, x, w, grad)[which]
        err = (got.detach().cpu().double() - a @ b.t()).abs()
        assert (err <= _accumulation_bound(a, b)).all(), which
