"""--check-for-nan-in-loss-and-grad: stop at the first iteration whose loss or grad norm is not finite.

The check runs after the optimizer step and before anything of the iteration is saved, so no
checkpoint of a NaN model is written and the tracker keeps naming the last good one. Its cost:
one all-reduce of two numbers over the world and one host read per iteration (Megatron-LM's
check reads its grad norm on the host every iteration too).
"""
import math

import torch
import torch.distributed as dist

from ...core.pipeline_parallel import ReducedLosses
from ...core.watchdog import waiting

# Megatron-LM's exit code for a run that failed result validation (rerun_state_machine's
# EXIT_CODE_FAILED_ON_RESULT_VALIDATION): job schedulers that know it do not restart the job.
EXIT_NON_FINITE = 17


class NonFiniteError(Exception):
    """A loss or the grad norm was NaN or infinite; every rank raises it at the same iteration.
    The message is the one line that global rank `printer` prints."""

    exit_code = EXIT_NON_FINITE

    def __init__(self, message: str, printer: int):
        super().__init__(message)
        self.printer = printer


def _bad(x) -> torch.Tensor:
    return (~torch.isfinite(x)).any().float()


def check_finite(iteration: int, losses: ReducedLosses, grad_norm, groups, device) -> None:
    """Raise NonFiniteError on every rank when a loss term (last pipeline stage) or the grad
    norm (global; None for a skipped fp16 step) is not finite. Collective over the world group:
    one all-reduce (MAX) of [bad loss, bad grad norm], each encoded as world - (lowest rank seeing it)."""
    world = groups.world_size
    flags = torch.zeros(2, device=device)
    if groups.is_last_stage and losses:
        flags[0] = _bad(torch.stack([total for total, _ in losses.values()])) * (world - groups.rank)
    if grad_norm is not None:
        flags[1] = _bad(grad_norm) * (world - groups.rank)
    if world > 1:
        with waiting("all-reduce (NaN check)"):
            dist.all_reduce(flags, op=dist.ReduceOp.MAX)
    loss_at, norm_at = (world - int(v) if v > 0 else None for v in flags.tolist())
    if loss_at is None and norm_at is None:
        return
    what = []
    if loss_at is not None:
        values = ", ".join(f"{k} {float(t / c)}" for k, (t, c) in losses.items()) if groups.rank == loss_at else ""
        what.append(f"the loss is not finite on the last pipeline stage (stage {groups.pp_size - 1}, first seen "
                    f"on rank {loss_at}{': ' + values if values else ''})")
    if norm_at is not None:
        norm = float(grad_norm) if grad_norm is not None else math.nan
        what.append(f"the gradient norm (global over all ranks) is {norm}")
    raise NonFiniteError(f"iteration {iteration}: {' and '.join(what)}; stopped before saving this iteration "
                         "(--no-check-for-nan-in-loss-and-grad to train on)", loss_at if loss_at is not None else 0)
