"""Measured GPU memory in the training log, beside the memory estimator's figure.

At the first logged iteration each rank of data-parallel rank 0 (the others hold the same)
prints Megatron-LM's line

    [Rank r] (after N iterations) memory (MB) | allocated: ... | max allocated: ... | reserved: ... |
    max reserved: ...

followed by `| estimated peak: ...`, tools/estimate_memory.py's total for that rank's pipeline
stage (what max allocated should stay under). Off CUDA there is nothing to measure and nothing
is printed. The stats source is a function of the device, so tests can give a fake one.
"""
from collections.abc import Callable

import torch

from ..planner import memory as estimator

MB = 2.0 ** 20
Stats = tuple  # (allocated, max allocated, reserved, max reserved) bytes


def cuda_memory_stats(device) -> Stats | None:
    """This process's CUDA allocator figures for `device`, or None when it is not a CUDA device."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    return (torch.cuda.memory_allocated(device), torch.cuda.max_memory_allocated(device),
            torch.cuda.memory_reserved(device), torch.cuda.max_memory_reserved(device))


def estimated_peak(model_cfg, train_cfg, world_size, pp_rank) -> int | str:
    """The memory estimator's (planner/memory.py) peak bytes of a rank of pipeline stage pp_rank (resolved
    configs), or why there is none: like the planner's line, the estimate is information and never stops a run."""
    try:
        return int(estimator.total_bytes(estimator.estimate(model_cfg, train_cfg, world_size, pp_rank)))
    except Exception as e:  # noqa: BLE001 - an estimate must never stop training
        return f"{type(e).__name__}: {e}".splitlines()[0][:200]


def memory_line(rank, iteration, stats: Stats, estimate: int | str) -> str:
    """Megatron-LM's memory line, then the estimate (bytes) or why there is none (a string)."""
    allocated, max_allocated, reserved, max_reserved = (b / MB for b in stats)
    line = (f"[Rank {rank}] (after {iteration} iterations) memory (MB) | allocated: {allocated:.1f} | "
            f"max allocated: {max_allocated:.1f} | reserved: {reserved:.1f} | max reserved: {max_reserved:.1f}")
    if isinstance(estimate, str):
        return line + f" | estimated peak: n/a ({estimate})"
    return line + f" | estimated peak: {estimate / MB:.1f} (tools/estimate_memory.py)"


def report_memory(iteration, groups, model_cfg, train_cfg, device,
                  stats_source: Callable[[object], Stats | None] = cuda_memory_stats) -> str | None:
    """Print (and return) this rank's memory line, on data-parallel rank 0 where stats_source(device)
    has figures; None elsewhere. groups: the ProcessGroups (rank, dp_rank, pp_rank, world_size)."""
    stats = stats_source(device)
    if stats is None or groups.dp_rank != 0:
        return None
    estimate = estimated_peak(model_cfg, train_cfg, groups.world_size, groups.pp_rank)
    line = memory_line(groups.rank, iteration, stats, estimate)
    print(line, flush=True)
    return line
