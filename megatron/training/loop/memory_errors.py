"""An allocation that fails while the model, its gradient buffers or its optimizer state are built
(a --hidden-size too large for the host or GPU, a memory limit) becomes one line saying what was being
built and how much memory this rank's parameters need, instead of the allocator's traceback; one that
fails in a training or evaluation step (activations) becomes one line naming the iteration, the memory
estimator's figure for the rank and the flags that lower activation memory (exit code 2, as bad input).

The parameter count comes from the same model built again on the meta device (no memory), so the
figure is exact for this rank's pipeline stage and TP shard; the bytes per parameter beyond the
weights are the usual mixed-precision Adam ones (tools/estimate_memory.py gives every part exactly).
"""
import contextlib
import re

import torch

from ...core.errors import ConfigError


def is_out_of_memory(e):
    """torch's CPU allocator ("can't allocate memory"), CUDA's OutOfMemoryError, or Python's MemoryError."""
    text = str(e).lower()
    return isinstance(e, MemoryError) or "can't allocate memory" in text or "out of memory" in text


def _gib(n):
    return f"{n / 2 ** 30:,.1f} GiB"


def _failed(e):
    """The allocation the allocator refused, from its message (CPU: "tried to allocate N bytes"; CUDA:
    "Tried to allocate 2.00 GiB"), or the message's first line."""
    m = re.search(r"[Tt]ried to allocate ([\d.]+)( bytes| ?[KMGT]i?B)", str(e))
    if m is None:
        return (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
    size = _gib(int(m.group(1))) if m.group(2) == " bytes" else m.group(1) + m.group(2)
    return f"an allocation of {size.strip()} failed"


@contextlib.contextmanager
def _refused_as(message):
    """Run the block; an allocation failure in it raises ConfigError(message(the error)), one line; any other
    error passes through."""
    try:
        yield
    except (RuntimeError, MemoryError) as e:
        if not is_out_of_memory(e):
            raise
        raise ConfigError(message(e)) from None


def building(what, count_params, dtype, rank):
    """Run the block; an allocation failure in it raises ConfigError naming `what` (e.g. "the model"),
    this rank's parameter count (count_params(): the model on the meta device) and the memory it needs."""
    def message(e):
        n = count_params()
        size = torch.empty((), dtype=dtype).element_size()
        extra = 4 + 8 + (4 if size != 4 else 0)  # fp32 gradients, Adam's two moments, an fp32 main copy
        return (f"out of memory building {what} on rank {rank}: its {n:,} parameters need {_gib(n * size)} "
                f"as {str(dtype).replace('torch.', '')}, and training adds about {_gib(n * extra)} of "
                f"gradients and optimizer state ({_failed(e)}); lower --hidden-size or --num-layers, "
                "or spread the model with --tensor-model-parallel-size / --pipeline-model-parallel-size "
                "(tools/estimate_memory.py predicts the memory per rank)")
    return _refused_as(message)


def running(where, rank, estimate):
    """Run one training or evaluation step; an allocation failure in it (activations that do not fit:
    a micro batch or sequence too large for the device) raises ConfigError naming where (e.g. "iteration
    3"), the rank, the allocation refused, the estimator's peak for this rank (estimate(): bytes, or why
    there is none) and the flags that lower activation memory. A failed step has saved nothing, so every
    checkpoint written before it stays as it was."""
    def message(e):
        peak = estimate()
        peak = f"{_gib(peak)}" if isinstance(peak, int) else f"n/a: {peak}"
        return (f"out of memory in {where} on rank {rank} ({_failed(e)}; the estimated peak of this rank is "
                f"{peak}, tools/estimate_memory.py); lower --micro-batch-size or --seq-length, recompute "
                "activations (--recompute-granularity selective, or full), or spread them with "
                "--tensor-model-parallel-size and --sequence-parallel, --context-parallel-size or "
                "--pipeline-model-parallel-size")
    return _refused_as(message)
