"""The fused CUDA kernels of csrc/fused, as the Python module `megatron_fused_kernels`.

Where it comes from, first that works:
  1. the module setup.py built (`pip install -e . --no-build-isolation` with CUDA torch and nvcc),
     when it was built from the checkout's sources: its SOURCE_HASH must equal the hash of
     csrc/fused (source_hash.py). A stale one is rebuilt (case 2), with one warning line;
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

from .source_hash import define_flag, source_hash

NAME = "megatron_fused_kernels"
CSRC = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))),
                    "csrc", "fused")
NVCC_FLAGS = ["-O3"]
CXX_FLAGS = ["-O3"]

# the compiled extension, loaded (or found missing) once per process: a process can load a library once, so
# this is the process's fact, three fields, never growing
_state = {"tried": False, "module": None, "status": "not loaded yet"}


def sources(root=CSRC):
    """The extension's sources: every kernel file (*.cu) and every binding file (*.cpp); cpu_stub/
    holds the CPU test build's stand-ins (tests/csrc_stub.py), not part of the module."""
    return sorted(glob.glob(os.path.join(root, "*.cu"))) + sorted(glob.glob(os.path.join(root, "*.cpp")))


def _prebuilt():
    """The module setup.py built, or None."""
    try:
        import megatron_fused_kernels as module  # built by setup.py
    except ImportError:
        return None
    return module


def _build():
    from torch.utils import cpp_extension
    if cpp_extension.CUDA_HOME is None:
        return None, "no CUDA toolkit (nvcc) to build them"
    if not os.path.exists(os.path.join(CSRC, "bindings.cpp")):
        return None, f"sources not found in {CSRC} (install from a source checkout)"
    flag = define_flag(CSRC)  # also in the flags torch's build cache compares: other sources, a new build
    try:
        module = cpp_extension.load(NAME, sources(), extra_cflags=CXX_FLAGS + [flag],
                                    extra_cuda_cflags=NVCC_FLAGS + [flag],
                                    verbose=os.environ.get("MEGATRON_FUSED_KERNELS_VERBOSE") == "1")
    except Exception as e:  # any build failure means "use another implementation"
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return None, f"build failed ({first[:200]}); set MEGATRON_FUSED_KERNELS_VERBOSE=1 to see the compiler"
    return module, "built on first use (cached)"


def _short(h):
    return str(h)[:12]


def _find():
    """(module or None, status): the prebuilt module when its sources are the checkout's, else a build.

    A prebuilt module of other sources (SOURCE_HASH differs, or a build older than the hash) is
    dropped and rebuilt, saying so in one warning line on stderr, whatever the rebuild gives.
    Without the sources (an install without csrc/) there is nothing to compare: the prebuilt is used.
    """
    expected = source_hash(CSRC)
    module = _prebuilt()
    stale = None
    if module is not None:
        built = getattr(module, "SOURCE_HASH", None)
        if expected is None or built == expected:
            return module, "prebuilt by setup.py"
        sys.modules.pop(NAME, None)
        stale = f"the module setup.py built is stale (source hash {_short(built)}, csrc/fused now {_short(expected)})"
    module, status = _build()
    mismatch = module is not None and getattr(module, "SOURCE_HASH", None) != expected
    if mismatch:
        built = _short(getattr(module, "SOURCE_HASH", None))
        module, status = None, f"the module built reports source hash {built}, not csrc/fused's {_short(expected)}"
    if stale or mismatch:
        outcome = "rebuilt it" if module is not None else f"plain torch runs instead ({status})"
        print("warning: fused kernels: " + "; ".join(filter(None, [stale, outcome])), file=sys.stderr, flush=True)
    if module is None:
        return None, "unavailable: " + status
    return module, status + ("; replaced a stale setup.py build" if stale else "")


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
        module, status = _find()
    _state["module"], _state["status"] = module, status
    return module


def status():
    return _state["status"]


def cuda_kernels_usable(device):
    """True when our kernels can run on `device` (loading them on the first CUDA call)."""
    return torch.device(device).type == "cuda" and load() is not None
