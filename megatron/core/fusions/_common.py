"""What every front shares: which implementations exist on this machine, and dtype checks."""
import functools
import importlib

import torch

from . import _ext

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


def csrc_ok(device, dtype):
    """Our kernel can run for tensors of `dtype` on `device` (builds it on the first CUDA call)."""
    return torch.device(device).type == "cuda" and dtype in KERNEL_DTYPES and _ext.load() is not None


def csrc_ok_for(*tensors):
    """Runtime check before calling a kernel: CUDA tensors of a kernel dtype, kernels loaded."""
    return all(t is None or (t.is_cuda and t.dtype in KERNEL_DTYPES) for t in tensors) and _ext.load() is not None
