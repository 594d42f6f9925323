"""Every binding of the fused kernels raises a Python exception on every bad input, before any
launch: the CPU test build of the real binding sources (tests/csrc_stub.py; meta tensors stand
for CUDA tensors, the launchers only count their calls). tests/gpu/test_kernel_bindings.py runs
the same cases against the CUDA build, in a subprocess, so that a crash is a failure there.

Each case is one bad argument in an otherwise valid call (which must reach its launcher): the
wrong device, dtype, shape, strides (non-contiguous), a zero or int32-overflowing size, a
non-finite number, a missing tensor. The first build compiles the bindings (a few minutes on
a busy machine); later runs load the cached module.
"""
import pytest

from tests import csrc_stub
from tests.kernel_binding_cases import BAD, GOOD, run_case

pytestmark = pytest.mark.timeout(1800)


@pytest.fixture(scope="module")
def stub():
    return csrc_stub.load()


def test_the_stub_builds_every_binding_of_the_real_module(stub):
    assert set(GOOD) == {name for name in dir(stub) if not name.startswith("_") and callable(getattr(stub, name))}


@pytest.mark.parametrize("binding", sorted(GOOD))
def test_valid_inputs_reach_the_launcher(stub, binding):
    before = stub._stub_launches()
    outputs = run_case(stub, GOOD[binding], "meta")
    assert outputs is not None
    after = stub._stub_launches()
    launched = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    assert launched == {**dict.fromkeys(after, 0), binding: 1}, launched


@pytest.mark.parametrize("case", sorted(BAD), ids=str)
def test_bad_inputs_raise_before_any_launch(stub, case):
    binding = case[0]
    before = stub._stub_launches()
    with pytest.raises((ValueError, TypeError, RuntimeError)) as info:
        run_case(stub, BAD[case], "meta")
    assert stub._stub_launches() == before, f"{case}: launched despite {info.value}"
    if isinstance(info.value, ValueError):
        assert f"megatron_fused_kernels.{binding}" in str(info.value), str(info.value)
