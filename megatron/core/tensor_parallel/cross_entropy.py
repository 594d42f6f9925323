"""Cross entropy over vocabulary-parallel logits, without gathering the full vocabulary.

Each TP rank holds logits for its slice of the (padded) vocabulary. We all-reduce the
max, the sum of exponentials and the target logit (three [s, b] tensors) instead of
the logits themselves. Padding columns (index >= vocab_size) are excluded, so the
padding never changes the loss or its gradient. --cross-entropy-loss-fusion runs
cross_entropy_fused.py instead: the same function in fewer passes.
"""
import torch
import torch.distributed as dist

from .. import comm
from ..parallel_state import get_process_groups


class _VocabParallelCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, target, vocab_size, group):
        ctx.dtype = logits.dtype
        logits = logits.float()  # the input itself when it is fp32: not written to
        per_rank = logits.shape[-1]
        start = per_rank * dist.get_rank(group)
        valid = per_rank if vocab_size is None else max(0, min(per_rank, vocab_size - start))

        # the padding columns masked by index: out of the max here, -inf in `shifted` below
        logits_max = logits[..., :valid].max(dim=-1).values if valid else \
            logits.new_full(logits.shape[:-1], float("-inf"))
        if comm.world(group) > 1:
            dist.all_reduce(logits_max, op=dist.ReduceOp.MAX, group=group)
        shifted = logits - logits_max.unsqueeze(-1)
        if valid < per_rank:
            shifted[..., valid:] = float("-inf")

        if comm.world(group) > 1:
            outside = (target < start) | (target >= start + per_rank)
            local_target = (target - start).masked_fill(outside, 0)
        else:  # every target is local
            outside, local_target = None, target
        target_logit = shifted.gather(-1, local_target.unsqueeze(-1)).squeeze(-1)
        if outside is not None:
            target_logit = target_logit.masked_fill(outside, 0.0)

        exp = shifted.exp_()
        sum_exp = exp.sum(dim=-1)
        if comm.world(group) > 1:
            both = torch.stack([target_logit, sum_exp])
            dist.all_reduce(both, group=group)
            target_logit, sum_exp = both[0], both[1]
        loss = sum_exp.log() - target_logit

        softmax = exp.div_(sum_exp.unsqueeze(-1))
        ctx.save_for_backward(softmax, local_target, outside)
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        softmax, local_target, outside = ctx.saved_tensors
        grad = softmax  # reuse the buffer: backward runs once
        if outside is None:
            minus_one = torch.full_like(local_target, -1.0, dtype=grad.dtype)
        else:
            minus_one = -(~outside).to(grad.dtype)
        grad.scatter_add_(-1, local_target.unsqueeze(-1), minus_one.unsqueeze(-1))
        grad.mul_(grad_loss.unsqueeze(-1))
        return grad.to(ctx.dtype), None, None, None


def vocab_parallel_cross_entropy(logits, target, vocab_size=None, group=None):
    """Per-token loss [s, b] from logits [s, b, V_padded/TP] and target ids [s, b].

    vocab_size: the unpadded vocabulary; columns beyond it are ignored. Talks to the
    TP group (default: this rank's). Math in fp32; the gradient has the logits' dtype.
    """
    group = group if group is not None else get_process_groups().tp
    return _VocabParallelCE.apply(logits, target, vocab_size, group)
