"""The observability pieces that behave differently on a GPU (docs/observability.md): timers wait for
the device's queue, Megatron-LM's CUDA memory scalars, and a torch.profiler trace with GPU kernels."""
import gzip
import json
import types

import torch

from megatron.core.timers import NULL_TIMER, Timers
from megatron.training.observability.profiling import StepProfiler
from megatron.training.observability.scalar_writers import CUDA_MEMORY, memory_scalars


def _matmuls(n=20, size=4096):
    a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    for _ in range(n):
        a = (a @ a).clamp_(-1, 1)
    return a


def test_an_enabled_timer_waits_for_the_gpu_and_a_disabled_one_costs_nothing():
    _matmuls(2)
    torch.cuda.synchronize()
    timers = Timers(1, device=torch.device("cuda"))
    with timers("forward-backward", 1):
        _matmuls()
    # 20 bf16 GEMMs of 4096^3 are 2.7 TFLOP: at least ~3 ms on any GPU; without the synchronisation at
    # stop the timer would see only their launch (tens of microseconds)
    assert timers.gather()["forward-backward"][0] > 2.0
    assert Timers(0, device=torch.device("cuda"))("forward-backward", 1) is NULL_TIMER  # level 0: no sync


def test_cuda_memory_scalars():
    keep = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    got = memory_scalars(torch.device("cuda"))
    assert set(got) == set(CUDA_MEMORY.values())
    assert got["mem-reserved-bytes"] >= got["mem-allocated-bytes"] >= keep.numel()
    assert got["mem-max-allocated-bytes"] >= got["mem-allocated-bytes"] and got["mem-allocated-count"] >= 1


def test_the_pytorch_profiler_records_gpu_kernels(tmp_path):
    cfg = types.SimpleNamespace(profile=True, use_pytorch_profiler=True, profile_ranks=None, profile_step_start=2,
                                profile_step_end=3, tensorboard_dir=str(tmp_path / "tb"),
                                pytorch_profiler_collect_shapes=False, pytorch_profiler_collect_callstack=False)
    profiler = StepProfiler(cfg, 0, 0, torch.device("cuda"))
    for it in (1, 2, 3):
        profiler.before(it)
        _matmuls(2, 1024)
        torch.cuda.synchronize()
        profiler.after(it)
    profiler.close()
    with gzip.open(tmp_path / "torch_profile" / "rank-0.json.gz") as f:
        events = json.load(f)["traceEvents"]
    assert any(e.get("cat") == "kernel" for e in events)
    assert {e["name"] for e in events if e.get("name", "").startswith("ProfilerStep#")} == {"ProfilerStep#2"}
