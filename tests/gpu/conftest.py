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


SMALL_POOL_MAX = 1 << 20  # requests up to 1 MiB come from the caching allocator's small pool (2 MiB segments)


def _free_blocks(device, stream):
    """[(size, 'small' | 'large')] of every free block the caching allocator holds for (device, stream)."""
    return [(block["size"], segment["segment_type"]) for segment in torch.cuda.memory_snapshot()
            if segment["device"] == device and segment.get("stream", 0) == stream
            for block in segment["blocks"] if block["state"] == "inactive"]


def poison_cache(large_bytes=256 << 20, small_segments=8):
    """Make every block the caching allocator can hand out next read as NaN (0xFF bytes: NaN in
    fp32, fp16 and bf16), so that an output element a kernel forgets to write fails the test
    instead of reading a lucky zero.

    Freeing one large poisoned tensor reaches only the large pool: allocations of 1 MiB or less
    (most outputs of small shapes) come from the small pool, whose free blocks keep what was
    there before. So: add fresh segments to both pools, then take every free block the allocator
    lists (the smallest first, each exactly), fill them all, and give them back.
    """
    device, stream = torch.cuda.current_device(), torch.cuda.current_stream().cuda_stream
    torch.cuda.synchronize()
    spare = [torch.empty(large_bytes, dtype=torch.uint8, device="cuda")]
    spare += [torch.empty(SMALL_POOL_MAX // 2, dtype=torch.uint8, device="cuda") for _ in range(4 * small_segments)]
    del spare  # free again: taken back (and poisoned) below
    held = []
    for _ in range(10000):  # a bound, should the allocator ever not hand out the block asked for
        free = _free_blocks(device, stream)
        if not free:
            break
        size, pool = min(free)
        held.append(torch.empty(min(size, SMALL_POOL_MAX) if pool == "small" else size, dtype=torch.uint8,
                                device="cuda"))
    for block in held:
        block.fill_(0xFF)
    torch.cuda.synchronize()
    del held
