"""Install with `pip install -e .` (add `[test]` for the test suite, `[hf]` for HuggingFace conversion).

C++/CUDA extensions in csrc/ are added here as they land; none is required to run.
"""
from setuptools import find_packages, setup

setup(
    name="megatron-3d",
    version="0.1.0",
    description="3D-parallel (tensor x pipeline x data) GPT/BERT pretraining on PyTorch, tested on CPU",
    packages=find_packages(include=["megatron", "megatron.*"]),
    py_modules=["pretrain_gpt"],
    python_requires=">=3.9",
    install_requires=["torch>=2.4", "numpy", "sentencepiece", "tensorboard"],
    # hf: checkpoint conversion to/from HuggingFace (tools/checkpoint/convert.py); the
    # conversion tests skip without it
    extras_require={"test": ["pytest", "pytest-timeout", "transformers"], "hf": ["transformers"]},
)
