"""The rank grid: early rejection of bad sizes (tests/distributed/test_parallel_state.py builds it)."""
import pytest

from megatron.core.parallel_state import ParallelConfigError, validate_parallel_sizes


def test_validate_rejects_before_building():
    assert validate_parallel_sizes(8, 2, 2) == 2
    with pytest.raises(ParallelConfigError, match="world size 6 is not divisible by --tensor-model-parallel-size 4"):
        validate_parallel_sizes(6, 4, 1)
    with pytest.raises(ParallelConfigError, match="at least 1"):
        validate_parallel_sizes(4, 0, 1)
    with pytest.raises(ParallelConfigError, match="virtual pipeline"):
        validate_parallel_sizes(4, 2, 1, 2)
