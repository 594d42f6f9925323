"""Measured GPU memory in the training log, beside the memory estimator's figure.

At the first logged iteration each rank of data-parallel rank 0 (the others hold the same)
prints Megatron-LM's line

    [Rank r] (after N iterations) memory (MB) | allocated: ... | max allocated: ... | reserved: ... |
    max reserved: ...

followed by `| estimated peak: ...`, tools/estimate_memory.py's total for that rank's pipeline
stage (what --max allocated should stay under). Off CUDA there is nothing to measure and nothing
is printed. The stats source is a function of the device, so tests can give a fake one.
"""
from typing import Callable, Optional

import torch

from ..core.errors import MegatronUserError
from .planner.predict import estimator  # loads tools/estimate_memory.py from the checkout

MB = 2.0 ** 20
Stats = tuple  # (allocated, max allocated, reserved, max reserved) bytes


def cuda_memory_stats(device) -> Optional[Stats]:
    """This process's CUDA allocator figures for `device`, or None when it is not a CUDA device."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    return (torch.cuda.memory_allocated(device), torch.cuda.max_memory_allocated(device),
            torch.cuda.memory_reserved(device), torch.cuda.max_memory_reserved(device))


def estimated_peak_bytes(model_cfg, train_cfg, world_size, pp_rank) -> Optional[int]:
    """tools/estimate_memory.py's peak bytes of a rank of pipeline stage pp_rank (resolved configs),
    or None where the estimator is not in this copy or cannot price the layout."""
    try:
        est = estimator()
        return int(est.total_bytes(est.estimate(model_cfg, train_cfg, world_size, pp_rank)))
    except (OSError, MegatronUserError):
        return None


def memory_line(rank, iteration, stats: Stats, estimate: Optional[int]) -> str:
    allocated, max_allocated, reserved, max_reserved = (b / MB for b in stats)
    line = (f"[Rank {rank}] (after {iteration} iterations) memory (MB) | allocated: {allocated:.1f} | "
            f"max allocated: {max_allocated:.1f} | reserved: {reserved:.1f} | max reserved: {max_reserved:.1f}")
    if estimate is None:
        return line + " | estimated peak: n/a (tools/estimate_memory.py not available)"
    return line + f" | estimated peak: {estimate / MB:.1f} (tools/estimate_memory.py)"


def report_memory(iteration, groups, model_cfg, train_cfg, device,
                  stats_source: Callable[[object], Optional[Stats]] = cuda_memory_stats) -> Optional[str]:
    """Print (and return) this rank's memory line, on data-parallel rank 0 where stats_source(device)
    has figures; None elsewhere. groups: the ProcessGroups (rank, dp_rank, pp_rank, world_size)."""
    stats = stats_source(device)
    if stats is None or groups.dp_rank != 0:
        return None
    estimate = estimated_peak_bytes(model_cfg, train_cfg, groups.world_size, groups.pp_rank)
    line = memory_line(groups.rank, iteration, stats, estimate)
    print(line, flush=True)
    return line
