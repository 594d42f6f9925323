"""The fused CUDA kernels of csrc/fused, as the Python module `megatron_fused_kernels`.

Where it comes from, first that works:
  1. the module setup.py built (`pip install -e . --no-build-isolation` with CUDA torch and nvcc);
  2. a build on first use with torch.utils.cpp_extension.load, cached under
     TORCH_EXTENSIONS_DIR (default ~/.cache/torch_extensions): minutes once, a second after;
     concurrent ranks wait on cpp_extension's lock file instead of building twice;
  3. nothing: load() returns None and every front picks another implementation.
Nothing here raises; status() says which case applies (the start-up log prints it).
MEGATRON_FUSED_KERNELS=0 in the environment turns the kernels off without touching flags.
"""
import glob
import os
import sys

import torch

NAME = "megatron_fused_kernels"
API_VERSION = 1  # must match kApiVersion in csrc/fused/bindings.cpp
CSRC = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))),
                    "csrc", "fused")
NVCC_FLAGS = ["-O3"]
CXX_FLAGS = ["-O3"]

_state = {"tried": False, "module": None, "status": "not loaded yet"}


def sources(root=CSRC):
    """The extension's sources: every kernel file plus the bindings."""
    return sorted(glob.glob(os.path.join(root, "*.cu"))) + [os.path.join(root, "bindings.cpp")]


def _prebuilt():
    try:
        import megatron_fused_kernels as module  # noqa: F401  (built by setup.py)
    except ImportError:
        return None
    if getattr(module, "API_VERSION", None) != API_VERSION:
        sys.modules.pop(NAME, None)  # stale build from older sources: rebuild below
        return None
    return module


def _build():
    from torch.utils import cpp_extension
    if cpp_extension.CUDA_HOME is None:
        return None, "no CUDA toolkit (nvcc) to build them"
    if not os.path.exists(os.path.join(CSRC, "bindings.cpp")):
        return None, f"sources not found in {CSRC} (install from a source checkout)"
    try:
        module = cpp_extension.load(NAME, sources(), extra_cflags=CXX_FLAGS, extra_cuda_cflags=NVCC_FLAGS,
                                    verbose=os.environ.get("MEGATRON_FUSED_KERNELS_VERBOSE") == "1")
    except Exception as e:  # noqa: BLE001 - any build failure means "use another implementation"
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return None, f"build failed ({first[:200]}); set MEGATRON_FUSED_KERNELS_VERBOSE=1 to see the compiler"
    return module, "built on first use (cached)"


def load():
    """The kernel module, or None when unavailable (reason in status())."""
    if _state["tried"]:
        return _state["module"]
    _state["tried"] = True
    module, status = None, None
    if os.environ.get("MEGATRON_FUSED_KERNELS", "1") == "0":
        status = "off (MEGATRON_FUSED_KERNELS=0)"
    elif torch.version.cuda is None or not torch.cuda.is_available():
        status = "unavailable (no CUDA device)"
    else:
        module = _prebuilt()
        if module is not None:
            status = "prebuilt by setup.py"
        else:
            module, status = _build()
            if module is None:
                status = "unavailable: " + status
    _state["module"], _state["status"] = module, status
    return module


def status():
    return _state["status"]


def cuda_kernels_usable(device):
    """True when our kernels can run on `device` (loading them on the first CUDA call)."""
    return torch.device(device).type == "cuda" and load() is not None
