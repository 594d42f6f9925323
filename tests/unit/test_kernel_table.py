"""kernel_table.choose over its cases, the table's checks, the committed table, and the writer
bench/kernels.py uses (CPU: the figures are given, nothing is timed)."""
import json

import pytest

from megatron.core.config import ConfigError, TransformerConfig
from megatron.core.fusions import check_config, kernel_table
from megatron.core.fusions.kernel_table import KernelFlags, KernelTableError, choose

GPU = "NVIDIA H200"
WIN = {"fused_ms": 0.25, "eager_ms": 0.817, "compiled_ms": 0.458, "default": "csrc"}
LOSE_EAGER = {"fused_ms": 0.197, "eager_ms": 0.130, "compiled_ms": 0.403, "default": "torch"}
LOSE_COMPILED = {"fused_ms": 0.674, "eager_ms": 1.355, "compiled_ms": 0.642, "default": "compiled"}
APEX = {"fused_ms": 0.3, "eager_ms": 0.2, "compiled_ms": 0.25, "default": "apex"}
TABLE = {GPU: {"layernorm": LOSE_EAGER, "rmsnorm": WIN, "causal softmax": LOSE_COMPILED, "bias-gelu": APEX,
               "_meta": {"source": "a test"}}}
AUTO = KernelFlags()


def _choose(op, device=GPU, flags=AUTO, unavailable=None):
    return choose(op, device, flags, unavailable, table=TABLE, source="t.json")


def test_the_table_decides_where_it_has_a_figure():
    assert _choose("rmsnorm") == ("csrc", f"csrc 0.31x eager, 0.55x torch.compile on {GPU}, t.json")
    assert _choose("layernorm") == ("torch", f"csrc 1.52x slower than eager on {GPU}, t.json")
    assert _choose("causal softmax") == ("compiled", f"torch.compile 0.47x eager, 0.95x csrc on {GPU}, t.json")
    assert _choose("bias-gelu") == ("apex", f"csrc 1.50x slower than eager and 1.20x slower than torch.compile "
                                            f"on {GPU}, t.json")


def test_without_a_figure_torch_runs():
    assert _choose("rope") == ("torch", f"no GPU result on file for {GPU}, t.json")
    assert _choose("rmsnorm", device="NVIDIA H100 80GB HBM3") == (
        "torch", "no GPU result on file for NVIDIA H100 80GB HBM3, t.json")
    assert _choose("rmsnorm", device=None) == ("torch", "not a CUDA device")
    assert _choose("rmsnorm", device=None, unavailable={"csrc": "no CUDA device"}) == ("torch", "no CUDA device")


def test_flags_force_a_choice():
    off = KernelFlags(enabled=False, force="csrc", flag="--no-norm-fusion")
    assert _choose("rmsnorm", flags=off) == ("torch", "--no-norm-fusion")  # the op's own flag wins
    forced = KernelFlags(force="csrc")
    assert _choose("layernorm", flags=forced) == ("csrc", "--fused-kernels csrc")
    assert _choose("rope", device=None, flags=forced, unavailable={"csrc": "not a CUDA device"}) == (
        "torch", "--fused-kernels csrc, but csrc is unavailable: not a CUDA device")


def test_a_default_that_cannot_run_here_is_torch():
    assert _choose("rmsnorm", unavailable={"csrc": "build failed (x)"}) == (
        "torch", f"csrc is the default on {GPU} (t.json) but unavailable: build failed (x)")
    assert _choose("bias-gelu", unavailable={"apex": "apex is not installed"})[0] == "torch"
    assert _choose("causal softmax", unavailable={"compiled": "triton is not installed"}) == (
        "torch", f"compiled is the default on {GPU} (t.json) but unavailable: triton is not installed")
    with pytest.raises(ValueError, match="unknown op"):
        _choose("layer norm")


def test_the_compiled_implementation_runs_eager_off_cuda():
    """The fronts' "compiled" branch is taken on CUDA tensors only (tests/gpu/test_compiled_fronts.py
    compares it with eager there); on CPU tensors the front gives eager torch's result bitwise."""
    import torch

    from megatron.core.fusions import activations, norm, rope
    g = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(3, 2, 8, generator=g), torch.randn(8, generator=g), torch.randn(8, generator=g)
    assert torch.equal(norm.rms_norm(x, w, 1e-5, "compiled"), norm.torch_rms_norm(x, w, 1e-5))
    assert torch.equal(norm.layer_norm(x, w, b, 1e-5, "compiled"), norm.torch_layer_norm(x, w, b, 1e-5))
    assert torch.equal(activations.bias_gelu(x, b, "compiled"), activations.torch_bias_gelu(x, b))
    q, cos, sin = torch.randn(3, 2, 2, 8, generator=g), torch.randn(3, 1, 1, 8, generator=g), torch.randn(
        3, 1, 1, 8, generator=g)
    assert torch.equal(rope.apply_rope(q, cos, sin, "compiled"), rope.torch_apply_rope(q, cos, sin))


def _write(tmp_path, table):
    path = tmp_path / "t.json"
    path.write_text(table if isinstance(table, str) else json.dumps(table))
    kernel_table.load.cache_clear()
    return str(path)


@pytest.mark.parametrize("table, message", [
    ("{not json", "cannot be read"),
    ("[1, 2]", "expected an object"),
    ({GPU: [1]}, "must map op names"),
    ({GPU: {"layer norm": WIN}}, "unknown op 'layer norm'"),
    ({GPU: {"rope": {**WIN, "fused_ms": -1}}}, "fused_ms: expected a positive number"),
    ({GPU: {"rope": {**WIN, "eager_ms": "fast"}}}, "eager_ms"),
    ({GPU: {"rope": {k: v for k, v in WIN.items() if k != "compiled_ms"}}}, "compiled_ms"),
    ({GPU: {"rope": {**WIN, "default": "cuda"}}}, "default: expected one of csrc, apex, compiled, torch"),
])
def test_a_bad_table_is_named(tmp_path, table, message):
    with pytest.raises(KernelTableError, match=message):
        kernel_table.load(_write(tmp_path, table))


def test_the_env_var_points_the_fronts_at_another_table(tmp_path, monkeypatch):
    path = _write(tmp_path, {GPU: {"rope": WIN}})
    monkeypatch.setenv(kernel_table.ENV, path)
    assert choose("rope", GPU, AUTO) == ("csrc", f"csrc 0.31x eager, 0.55x torch.compile on {GPU}, t.json")
    monkeypatch.setenv(kernel_table.ENV, str(tmp_path / "missing.json"))
    with pytest.raises(KernelTableError, match="does not exist"):
        choose("rope", GPU, AUTO)
    with pytest.raises(ConfigError, match="unset MEGATRON_KERNEL_TABLE"):
        check_config(TransformerConfig())


def test_no_committed_table_means_nothing_measured(tmp_path, monkeypatch):
    monkeypatch.setattr(kernel_table, "DEFAULT_PATH", str(tmp_path / "absent.json"))
    monkeypatch.delenv(kernel_table.ENV, raising=False)
    assert choose("layernorm", GPU, AUTO) == ("torch", f"no GPU result on file for {GPU}, absent.json")


def test_the_committed_table_holds_the_h200_figures_of_2026_11_26(monkeypatch):
    monkeypatch.delenv(kernel_table.ENV, raising=False)
    table = kernel_table.load(kernel_table.DEFAULT_PATH)
    defaults = {op: e["default"] for op, e in table[GPU].items() if not op.startswith("_")}
    # the vectorised kernels: the norms and RoPE lost to torch.compile (not to eager), which then runs
    assert defaults == {"masked softmax": "csrc", "causal softmax": "csrc", "layernorm": "compiled",
                        "rmsnorm": "compiled", "bias-gelu": "csrc", "bias-swiglu": "csrc", "rope": "compiled"}
    assert choose("rmsnorm", GPU, AUTO) == ("compiled", f"torch.compile 0.08x eager, 0.95x csrc on {GPU}, "
                                                        "kernel_table.json")
    for op, e in table[GPU].items():
        if not op.startswith("_"):  # the rule bench/kernels.py writes by
            assert e["default"] == kernel_table.default_impl(e["fused_ms"], e["eager_ms"], e["compiled_ms"]), op


@pytest.mark.parametrize("fused, eager, compiled, want", [
    (0.1, 0.2, 0.3, "csrc"), (0.2, 0.1, 0.3, "torch"), (0.3, 0.2, 0.1, "compiled"), (0.2, 0.3, 0.1, "compiled"),
    (0.2, 0.2, 0.2, "torch"),  # a tie: the kernel did not beat them, and eager needs no compile
])
def test_the_default_is_the_kernel_only_where_it_beat_both_else_the_faster_torch(fused, eager, compiled, want):
    assert kernel_table.default_impl(fused, eager, compiled) == want


def test_bench_writes_a_table_the_fronts_read(tmp_path):
    from bench import kernels as bench
    path = _write(tmp_path, {"Other GPU": {"rope": WIN}})
    rows = [dict(op="layernorm", fused_ms=0.1, eager_ms=0.2, compiled_ms=0.3, default="csrc"),
            dict(op="rope", fused_ms=0.3, eager_ms=0.2, compiled_ms=0.1, default="torch")]
    bench.write_table(rows, GPU, "bf16", path)
    table = kernel_table.load(path)
    assert table["Other GPU"] == {"rope": WIN}, "other GPUs' figures are kept"
    assert table[GPU]["layernorm"] == {"fused_ms": 0.1, "eager_ms": 0.2, "compiled_ms": 0.3, "default": "csrc"}
    assert choose("rope", GPU, AUTO, table=table, source="t.json")[0] == "torch"
