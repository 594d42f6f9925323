"""The masked-softmax front hands padding masks to our kernel, in the form its binding takes.

On CPU, `_ext.load` returns a stand-in that records every call and checks its arguments as
csrc/fused/bind_softmax.cpp does (contiguous x [b, heads, sq, sk]; a contiguous bool mask
[b or 1, 1, sq, sk] on x's device), then computes the masked softmax in float64. The fronts'
"is this a CUDA tensor of a kernel dtype" check is widened to float64 CPU tensors, as in
tests/unit/test_fusions.py.
"""
import pytest
import torch

from megatron.core.fusions import _common, _ext, softmax

DT = torch.float64


class RecordingKernels:
    """softmax_forward / softmax_backward of megatron_fused_kernels, recording their arguments."""

    def __init__(self):
        self.calls = []

    def softmax_forward(self, x, mask, scale, causal):
        self.calls.append(("forward", x, mask, scale, causal))
        assert x.is_contiguous() and isinstance(scale, float) and isinstance(causal, bool)
        if mask is not None:  # the binding's TORCH_CHECKs
            assert not causal and x.dim() == 4
            assert mask.dtype in (torch.bool, torch.uint8) and mask.is_contiguous() and mask.device == x.device
            assert mask.dim() == 4 and mask.shape[1] == 1 and mask.shape[2:] == x.shape[2:]
            assert mask.shape[0] in (1, x.shape[0])
        masked = torch.ones(x.shape[-2:], dtype=torch.bool).triu(1) if causal else mask
        v = x * scale if masked is None else (x * scale).masked_fill(masked.bool(), float("-inf"))
        return torch.nan_to_num(torch.softmax(v, dim=-1), nan=0.0)

    def softmax_backward(self, grad, y, scale, causal=False):
        self.calls.append(("backward", grad, y, scale))
        assert grad.is_contiguous() and grad.shape == y.shape
        return scale * y * (grad - (grad * y).sum(-1, keepdim=True))


@pytest.fixture
def kernels(monkeypatch):
    fake = RecordingKernels()
    monkeypatch.setattr(_ext, "load", lambda: fake)
    monkeypatch.setattr(_common, "KERNEL_DTYPES", (DT,))
    monkeypatch.setattr(softmax, "csrc_ok_for", lambda *ts: all(t is None or t.dtype == DT for t in ts))
    return fake


def _rand(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=DT)


def _mask(*shape, seed):
    m = torch.rand(*shape, generator=torch.Generator().manual_seed(seed)) < 0.4
    m.view(-1, shape[-1])[0] = True  # one fully masked row (or column block): zeros, not NaN
    return m


B, H, SQ, SK = 2, 3, 5, 7
MASKS = {"padding [b, 1, 1, sk]": (B, 1, 1, SK), "[b, 1, sq, sk]": (B, 1, SQ, SK), "[1, 1, sq, sk]": (1, 1, SQ, SK),
         "[sq, sk]": (SQ, SK), "per head [b, heads, sq, sk]": (B, H, SQ, SK),
         "per head [1, heads, 1, sk]": (1, H, 1, SK)}


@pytest.mark.parametrize("name", list(MASKS))
def test_bool_masks_reach_the_kernel(kernels, name):
    mask = _mask(*MASKS[name], seed=1)
    x = _rand(B, H, SQ, SK, seed=2).requires_grad_()
    y = softmax.scaled_masked_softmax(x, mask, 0.3, "csrc")
    (kind, kx, kmask, scale, causal), = kernels.calls
    assert (kind, scale, causal) == ("forward", 0.3, False)
    full = mask.expand(B, H, SQ, SK)
    if mask.dim() == 4 and mask.shape[1] == H:  # a mask per head: heads folded into the batch
        assert kx.shape == (B * H, 1, SQ, SK) and torch.equal(kmask, full.reshape(B * H, 1, SQ, SK))
    else:
        assert kx.shape == x.shape
        assert kmask.shape == (mask.shape[0] if mask.dim() == 4 else 1, 1, SQ, SK)
        assert torch.equal(kmask.expand(B, 1, SQ, SK), full[:, :1])
    assert torch.equal(kx.reshape(x.shape), x.detach())
    ref_x = x.detach().clone().requires_grad_()
    ref = softmax.torch_scaled_masked_softmax(ref_x, mask, 0.3)
    torch.testing.assert_close(y, ref, rtol=1e-12, atol=1e-15)
    grad = _rand(B, H, SQ, SK, seed=3)
    y.backward(grad)
    ref.backward(grad)
    assert [c[0] for c in kernels.calls] == ["forward", "backward"]
    torch.testing.assert_close(x.grad, ref_x.grad, rtol=1e-12, atol=1e-15)


def test_expanded_padding_mask_as_the_unfused_attention_passes_it(kernels):
    """CoreAttention._unfused hands ~attn_mask.expand(b, 1, s, sk): a non-contiguous view."""
    keep = torch.ones(B, 1, 1, SK, dtype=torch.bool)
    keep[0, ..., 4:] = False
    masked = ~keep.expand(B, 1, SQ, SK)
    x = _rand(B, H, SQ, SK, seed=4)
    y = softmax.scaled_masked_softmax(x, masked, 0.5, "csrc")
    (_, _, kmask, _, _), = kernels.calls
    assert kmask.is_contiguous() and torch.equal(kmask, masked)
    assert torch.equal(y[0, ..., 4:], torch.zeros_like(y[0, ..., 4:]))


@pytest.mark.parametrize("case", ["float mask", "uint8 mask", "3-D input", "mask wider than x", "impl torch"])
def test_what_the_kernel_cannot_take_runs_torch(kernels, case):
    x, mask, impl = _rand(B, H, SQ, SK, seed=5), _mask(B, 1, SQ, SK, seed=6), "csrc"
    if case == "float mask":
        mask = mask.to(DT)
    elif case == "uint8 mask":
        mask = mask.to(torch.uint8)
    elif case == "3-D input":
        x, mask = x[0], mask[0]
    elif case == "mask wider than x":
        mask = _mask(B, 1, SQ, SK + 1, seed=6)
    else:
        impl = "torch"
    if case in ("float mask", "uint8 mask", "mask wider than x"):
        with pytest.raises(RuntimeError):  # torch's masked_fill refuses these as well
            softmax.scaled_masked_softmax(x, mask, 0.5, impl)
    else:
        torch.testing.assert_close(softmax.scaled_masked_softmax(x, mask, 0.5, impl),
                                   softmax.torch_scaled_masked_softmax(x, mask, 0.5), rtol=0, atol=0)
    assert kernels.calls == []


def test_no_mask_and_causal_reach_the_kernel(kernels):
    x = _rand(B, H, SQ, SK, seed=7)
    softmax.scaled_masked_softmax(x, None, 0.5, "csrc")
    softmax.scaled_upper_triang_masked_softmax(x, 0.5, "csrc")
    assert [(c[0], c[2], c[4]) for c in kernels.calls] == [("forward", None, False), ("forward", None, True)]
