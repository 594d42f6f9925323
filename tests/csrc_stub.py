"""The CPU test build of the fused kernels' bindings (csrc/fused/bind_*.cpp, checks.cpp,
bindings.cpp): the same binding sources, with cpu_stub/ in place of device.cpp and the
kernels, so that every binding's argument checks run on a machine without CUDA.

Tensors on the meta device stand for CUDA tensors (shapes, strides and dtypes, no memory);
CPU tensors are "the wrong device". Each stub launcher only counts its calls
(`module._stub_launches()`). Built with torch.utils.cpp_extension.load, which caches it under
TORCH_EXTENSIONS_DIR and rebuilds it when a source or flag changes (a minute once, then a
second). No CUDA toolkit is needed: cpu_stub/cuda_runtime_stub.h declares the few CUDA types
the host API names.
"""
import glob
import os

NAME = "megatron_fused_kernels_cpu_stub"
CSRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "csrc", "fused")
_module = []


def sources(root=CSRC):
    """The binding sources of the real build, minus device.cpp, plus the stubs."""
    real = [f for f in sorted(glob.glob(os.path.join(root, "*.cpp"))) if os.path.basename(f) != "device.cpp"]
    return real + sorted(glob.glob(os.path.join(root, "cpu_stub", "*.cpp")))


def load():
    """The stub module (built on first use, then cached)."""
    if not _module:
        from torch.utils import cpp_extension
        _module.append(cpp_extension.load(
            NAME, sources(), extra_cflags=["-O0", "-DMEGATRON_FUSED_CPU_STUB", f"-I{CSRC}"],
            verbose=os.environ.get("MEGATRON_FUSED_KERNELS_VERBOSE") == "1"))
    return _module[0]
