"""Single-tensor collectives along dim 0, in one place.

torch 2.13 renames all_gather_into_tensor / reduce_scatter_tensor to *_single and warns
on the old names; torch 2.11 (the GPU machine) may lack the new ones. Everything that
gathers or scatters a whole tensor goes through here.
"""
import torch
import torch.distributed as dist

_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def world(group) -> int:
    return dist.get_world_size(group)


def all_gather_dim0(x: torch.Tensor, group) -> torch.Tensor:
    """[n, ...] on each rank -> [n * world, ...] concatenated in group-rank order."""
    size = world(group)
    if size == 1:
        return x
    x = x.contiguous()
    out = torch.empty((x.shape[0] * size,) + tuple(x.shape[1:]), dtype=x.dtype, device=x.device)
    _all_gather(out, x, group=group)
    return out


def reduce_scatter_dim0(x: torch.Tensor, group) -> torch.Tensor:
    """[n * world, ...] on each rank -> the sum over ranks of this rank's [n, ...] slice."""
    size = world(group)
    if size == 1:
        return x
    if x.shape[0] % size:
        raise ValueError(f"dim 0 ({x.shape[0]}) is not divisible by the group size {size}")
    x = x.contiguous()
    out = torch.empty((x.shape[0] // size,) + tuple(x.shape[1:]), dtype=x.dtype, device=x.device)
    _reduce_scatter(out, x, group=group)
    return out


def all_reduce_(x: torch.Tensor, group) -> torch.Tensor:
    """Sum in place over the group; returns x."""
    if world(group) > 1:
        dist.all_reduce(x, group=group)
    return x
