"""Install with `pip install -e .` (add `[test]` for the test suite).

C++/CUDA extensions in csrc/ are added here as they land; none is required to run.
The fused CUDA kernels (csrc/fused) are built only when CUDA torch and nvcc are present at
build time, which pip's isolated build environment hides: on a GPU machine use
`pip install -e . --no-build-isolation` to build them now; otherwise they are compiled on
first use (megatron/core/fusions/_ext.py), or skipped, and plain PyTorch runs instead.
"""
import glob
import os

from setuptools import find_packages, setup


def fused_cuda_kernels():
    """(ext_modules, cmdclass) for csrc/fused, or nothing without CUDA torch + nvcc."""
    if os.environ.get("MEGATRON_FUSED_KERNELS") == "0":
        return [], {}
    try:
        import torch
        from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CUDAExtension
    except ImportError:  # no torch in the build environment: a CPU-only install
        return [], {}
    if torch.version.cuda is None or CUDA_HOME is None:
        return [], {}
    sources = sorted(glob.glob("csrc/fused/*.cu")) + ["csrc/fused/bindings.cpp"]
    ext = CUDAExtension("megatron_fused_kernels", sources,
                        extra_compile_args={"cxx": ["-O3"], "nvcc": ["-O3"]})
    return [ext], {"build_ext": BuildExtension}


ext_modules, cmdclass = fused_cuda_kernels()

setup(
    name="megatron-3d",
    version="0.1.0",
    description="3D-parallel (tensor x pipeline x data) GPT/BERT pretraining on PyTorch, tested on CPU",
    packages=find_packages(include=["megatron", "megatron.*"]),
    py_modules=["pretrain_gpt"],
    python_requires=">=3.9",
    install_requires=["torch>=2.4", "numpy", "sentencepiece", "tensorboard"],
    extras_require={"test": ["pytest", "pytest-timeout"]},
    ext_modules=ext_modules,
    cmdclass=cmdclass,
)
