"""An allocation failure while building or in a step (megatron/training/loop/memory_errors.py): one
ConfigError line for the CPU allocator's and CUDA's messages; any other error passes through unchanged."""
import pytest
import torch

from megatron.core.errors import ConfigError
from megatron.training.loop.memory_errors import building, running

CPU = ("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you tried to "
       "allocate 120000000000 bytes. Error code 12 (Cannot allocate memory)")
CUDA = "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.1 GiB"


@pytest.mark.parametrize("error,failed", [(RuntimeError(CPU), "an allocation of 111.8 GiB failed"),
                                          (torch.OutOfMemoryError(CUDA), "an allocation of 2.00 GiB failed"),
                                          (MemoryError(), "MemoryError")])
def test_out_of_memory_is_one_line_naming_what_and_how_much(error, failed):
    with pytest.raises(ConfigError) as info, building("the model", lambda: 1 << 30, torch.bfloat16, 3):
        raise error
    msg = str(info.value)
    assert msg.startswith("out of memory building the model on rank 3: its 1,073,741,824 parameters need 2.0 GiB "
                          "as bfloat16, and training adds about 16.0 GiB") and failed in msg and "\n" not in msg


def test_other_errors_pass_through():
    with pytest.raises(RuntimeError, match="shape mismatch"), building("the model", lambda: 1, torch.float32, 0):
        raise RuntimeError("shape mismatch")


@pytest.mark.parametrize("estimate,said", [(5 << 29, "is 2.5 GiB,"), ("no GPU figures", "is n/a: no GPU figures,")])
def test_out_of_memory_in_a_step_names_the_step_the_estimate_and_the_flags(estimate, said):
    with pytest.raises(ConfigError) as info, running("iteration 7", 2, lambda: estimate):
        raise torch.OutOfMemoryError(CUDA)
    msg = str(info.value)
    assert msg.startswith("out of memory in iteration 7 on rank 2 (an allocation of 2.00 GiB failed; ")
    assert "the estimated peak of this rank " + said in msg
    assert "--micro-batch-size" in msg and "--recompute-granularity" in msg and "\n" not in msg


def test_a_step_passes_other_errors_through_without_estimating():
    def estimate():
        raise AssertionError("estimated for an error that is not out of memory")
    with pytest.raises(RuntimeError, match="shape mismatch"), running("iteration 1", 0, estimate):
        raise RuntimeError("shape mismatch")
