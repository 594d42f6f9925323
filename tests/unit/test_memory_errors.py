"""An allocation failure while building (megatron/training/memory_errors.py): one ConfigError line
for the CPU allocator's and CUDA's messages; any other error passes through unchanged."""
import pytest
import torch

from megatron.core.errors import ConfigError
from megatron.training.memory_errors import building

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
