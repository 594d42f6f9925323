"""The rank grid: early rejection of bad sizes (tests/distributed/test_parallel_state.py builds it)."""
import pytest

from megatron.core.parallel_layout import ParallelLayout
from megatron.core.parallel_state import ParallelConfigError


def test_validate_rejects_before_building():
    assert ParallelLayout(8, tp=2, pp=2).dp == 2
    with pytest.raises(ParallelConfigError, match="world size 6 is not divisible by --tensor-model-parallel-size 4"):
        ParallelLayout(6, tp=4)
    with pytest.raises(ParallelConfigError, match="at least 1"):
        ParallelLayout(4, tp=0)
    with pytest.raises(ParallelConfigError, match="virtual pipeline"):
        ParallelLayout(4, tp=2, vpp=2)
