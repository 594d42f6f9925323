"""Install with `pip install -e .` (add `[test]` for the test suite, `[hf]` for HuggingFace conversion,
`[tiktoken]` for --tokenizer-type TikTokenizer, `[wandb]` for --wandb-project).

Two optional extensions; a failed build of either is a warning, not a failed install:
- csrc/helpers.cpp (dataset index helpers, pybind11) -> megatron.core.datasets.helpers_cpp;
  without it the numpy implementation runs (with a warning when indices are built).
- csrc/fused (CUDA kernels) -> megatron_fused_kernels, only when CUDA torch and nvcc are
  present at build time, which pip's isolated build environment hides: on a GPU machine use
  `pip install -e . --no-build-isolation` to build them now; otherwise they are compiled on
  first use (megatron/core/fusions/_ext.py), or skipped, and plain PyTorch runs instead.
"""
import glob
import importlib.util
import os
import sys

from setuptools import find_packages, setup
from setuptools.command.build_ext import build_ext


def dataset_helpers():
    try:
        from pybind11.setup_helpers import Pybind11Extension
    except ImportError:
        print("warning: pybind11 not available; the C++ dataset helpers are not built", file=sys.stderr)
        return []
    return [Pybind11Extension(
        "megatron.core.datasets.helpers_cpp", ["csrc/helpers.cpp"], cxx_std=17,
        # -ffp-contract=off: no fused multiply-add, so blending matches the Python reference exactly
        extra_compile_args=["-O3", "-ffp-contract=off"] if sys.platform != "win32" else ["/O2", "/fp:strict"])]


def fused_cuda_kernels():
    """(ext_modules, build_ext class) for csrc/fused, or nothing without CUDA torch + nvcc."""
    if os.environ.get("MEGATRON_FUSED_KERNELS") == "0":
        return [], None
    try:
        import torch
        from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CUDAExtension
    except ImportError:  # no torch in the build environment: a CPU-only install
        return [], None
    if torch.version.cuda is None or CUDA_HOME is None:
        return [], None
    # the same list as megatron/core/fusions/_ext.py sources(): every kernel and binding file (not cpu_stub/)
    sources = sorted(glob.glob("csrc/fused/*.cu")) + sorted(glob.glob("csrc/fused/*.cpp"))
    # the module records the hash of its sources; the loader rebuilds it when csrc/fused changes
    spec = importlib.util.spec_from_file_location("source_hash", "megatron/core/fusions/source_hash.py")
    source_hash = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(source_hash)
    flag = source_hash.define_flag("csrc/fused")
    ext = CUDAExtension("megatron_fused_kernels", sources,
                        extra_compile_args={"cxx": ["-O3", flag], "nvcc": ["-O3", flag]})
    return [ext], BuildExtension


cuda_exts, cuda_build_ext = fused_cuda_kernels()


class OptionalBuildExt(cuda_build_ext or build_ext):
    """A failed C++/CUDA build is a warning, not a failed install."""

    def run(self):
        try:
            super().run()
        except Exception as e:  # compiler missing, headers missing, ...
            self._skip(e)

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception as e:
            self._skip(e)

    @staticmethod
    def _skip(e):
        print(f"warning: an optional extension was not built ({e}); the plain Python/PyTorch path will be used",
              file=sys.stderr)


setup(
    name="megatron-3d",
    version="0.1.0",
    description="3D-parallel (tensor x pipeline x data) GPT/BERT pretraining on PyTorch, tested on CPU",
    packages=find_packages(include=["megatron", "megatron.*"]),
    # the planner's calibration and validation tables; the per-GPU kernel choices
    package_data={"megatron.training.planner": ["*.toml"], "megatron.core.fusions": ["kernel_table.json"]},
    py_modules=["pretrain_gpt"],
    ext_modules=dataset_helpers() + cuda_exts,
    cmdclass={"build_ext": OptionalBuildExt},
    python_requires=">=3.10",
    install_requires=["torch>=2.4", "numpy", "sentencepiece", "tensorboard", "regex", "pyyaml"],  # pyyaml: --yaml-cfg
    # hf: HuggingFace tokenizers (--tokenizer-type HuggingFaceTokenizer) and checkpoint conversion
    # (tools/checkpoint/convert.py); tiktoken: --tokenizer-type TikTokenizer; wandb: --wandb-project (W&B); the tests
    # that need them skip without them
    extras_require={"test": ["pytest", "pytest-timeout", "transformers", "ruff", "tiktoken", "wandb"],
                    "hf": ["tokenizers", "transformers"], "tiktoken": ["tiktoken"], "wandb": ["wandb"]},
)
