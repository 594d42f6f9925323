"""helpers_cpp refuses output arrays it could only fill through a temporary copy.

pybind11 converts an argument of another dtype, a strided view or a read-only array into a
copy; for an output array the results would then vanish. The bindings check instead and
name the argument and the dtype they need.
"""
import numpy as np
import pytest

from megatron.core.datasets import helpers

pytestmark = pytest.mark.skipif(helpers.helpers_cpp is None, reason="C++ helpers not built "
                                "(pip install -e . or python setup.py build_ext --inplace)")
WEIGHTS = np.array([0.25, 0.75])
N = 12


def _blend(index, sample_index):
    helpers.helpers_cpp.build_blending_indices(index, sample_index, WEIGHTS, N)


def test_right_outputs_are_written_in_place():
    index, sample_index = np.full(N, -1, np.int16), np.full(N, -1, np.int64)
    _blend(index, sample_index)
    ref_index, ref_sample = helpers.build_blending_indices_numpy(WEIGHTS, N)
    assert np.array_equal(index, ref_index) and np.array_equal(sample_index, ref_sample)


@pytest.mark.parametrize("which,dtype", [("dataset_index", np.int32), ("dataset_index", np.int8),
                                         ("dataset_index", np.float64), ("dataset_sample_index", np.int32),
                                         ("dataset_sample_index", np.uint64)])
def test_wrong_dtype_output_raises(which, dtype):
    arrays = {"dataset_index": np.zeros(N, np.int16), "dataset_sample_index": np.zeros(N, np.int64)}
    want = arrays[which].dtype
    arrays[which] = np.zeros(N, dtype)
    with pytest.raises(TypeError, match=f"{which} must have dtype {want}, got {np.dtype(dtype)}"):
        _blend(arrays["dataset_index"], arrays["dataset_sample_index"])


@pytest.mark.parametrize("which", ["dataset_index", "dataset_sample_index"])
def test_non_contiguous_output_raises(which):
    arrays = {"dataset_index": np.zeros(N, np.int16), "dataset_sample_index": np.zeros(N, np.int64)}
    strided = np.zeros(2 * N, arrays[which].dtype)[::2]
    assert not strided.flags.c_contiguous
    arrays[which] = strided
    with pytest.raises(ValueError, match=f"{which} must be C-contiguous"):
        _blend(arrays["dataset_index"], arrays["dataset_sample_index"])
    assert not strided.any()


def test_read_only_and_2d_outputs_raise():
    read_only = np.zeros(N, np.int16)
    read_only.flags.writeable = False
    with pytest.raises(ValueError, match="dataset_index must be writeable"):
        _blend(read_only, np.zeros(N, np.int64))
    with pytest.raises(ValueError, match="dataset_sample_index must be 1-D"):
        _blend(np.zeros(N, np.int16), np.zeros((1, N), np.int64))
