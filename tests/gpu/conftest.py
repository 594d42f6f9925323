"""GPU tests: skipped without CUDA. Run on a GPU machine with `python -m pytest -q tests/gpu`.

The fused kernels are built on first use (minutes once, cached); a build failure is a test
failure here, not a skip: on a CUDA machine the kernels are expected to work.
"""
import pytest
import torch

from megatron.core.fusions import _ext


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (these tests run the fused kernels)")
    for item in items:
        if "tests/gpu/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def ext():
    module = _ext.load()
    assert module is not None, f"fused kernels did not load: {_ext.status()}"
    return module


def poison_cache(nbytes=256 << 20):
    """Fill a large block with 0xFF bytes (NaN in fp32, fp16 and bf16) and free it: the
    caching allocator hands that memory to the next allocations, so an output element a
    kernel forgets to write reads as NaN instead of a lucky zero."""
    torch.empty(nbytes, dtype=torch.uint8, device="cuda").fill_(0xFF)
    torch.cuda.synchronize()
