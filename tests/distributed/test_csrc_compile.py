"""Every CUDA source in csrc/ compiles with nvcc for sm_90, and the binding files against torch's headers.

CPU CI has nvcc but no GPU: this only compiles (tests/gpu runs the kernels). Kept fast:
one architecture (sm_90, H100/H200), all files at once on every core. The .cu files include
no torch header by design (see csrc/fused/fused_kernels.h), so each takes seconds; the binding
files (csrc/fused/*.cpp, the ones that include torch) are syntax-checked with the host compiler
against the CUDA headers, as the module builds them (tests/unit/test_kernel_bindings.py builds
and runs them against stubs).

CPU wheels of torch lack one CMake-generated header that c10/cuda includes,
c10/cuda/impl/cuda_cmake_macros.h; CUDA wheels ship it with the single line written below,
so the check supplies that file from a temporary include directory.
"""
import concurrent.futures
import glob
import os
import re
import shutil
import subprocess
import sysconfig

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CU_FILES = sorted(glob.glob(os.path.join(REPO, "csrc", "**", "*.cu"), recursive=True))
CPP_FILES = sorted(glob.glob(os.path.join(REPO, "csrc", "fused", "*.cpp")))
ARCH = ["-gencode", "arch=compute_90,code=sm_90"]


def _nvcc():
    from torch.utils import cpp_extension
    home = cpp_extension.CUDA_HOME or os.environ.get("CUDA_HOME")
    candidate = os.path.join(home, "bin", "nvcc") if home else None
    return candidate if candidate and os.path.exists(candidate) else shutil.which("nvcc")


def _cuda_include(nvcc):
    """The toolkit's include directory (nvcc may be a wrapper script outside the toolkit)."""
    from torch.utils import cpp_extension
    homes = [cpp_extension.CUDA_HOME, os.environ.get("CUDA_HOME"),
             os.path.dirname(os.path.dirname(os.path.realpath(nvcc))), "/usr/local/cuda"]
    try:  # ask nvcc where it looks: its dry run prints the toolkit's TOP directory
        dry = subprocess.run([nvcc, "--dryrun", "-E", "-x", "cu", os.devnull], capture_output=True, text=True,
                             timeout=60)
        homes += re.findall(r"TOP=(\S+)", dry.stdout + dry.stderr)
    except (OSError, subprocess.SubprocessError):
        pass
    for home in filter(None, homes):
        if os.path.exists(os.path.join(home, "include", "cuda_runtime_api.h")):
            return os.path.join(home, "include")
    return os.path.join(homes[2], "include")


def _compile(cmd):
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    return proc.returncode, (proc.stdout + proc.stderr)[-6000:]


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """Compile everything in parallel once: {file: (returncode, output)}."""
    nvcc = _nvcc()
    if nvcc is None:
        pytest.skip("nvcc not found (no CUDA toolkit): the CUDA sources cannot be compile-checked")
    out = tmp_path_factory.mktemp("csrc")
    from torch.utils import cpp_extension
    torch_inc = cpp_extension.include_paths()
    cuda_inc = _cuda_include(nvcc)
    shim = out / "shim" / "c10" / "cuda" / "impl"
    shim.mkdir(parents=True)
    (shim / "cuda_cmake_macros.h").write_text("#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n")
    # bind_wgrad.cpp calls cuBLAS where its headers are: the toolkit's, pip's nvidia wheels' or
    # MEGATRON_CUBLAS_INCLUDE's (else its guarded build is what compiles)
    cublas = [os.environ.get("MEGATRON_CUBLAS_INCLUDE", "")] + glob.glob(os.path.join(
        sysconfig.get_paths()["purelib"], "nvidia", "*", "include"))
    cublas = [f"-I{d}" for d in cublas if d and os.path.exists(os.path.join(d, "cublas_v2.h"))]
    jobs = {f: [nvcc, "-c", f, "-o", str(out / (os.path.basename(f) + ".o")), "-std=c++17", "-O3",
                "-Xcompiler", "-fPIC"] + ARCH for f in CU_FILES}
    cxx = shutil.which("c++") or shutil.which("g++")
    skip_bindings = None
    if cxx is None:
        skip_bindings = "no host C++ compiler"
    elif not os.path.exists(os.path.join(torch_inc[0], "ATen", "ATen.h")):
        skip_bindings = "torch's C++ headers are not installed"
    elif not os.path.exists(os.path.join(cuda_inc, "cuda_runtime_api.h")):
        skip_bindings = f"cuda_runtime_api.h not found in {cuda_inc}"
    else:
        for cpp in CPP_FILES:
            jobs[cpp] = ([cxx, "-fsyntax-only", "-std=c++17", f"-I{out / 'shim'}"]
                         + [f"-I{p}" for p in torch_inc]
                         + [f"-I{sysconfig.get_paths()['include']}", f"-I{cuda_inc}",
                            "-DTORCH_EXTENSION_NAME=megatron_fused_kernels", "-w"] + cublas + [cpp])
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        results = dict(zip(jobs, pool.map(_compile, jobs.values())))
    return results, skip_bindings


def test_there_are_kernels():
    names = {os.path.basename(f) for f in CU_FILES}
    assert {"softmax.cu", "norm.cu", "bias_gelu.cu", "swiglu.cu", "rope.cu", "column_sums.cu"} <= names, names
    assert {"bindings.cpp", "checks.cpp", "device.cpp"} <= {os.path.basename(f) for f in CPP_FILES}


@pytest.mark.parametrize("path", CU_FILES, ids=lambda p: os.path.relpath(p, REPO))
def test_cuda_source_compiles(compiled, path):
    results, _ = compiled
    rc, output = results[path]
    assert rc == 0, f"nvcc failed on {os.path.relpath(path, REPO)}:\n{output}"


@pytest.mark.parametrize("path", CPP_FILES, ids=lambda p: os.path.relpath(p, REPO))
def test_bindings_compile_against_torch_headers(compiled, path):
    results, skip = compiled
    if skip:
        pytest.skip(skip)
    rc, output = results[path]
    assert rc == 0, f"{os.path.relpath(path, REPO)} does not compile:\n{output}"


def test_extension_sources_match_the_files():
    """The loader and setup.py build exactly the files that are compile-checked here."""
    from megatron.core.fusions import _ext
    assert _ext.sources() == [f for f in CU_FILES if os.path.dirname(f) == _ext.CSRC] + CPP_FILES
