"""csrc/fused/bind_wgrad.cpp on a GPU: main += g^T x in fp32 against an fp64 reference (bf16, fp16, fp32
operands), the torch path of wgrad_fusion.accumulate the same within the same bound, every bad input a
Python exception, and a linear layer's weight gradient added into its grad sink by the kernel."""
import pytest
import torch

from megatron.core.tensor_parallel import wgrad_fusion

U = 2.0 ** -24


def _operands(dtype, t=300, out=96, inp=80):
    gen = torch.Generator(device="cuda").manual_seed(0)
    g = torch.randn(t, out, device="cuda", generator=gen).to(dtype)
    x = torch.randn(t, inp, device="cuda", generator=gen).to(dtype)
    main = torch.randn(out, inp, device="cuda", generator=gen)
    return g, x, main


def _bound(main, g, x):
    # a sum of t exact (or once-rounded) products in fp32 and main: (t + 2) u times the magnitudes
    return (g.shape[0] + 2) * U * (main.double().abs() + g.double().abs().t() @ x.double().abs())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_kernel_adds_the_product_in_fp32(ext, dtype):
    g, x, main = _operands(dtype)
    exact = main.double() + g.double().t() @ x.double()
    bound = _bound(main, g, x)
    assert ext.wgrad_gemm_accumulate(x, g, main) is True
    assert ((main.double() - exact).abs() <= bound).all()
    torch_main = _operands(dtype)[2]
    wgrad_fusion._torch_accumulate(x, g, torch_main)
    assert ((torch_main.double() - exact).abs() <= bound).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_first_gradient_writes_without_reading(ext, dtype):
    """accumulate=False (a step's first gradient, beta 0): main = g^T x whatever main held, NaN included."""
    g, x, main = _operands(dtype)
    main.fill_(float("nan"))
    exact = g.double().t() @ x.double()
    assert ext.wgrad_gemm_accumulate(x, g, main, False) is True
    assert ((main.double() - exact).abs() <= _bound(torch.zeros_like(main), g, x)).all()
    empty_g, empty_x, stale = _operands(dtype, t=0)
    ext.wgrad_gemm_accumulate(empty_x, empty_g, stale, False)
    assert torch.equal(stale, torch.zeros_like(stale))


def test_empty_rows_add_nothing(ext):
    g, x, main = _operands(torch.bfloat16, t=0)
    before = main.clone()
    ext.wgrad_gemm_accumulate(x, g, main)
    assert torch.equal(main, before)


def test_bad_inputs_raise(ext):
    g, x, main = _operands(torch.bfloat16)
    cases = [
        ((x.cpu(), g, main), "CUDA tensor"),
        ((x, g.float(), main), "one dtype"),
        ((x.double(), g.double(), main), "bfloat16, float16 or float32"),
        ((x, g, main.bfloat16()), "main must be float32"),
        ((x, g, main.t()), "contiguous"),
        ((x.t(), g, main), "contiguous|rows"),
        ((x[:-1], g, main), "same rows"),
        ((x, g, main[:, :-1].contiguous()), "main must be"),
        ((x.unsqueeze(0), g, main), "2-D"),
    ]
    for args, message in cases:
        with pytest.raises((ValueError, RuntimeError), match=message):
            ext.wgrad_gemm_accumulate(*args)
    overlap = torch.zeros(96 * 80 + 300 * 80, device="cuda")
    with pytest.raises(RuntimeError):  # main shares memory with x
        ext.wgrad_gemm_accumulate(overlap[:300 * 80].view(300, 80), g.float(), overlap[80:80 + 96 * 80].view(96, 80))


def test_linear_layer_uses_the_kernel(ext):
    from megatron.core.comm import PlanGroup
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear
    from megatron.core.tensor_parallel.param_meta import set_grad_sink

    layer = ColumnParallelLinear(64, 32, group=PlanGroup(1), params_dtype=torch.bfloat16, device="cuda")
    torch.nn.init.normal_(layer.weight)
    main = torch.zeros(32, 64, device="cuda")

    class Sink:
        added = 0

        def grad_target(self, p):
            return main

        def grad_is_first(self, p):  # the buffers start zeroed: every gradient adds
            return False

        def grad_added(self, p):
            Sink.added += 1

    set_grad_sink(layer.weight, Sink())
    x = torch.randn(16, 2, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    gy = torch.randn(16, 2, 32, device="cuda", dtype=torch.bfloat16)
    layer(x)[0].backward(gy)
    assert Sink.added == 1 and layer.weight.grad is None
    g2, x2 = gy.reshape(-1, 32), x.detach().reshape(-1, 64)
    exact = g2.double().t() @ x2.double()
    assert ((main.double() - exact).abs() <= _bound(torch.zeros_like(main), g2, x2)).all()
    assert wgrad_fusion.impl("cuda") == "csrc"
