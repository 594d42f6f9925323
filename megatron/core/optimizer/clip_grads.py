"""The true global gradient norm over all model-parallel ranks, and clipping by it."""
import torch
import torch.distributed as dist

from ..tensor_parallel.param_meta import counted_once


def squares(tensors, device):
    """Sum of the squared L2 norms of `tensors` (fp32 0-d tensor on `device`; 0 for none)."""
    if not tensors:
        return torch.zeros((), device=device)
    return torch.stack(torch._foreach_norm(tensors, 2, dtype=torch.float32)).pow(2).sum()


def zeros(tensors, device):
    """Number of elements equal to zero in `tensors` (int64 0-d tensor on `device`)."""
    total = torch.zeros((), dtype=torch.int64, device=device)
    for t in tensors:
        total += t.numel() - torch.count_nonzero(t)
    return total


def model_sum(dense, expert, groups, dense_groups):
    """The whole model's total of a per-element quantity, each element once, from this rank's totals:
    `dense` over its counted dense pieces, summed over `dense_groups`; `expert` (None without expert
    parallelism) over its experts' pieces (held by one expert-parallel rank each, identical over
    expert-DP), summed over groups.mp and groups.ep (folded grid: expert-TP, EP and PP)."""
    if expert is None:
        for group in dense_groups:
            if dist.get_world_size(group) > 1:
                dist.all_reduce(dense, group=group)
        return dense
    if groups.expert_folded:  # the expert shards are over expert-TP x EP (parallel_state), not TP x EP
        for group, t in ((groups.mp, dense), (groups.etp, expert), (groups.ep, expert), (groups.pp, expert)):
            if group is not None and dist.get_world_size(group) > 1:
                dist.all_reduce(t, group=group)
        return dense + expert
    total = torch.stack([dense, expert])
    if dist.get_world_size(groups.mp) > 1:
        dist.all_reduce(total, group=groups.mp)
    expert_total = total[1].clone()
    dist.all_reduce(expert_total, group=groups.ep)
    return total[0] + expert_total


def global_norm(grads, reduce_groups, device):
    """L2 norm (fp32 tensor on `device`) of `grads` (this rank's part) summed over `reduce_groups`."""
    return model_sum(squares(grads, device), None, None, reduce_groups).sqrt()


def get_grad_norm(params, groups):
    """L2 norm of all `.grad`s of the model (fp32 tensor, on the grads' device).

    Sums squares locally, then all-reduces over the model-parallel group (TP x PP). The
    grads must already be reduced over DP (identical on every DP rank). Replicated
    copies count once (param_meta.counted_once).
    """
    grads = [p.grad for p in params if p.grad is not None and counted_once(p, groups)]
    return global_norm(grads, [groups.mp], next(iter(params)).device)


def clip_by_norm_(grads, max_norm, total_norm):
    """Scale the tensors in `grads` by min(1, max_norm / total_norm) without a host sync."""
    if max_norm <= 0 or not grads:
        return
    coeff = (max_norm / (total_norm + 1e-6)).clamp(max=1.0)
    torch._foreach_mul_(grads, coeff.to(grads[0].dtype))


def clip_divisor(max_norm, total_norm):
    """max(1, total_norm / max_norm) as an fp32 tensor (no host sync): dividing by it is clip_by_norm_'s
    scaling, in the form torch's fused AdamW takes (its grad_scale); None without clipping."""
    if max_norm <= 0:
        return None
    return ((total_norm + 1e-6) / max_norm).clamp(min=1.0).to(torch.float32)


def clip_grads_(params, max_norm, total_norm):
    """clip_by_norm_ on the `.grad`s of `params`."""
    clip_by_norm_([p.grad for p in params if p.grad is not None], max_norm, total_norm)
