"""The fusion fronts on CPU: plain-torch results when kernels are unavailable, the flags and the
kernel table pick the implementation, and the kernel path's Python side and math, with a
stand-in for the CUDA module (tests/fake_kernels.py: every binding in torch with the .cu files'
closed-form backward formulas, recording its calls). Each kernel-path test also asserts that
the stand-in ran, forward and backward: a routing regression would otherwise compare torch
with torch. The CUDA indexing itself is checked on a GPU (tests/gpu).
"""
import dataclasses
import json

import pytest
import torch
import torch.nn.functional as F

from megatron.core import fusions
from megatron.core.config import ConfigError, TransformerConfig
from megatron.core.fusions import _common, _ext, activations, attention, kernel_table, norm, rope, softmax
from megatron.core.transformer.core_attention import CoreAttention
from megatron.core.transformer.rope import rope_cos_sin
from tests.fake_kernels import FakeKernels

DT = torch.float64
CUDA = torch.device("cuda")  # only handed to select(): nothing runs on it


def _rand(*shape, seed, dtype=DT):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


# ----------------------------------------------------------------------------- selection


def test_kernels_unavailable_on_cpu():
    assert _ext.load() is None
    assert "no CUDA device" in _ext.status()
    assert fusions.kernels_status() == _ext.status()


def test_cpu_selects_torch_for_every_flag_setting():
    cpu = torch.device("cpu")
    for enabled in (True, False):
        for dtype in (torch.float32, torch.bfloat16):
            assert softmax.select(enabled, cpu, dtype) == "torch"
            assert norm.select(enabled, cpu, dtype) == "torch"
            assert activations.select(enabled, cpu, dtype) == "torch"
            assert rope.select(enabled, cpu, dtype) == "torch"
    assert attention.select("auto", cpu, torch.bfloat16) == "sdpa"
    assert attention.select("unfused", cpu, torch.float32) == "unfused"


GPU = "Test GPU 80GB"
FAST = {"fused_ms": 0.1, "eager_ms": 0.3, "compiled_ms": 0.2, "default": "csrc"}
SLOW = {"fused_ms": 0.5, "eager_ms": 0.3, "compiled_ms": 0.2, "default": "torch"}


@pytest.fixture
def kernels_present(monkeypatch, tmp_path):
    """Pretend our kernels (and nothing else optional) are available on a GPU named GPU, with a
    kernel table (MEGATRON_KERNEL_TABLE) where they win for every op; returns a writer of
    another table."""
    monkeypatch.setattr(_ext, "load", lambda: FakeKernels())
    monkeypatch.setattr(_common, "device_name", lambda device: GPU if torch.device(device).type == "cuda" else None)
    path = tmp_path / "table.json"

    def write(entries):
        path.write_text(json.dumps({GPU: entries}))
        kernel_table.load.cache_clear()
    write(dict.fromkeys(kernel_table.OPS, FAST))
    monkeypatch.setenv(kernel_table.ENV, str(path))
    yield write
    kernel_table.load.cache_clear()


def test_kernels_are_picked_where_the_table_says_and_flags_pick_torch(kernels_present):
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        assert softmax.select(True, CUDA, dtype) == "csrc"
        assert norm.select(True, CUDA, dtype) == "csrc"
        assert activations.select(True, CUDA, dtype) == "csrc"
        assert rope.select(True, CUDA, dtype) == "csrc"
        # --no-masked-softmax-fusion, --no-norm-fusion, --no-bias-*-fusion, --no-rope-fusion
        assert softmax.select(False, CUDA, dtype) == "torch"
        assert norm.select(False, CUDA, dtype) == "torch"
        assert activations.select(False, CUDA, dtype) == "torch"
        assert rope.select(False, CUDA, dtype) == "torch"
    assert softmax.select(True, CUDA, torch.float64) == "torch"  # no kernel for fp64
    assert attention.select("auto", CUDA, torch.bfloat16) == "sdpa"  # flash-attn / TE not installed
    # measured slower for LayerNorm only: torch there, csrc for RMSNorm, csrc again when forced
    kernels_present({**dict.fromkeys(kernel_table.OPS, FAST), "layernorm": SLOW})
    assert norm.choice(True, CUDA, torch.bfloat16) == (
        "torch", f"csrc 1.67x slower than eager and 2.50x slower than torch.compile on {GPU}, table.json")
    assert norm.select(True, CUDA, torch.bfloat16, rms=True) == "csrc"
    assert norm.choice(True, CUDA, torch.bfloat16, force="csrc") == ("csrc", "--fused-kernels csrc")
    assert norm.choice(False, CUDA, torch.bfloat16, force="csrc") == ("torch", "--no-norm-fusion")
    kernels_present({})  # nothing on file for this GPU: torch everywhere
    for front in (softmax, norm, activations, rope):
        impl, why = front.choice(True, CUDA, torch.bfloat16)
        assert (impl, why) == ("torch", f"no GPU result on file for {GPU}, table.json")


def test_describe_and_explain_follow_the_flags_and_the_table(kernels_present):
    cfg = TransformerConfig(attention_backend="unfused", position_embedding_type="rope", swiglu=True,
                            normalization="RMSNorm", params_dtype=torch.bfloat16)
    # the fake kernels have no wgrad_gemm_accumulate: the accumulation runs through torch
    extra = {"weight-gradient accumulation": "in the GEMM (torch)", "cross entropy": "vocab-parallel (torch)"}
    assert dict(fusions.describe(cfg, CUDA)) == {
        "attention": "unfused (matmul + masked softmax + matmul), softmax csrc, masked softmax csrc",
        "RMSNorm": "csrc", "bias-swiglu": "csrc", "rope": "csrc", **extra}
    off = dataclasses.replace(cfg, masked_softmax_fusion=False, norm_fusion=False, bias_swiglu_fusion=False,
                              apply_rope_fusion=False)
    assert dict(fusions.describe(off, CUDA)) == {
        "attention": "unfused (matmul + masked softmax + matmul), softmax torch, masked softmax torch",
        "RMSNorm": "torch", "bias-swiglu": "torch", "rope": "torch", **extra}
    assert {op: why for op, _, why in fusions.explain(off, CUDA)} == {
        "causal softmax": "--no-masked-softmax-fusion", "masked softmax": "--no-masked-softmax-fusion",
        "RMSNorm": "--no-norm-fusion", "bias-swiglu": "--no-bias-swiglu-fusion", "rope": "--no-rope-fusion"}
    gelu = TransformerConfig(bias_gelu_fusion=False, gradient_accumulation_fusion=False,
                             cross_entropy_loss_fusion=True)
    assert dict(fusions.describe(gelu, CUDA)) == {
        "attention": "torch scaled_dot_product_attention", "LayerNorm": "csrc", "bias-gelu": "torch",
        "weight-gradient accumulation": "off (a .grad, then added)",
        "cross entropy": "fused (chunked, gradient over the logits)"}
    assert fusions.explain(gelu, CUDA)[0] == ("LayerNorm", "csrc", f"csrc 0.33x eager, 0.50x torch.compile on {GPU}, "
                                                                   "table.json")
    assert [impl for _, impl, _ in fusions.explain(gelu, torch.device("cpu"))] == ["torch", "torch"]


def test_modules_pick_what_the_table_and_flags_say(kernels_present, monkeypatch):
    """The layers ask with their own op (LayerNorm vs RMSNorm, GeLU vs SwiGLU) and --fused-kernels
    (built on meta, which stands for the GPU here: no CUDA memory on this machine)."""
    from megatron.core.transformer.norm import build_norm
    monkeypatch.setattr(_common, "device_name", lambda device: GPU)
    monkeypatch.setattr(_common, "csrc_unavailable", lambda device, dtype: None)
    kernels_present({**dict.fromkeys(kernel_table.OPS, FAST), "layernorm": SLOW})
    cfg = TransformerConfig(params_dtype=torch.bfloat16, hidden_size=32, num_attention_heads=4)
    assert build_norm(cfg, "meta").impl == "torch"
    assert build_norm(dataclasses.replace(cfg, normalization="RMSNorm"), "meta").impl == "csrc"
    assert build_norm(dataclasses.replace(cfg, fused_kernels="csrc"), "meta").impl == "csrc"
    assert build_norm(dataclasses.replace(cfg, fused_kernels="csrc", norm_fusion=False), "meta").impl == "torch"


def test_requested_backend_that_is_missing_is_a_config_error():
    for backend, package in (("flash", "flash-attn"), ("te", "Transformer Engine")):
        with pytest.raises(ConfigError, match=f"--attention-backend {backend}: .*{package}"):
            fusions.check_config(TransformerConfig(attention_backend=backend))
    fusions.check_config(TransformerConfig(attention_backend="unfused"))


# ----------------------------------------------------------------------------- torch path


def _leaf(t):
    """A fresh leaf with t's values and strides (clone() would make a strided view contiguous)."""
    out = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype)
    return out.copy_(t.detach()).requires_grad_(t.requires_grad)


def _grads(fn, *inputs, seed=0):
    """fn(*inputs) and the gradients of <fn, random> wrt every input that requires grad."""
    leaves = [_leaf(t) if torch.is_tensor(t) else t for t in inputs]
    out = fn(*leaves)
    out.backward(_rand(*out.shape, seed=seed, dtype=out.dtype))
    return out.detach(), [t.grad for t in leaves if torch.is_tensor(t) and t.requires_grad]


def _softmax_reference(x, mask, scale):
    """Written independently: -inf where masked, NaN rows (all masked) -> 0."""
    y = torch.softmax((x * scale).masked_fill(mask, float("-inf")), dim=-1)
    return torch.nan_to_num(y, nan=0.0)


def test_torch_softmax_semantics():
    x = _rand(2, 3, 5, 7, seed=1)
    mask = torch.rand(2, 1, 5, 7, generator=torch.Generator().manual_seed(2)) < 0.4
    mask[1, 0, 2] = True  # a fully masked row
    y = softmax.scaled_masked_softmax(x, mask, 0.5, impl="torch")
    torch.testing.assert_close(y, _softmax_reference(x, mask, 0.5), rtol=1e-12, atol=1e-15)
    assert torch.equal(y[1, :, 2], torch.zeros_like(y[1, :, 2]))
    _, (gx,) = _grads(lambda t: softmax.scaled_masked_softmax(t, mask, 0.5, impl="torch"), x.requires_grad_())
    assert torch.isfinite(gx).all() and torch.equal(gx[1, :, 2], torch.zeros_like(gx[1, :, 2]))
    causal = torch.ones(5, 7, dtype=torch.bool).triu(1)
    torch.testing.assert_close(softmax.scaled_upper_triang_masked_softmax(x, 0.5, impl="torch"),
                               _softmax_reference(x, causal, 0.5), rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("impl", ["csrc", "apex", "torch"])
def test_fronts_give_the_plain_torch_result_without_kernels(impl):
    """impl names a kernel, the tensors are on CPU: every front must return torch's result."""
    x, w, b = _rand(4, 3, 16, seed=3), _rand(16, seed=4), _rand(16, seed=5)
    for xx in (x, x.float(), x.bfloat16()):
        ww, bb = w.to(xx.dtype), b.to(xx.dtype)
        assert torch.equal(norm.layer_norm(xx, ww, bb, 1e-5, impl), F.layer_norm(xx, (16,), ww, bb, 1e-5))
        xf = xx.to(torch.promote_types(xx.dtype, torch.float32))
        rms = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)).to(xx.dtype) * ww
        assert torch.equal(norm.rms_norm(xx, ww, 1e-5, impl), rms)
        assert torch.equal(activations.bias_gelu(xx, bb, impl), F.gelu(xx + bb))
        assert torch.equal(activations.bias_gelu(xx, None, impl), F.gelu(xx))
        gate, up = (xx + bb).chunk(2, dim=-1)
        assert torch.equal(activations.bias_swiglu(xx, bb, impl), F.silu(gate) * up)
        cos, sin = rope_cos_sin(4, 16, 10000, "cpu", xx.dtype)
        q = xx.view(4, 3, 1, 16)
        rotated = torch.cat([-q[..., 8:], q[..., :8]], dim=-1)
        assert torch.equal(rope.apply_rope(q, cos, sin, impl), q * cos + rotated * sin)
        s4 = xx.view(1, 4, 3, 16)
        assert torch.equal(softmax.scaled_upper_triang_masked_softmax(s4, 0.25, impl),
                           softmax.torch_scaled_masked_softmax(s4, None, 0.25, causal=True))


@pytest.mark.parametrize("gqa,mask", [(False, False), (True, False), (False, True)])
def test_unfused_attention_equals_sdpa(gqa, mask):
    s, b, heads, d = 6, 2, 4, 8
    groups = 2 if gqa else heads
    q, k, v = _rand(s, b, heads, d, seed=6), _rand(s, b, groups, d, seed=7), _rand(s, b, groups, d, seed=8)
    attn_mask = None
    if mask:  # SDPA convention: True = attend; keep every row non-empty
        attn_mask = torch.rand(b, 1, s, s, generator=torch.Generator().manual_seed(9)) < 0.7
        attn_mask[..., 0] = True
    cfg = TransformerConfig(num_attention_heads=heads, hidden_size=heads * d, attention_dropout=0.0,
                            params_dtype=DT)
    outs = {}
    for backend in ("sdpa", "unfused"):
        core = CoreAttention(dataclasses.replace(cfg, attention_backend=backend))
        outs[backend] = _grads(lambda *t: core(*t, attn_mask=attn_mask), q.requires_grad_(), k.requires_grad_(),
                               v.requires_grad_())
        assert core.backend == backend
    (o1, g1), (o2, g2) = outs["sdpa"], outs["unfused"]
    assert o1.shape == (s, b, heads * d)
    torch.testing.assert_close(o2, o1, rtol=1e-10, atol=1e-12)
    for a, e in zip(g2, g1):
        torch.testing.assert_close(a, e, rtol=1e-10, atol=1e-12)


# ----------------------------------------------------------------------------- kernel path


@pytest.fixture
def fake_kernels(monkeypatch):
    """Route the fronts' kernel path to a FakeKernels for CPU tensors; returns it (its calls)."""
    fake = FakeKernels()
    monkeypatch.setattr(_ext, "load", lambda: fake)
    monkeypatch.setattr(_common, "KERNEL_DTYPES", (torch.float64,))

    def ok(*ts):
        return all(t is None or t.dtype == torch.float64 for t in ts)

    for module in (softmax, norm, activations, rope):
        monkeypatch.setattr(module, "csrc_ok_for", ok)
    return fake


def _same(kernel_fn, torch_fn, *inputs, fake, calls):
    """kernel_fn (through the stand-in) and torch_fn agree, and the stand-in ran exactly `calls`."""
    fake.calls.clear()
    (o1, g1), (o2, g2) = _grads(kernel_fn, *inputs), _grads(torch_fn, *inputs)
    assert fake.called() == set(calls), f"the kernel path ran {sorted(fake.called())}, not {sorted(calls)}"
    torch.testing.assert_close(o1, o2, rtol=1e-10, atol=1e-12)
    assert len(g1) == len(g2)
    for a, e in zip(g1, g2):
        torch.testing.assert_close(a, e, rtol=1e-10, atol=1e-12)


SOFTMAX = ("softmax_forward", "softmax_backward")
NORM = ("norm_forward", "norm_backward")


def test_kernel_path_softmax(fake_kernels):
    x = _rand(2, 3, 5, 7, seed=10).requires_grad_()
    mask = torch.rand(2, 1, 5, 7, generator=torch.Generator().manual_seed(11)) < 0.4
    mask[0, 0, 1] = True
    for m in (mask, mask[:1]):
        _same(lambda t: softmax.scaled_masked_softmax(t, m, 0.3, "csrc"),
              lambda t: softmax.torch_scaled_masked_softmax(t, m, 0.3), x, fake=fake_kernels, calls=SOFTMAX)
    _same(lambda t: softmax.scaled_upper_triang_masked_softmax(t, 0.3, "csrc"),
          lambda t: softmax.torch_scaled_masked_softmax(t, None, 0.3, causal=True), x, fake=fake_kernels,
          calls=SOFTMAX)
    assert ("softmax_backward", x.shape, True) in fake_kernels.calls, "the causal backward skips the zeros"


def test_kernel_path_norms(fake_kernels):
    x, w, b = _rand(3, 2, 16, seed=12), _rand(16, seed=13), _rand(16, seed=14)
    args = (x.requires_grad_(), w.requires_grad_(), b.requires_grad_())
    _same(lambda *t: norm.layer_norm(*t, 1e-5, "csrc"), lambda *t: F.layer_norm(t[0], (16,), t[1], t[2], 1e-5), *args,
          fake=fake_kernels, calls=NORM)
    _same(lambda x_, w_: norm.rms_norm(x_, w_, 1e-5, "csrc"), lambda x_, w_: norm.torch_rms_norm(x_, w_, 1e-5),
          x, w, fake=fake_kernels, calls=NORM)


def test_kernel_path_activations(fake_kernels):
    x, b = _rand(3, 2, 16, seed=15).requires_grad_(), _rand(16, seed=16).requires_grad_()
    gelu, swiglu = ("bias_gelu_forward", "bias_gelu_backward"), ("swiglu_forward", "swiglu_backward")
    _same(lambda *t: activations.bias_gelu(*t, "csrc"), activations.torch_bias_gelu, x, b, fake=fake_kernels,
          calls=gelu)
    _same(lambda t: activations.bias_gelu(t, None, "csrc"), activations.torch_bias_gelu, x, fake=fake_kernels,
          calls=gelu)
    _same(lambda *t: activations.bias_swiglu(*t, "csrc"), activations.torch_bias_swiglu, x, b, fake=fake_kernels,
          calls=swiglu)
    _same(lambda t: activations.bias_swiglu(t, None, "csrc"), activations.torch_bias_swiglu, x, fake=fake_kernels,
          calls=swiglu)
    # the tanh form (--openai-gelu) has no kernel: torch, and no call
    _same(lambda *t: activations.bias_gelu(*t, "csrc", "tanh"), lambda *t: activations.torch_bias_gelu(*t, "tanh"),
          x, b, fake=fake_kernels, calls=())


def test_kernel_path_rope_is_the_exact_transpose(fake_kernels):
    x = _rand(5, 2, 3, 8, seed=17).requires_grad_()
    cos, sin = rope_cos_sin(5, 8, 10000, "cpu", DT)
    rope_calls = ("rope_apply",)
    _same(lambda t: rope.apply_rope(t, cos, sin, "csrc"), lambda t: rope.torch_apply_rope(t, cos, sin), x,
          fake=fake_kernels, calls=rope_calls)
    # halves of cos / sin that differ (not what rope_cos_sin makes): the backward is still exact
    cos2, sin2 = _rand(5, 1, 1, 8, seed=18), _rand(5, 1, 1, 8, seed=19)
    _same(lambda t: rope.apply_rope(t, cos2, sin2, "csrc"), lambda t: rope.torch_apply_rope(t, cos2, sin2), x,
          fake=fake_kernels, calls=rope_calls)
    # q as attention slices it from the fused qkv output reaches the kernel as the view itself
    qkv = _rand(5, 2, 3, 24, seed=20)
    q = qkv[..., :8].requires_grad_()
    fake_kernels.calls.clear()
    _same(lambda t: rope.apply_rope(t, cos, sin, "csrc"), lambda t: rope.torch_apply_rope(t, cos, sin), q,
          fake=fake_kernels, calls=rope_calls)
    assert ("rope_apply", q.shape, False, False) in fake_kernels.calls, "the strided view was copied first"
