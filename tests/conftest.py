"""Put the repository root on sys.path so `megatron` and `tests.harness` import without
installing the package (spawned ranks inherit this sys.path)."""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


def pytest_collection_modifyitems(config, items):
    """Without MEGATRON_TEST_FULL=1, the full-matrix cases (tests/full_matrix.py) are skipped, named."""
    if os.environ.get("MEGATRON_TEST_FULL") == "1":
        return
    import pytest

    from tests.full_matrix import FULL_ONLY
    skip = pytest.mark.skip(reason="full matrix only: MEGATRON_TEST_FULL=1 runs it (tests/full_matrix.py)")
    for item in items:
        if item.nodeid in FULL_ONLY:
            item.add_marker(skip)
