"""The fronts' "compiled" implementation (torch.compile of their torch functions, chosen by the
kernel table where it beat our kernel and eager) against eager torch on the GPU, forward and
backward, bf16: the same math with other fusion, so within a few bf16 roundings."""
import pytest
import torch

from megatron.core.fusions import activations, norm, rope, softmax

U = 2.0 ** -8


def _grads(fn, *inputs):
    leaves = [t.detach().clone().requires_grad_(t.is_floating_point()) for t in inputs]
    out = fn(*leaves)
    out.backward(torch.ones_like(out))
    return [out.detach()] + [t.grad for t in leaves if t.requires_grad]


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


CASES = {
    "layernorm": (lambda impl: lambda x, w, b: norm.layer_norm(x, w, b, 1e-5, impl),
                  [(512, 2, 1024), (1024,), (1024,)]),
    "rmsnorm": (lambda impl: lambda x, w: norm.rms_norm(x, w, 1e-5, impl), [(512, 2, 1024), (1024,)]),
    "rope": (lambda impl: lambda x, c, s: rope.apply_rope(x, c, s, impl), [(256, 2, 8, 64), (256, 1, 1, 64),
                                                                            (256, 1, 1, 64)]),
    "bias-gelu": (lambda impl: lambda x, b: activations.bias_gelu(x, b, impl), [(512, 2, 1024), (1024,)]),
    "causal softmax": (lambda impl: lambda x: softmax.scaled_upper_triang_masked_softmax(x, 0.125, impl),
                       [(2, 4, 256, 256)]),
}


@pytest.mark.parametrize("op", sorted(CASES))
def test_compiled_equals_eager(op):
    make, shapes = CASES[op]
    g = torch.Generator(device="cuda").manual_seed(1)
    inputs = [torch.randn(s, device="cuda", generator=g).to(torch.bfloat16) for s in shapes]
    want = _grads(make("torch"), *inputs)
    got = _grads(make("compiled"), *inputs)
    for name, a, b in zip(("out", "grad 1", "grad 2", "grad 3"), got, want):
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert _rel(a, b) <= 8 * U, (op, name, _rel(a, b))
