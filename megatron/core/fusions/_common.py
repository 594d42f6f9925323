"""What every front shares: which implementations exist on this machine, dtype checks, and the
one route to kernel_table.choose()."""
import functools
import importlib

import torch

from . import _ext, kernel_table

KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
HALF_DTYPES = (torch.float16, torch.bfloat16)


@functools.cache
def importable(module):
    """True when `module` imports (cached; an optional package that is broken counts as absent)."""
    try:
        importlib.import_module(module)
    except Exception:  # ImportError, or a package whose import fails (e.g. CUDA mismatch)
        return False
    return True


def csrc_unavailable(device, dtype):
    """Why our kernels cannot run for tensors of `dtype` on `device` (None: they can; builds
    them on the first CUDA call)."""
    if torch.device(device).type != "cuda":
        return "not a CUDA device"
    if dtype not in KERNEL_DTYPES:
        return f"no kernel for {dtype}"
    if _ext.load() is None:
        return _ext.status()
    return None


def csrc_ok(device, dtype):
    """Our kernel can run for tensors of `dtype` on `device` (builds it on the first CUDA call)."""
    return csrc_unavailable(device, dtype) is None


@functools.cache
def compiled(fn):
    """`fn` (a front's torch function) under torch.compile with static shapes: the "compiled"
    implementation, chosen where bench/kernels.py measured it faster than our kernel and eager
    (one compiled function per front function; dynamo keys its graphs by shape and stride)."""
    return torch.compile(fn, dynamic=False)


def compiled_fits(*tensors):
    """The compiled implementation runs on CUDA tensors only (its figures are GPU figures; off CUDA
    the front runs eager torch). Inside a compiled layer (compiled_layers.py) the torch function is traced
    into the layer's graph instead."""
    return not torch.compiler.is_compiling() and all(t is None or t.is_cuda for t in tensors)


def csrc_ok_for(*tensors):
    """Runtime check before calling a kernel: CUDA tensors of a kernel dtype, kernels loaded, and not inside
    a compiled layer (there the kernel steps aside for inductor: a pybind call would break the graph)."""
    if torch.compiler.is_compiling():
        return False
    return all(t is None or (t.is_cuda and t.dtype in KERNEL_DTYPES) for t in tensors) and _ext.load() is not None


def device_name(device):
    """The GPU model's name as kernel_table.json keys it (torch.cuda.get_device_name), None off CUDA."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_name(device)


def kernel_choice(op, device, dtype, enabled, force, flag, others=None):
    """(impl, reason) for one op of a module built for `device` and `dtype`: kernel_table.choose
    with this machine's facts. others: {impl: why unavailable} for a front's other candidates."""
    unavailable = dict(others or {})
    if not importable("triton"):
        unavailable["compiled"] = "triton is not installed (torch.compile's GPU backend)"
    why = csrc_unavailable(device, dtype)
    if why is not None:
        unavailable["csrc"] = why
    flags = kernel_table.KernelFlags(enabled=enabled, force=force, flag=flag)
    return kernel_table.choose(op, device_name(device), flags, unavailable)
