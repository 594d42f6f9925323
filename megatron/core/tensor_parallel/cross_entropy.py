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


class _VocabParallelCE(torch.autograd.Function):
    """Megatron-LM's loss, log(sum exp(x - max)) - (x_target - max), and its gradient (softmax - onehot) g,
    in three passes over [tokens, V/TP] and one back: the max read in the logits' dtype (the same value),
    the subtraction reading them and writing fp32 (the same arithmetic as upcasting first), one softmax
    kernel, which also gives the sum of exponentials (at the row's argmax exp(0) = 1, so the softmax there
    is 1 / sum), and one scaling pass that writes the gradient in the logits' dtype."""

    @staticmethod
    def forward(ctx, logits, target, vocab_size, group):
        ctx.dtype = logits.dtype
        if torch.finfo(logits.dtype).bits > 32:  # math in fp32 whatever the input: fp64 comes down first
            logits = logits.float()
        per_rank = logits.shape[-1]
        start = per_rank * comm.rank(group)
        valid = per_rank if vocab_size is None else max(0, min(per_rank, vocab_size - start))
        tp = comm.world(group) > 1

        # the padding columns masked by index: out of the max here, -inf in `shifted` below
        if valid:
            local_max, argmax = logits[..., :valid].max(dim=-1)
            local_max = local_max.float()
        else:
            local_max = logits.new_full(logits.shape[:-1], float("-inf"), dtype=torch.float32)
        logits_max = local_max.clone() if tp else local_max
        if tp:
            dist.all_reduce(logits_max, op=dist.ReduceOp.MAX, group=group)
        shifted = torch.sub(logits, logits_max.unsqueeze(-1))  # fp32 (type promotion): never the input
        if valid < per_rank:
            shifted[..., valid:] = float("-inf")

        if tp:
            outside = (target < start) | (target >= start + per_rank)
            local_target = (target - start).masked_fill(outside, 0)
        else:  # every target is local
            outside, local_target = None, target
        target_logit = shifted.gather(-1, local_target.unsqueeze(-1)).squeeze(-1)
        if outside is not None:
            target_logit = target_logit.masked_fill(outside, 0.0)

        if valid:
            softmax = torch.softmax(shifted, dim=-1)  # this rank's columns normalised by this rank's sum
            # sum of exp(shifted) here: exp(local max - global max) / softmax at the local argmax
            sum_exp = (local_max - logits_max).exp() / softmax.gather(-1, argmax.unsqueeze(-1)).squeeze(-1)
        else:
            softmax, sum_exp = torch.zeros_like(shifted), torch.zeros_like(local_max)
        local_sum = sum_exp
        if tp:
            both = torch.stack([target_logit, sum_exp])
            dist.all_reduce(both, group=group)
            target_logit, sum_exp = both[0], both[1]
        loss = sum_exp.log() - target_logit
        ctx.save_for_backward(softmax, local_sum / sum_exp if tp else None, local_target, outside)
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        softmax, share, local_target, outside = ctx.saved_tensors
        grad = softmax  # reuse the buffer: backward runs once
        if share is not None:  # this rank's sum's share of the whole vocabulary's: the global softmax
            grad.mul_(share.unsqueeze(-1))
        if outside is None:
            minus_one = torch.full_like(local_target, -1.0, dtype=grad.dtype)
        else:
            minus_one = -(~outside).to(grad.dtype)
        grad.scatter_add_(-1, local_target.unsqueeze(-1), minus_one.unsqueeze(-1))
        out = torch.empty(grad.shape, dtype=ctx.dtype, device=grad.device)
        torch.mul(grad, grad_loss.unsqueeze(-1), out=out)
        return out, None, None, None


def vocab_parallel_cross_entropy(logits, target, vocab_size, group):
    """Per-token loss [s, b] from logits [s, b, V_padded/TP] and target ids [s, b].

    vocab_size: the unpadded vocabulary (None: no padding); columns beyond it are ignored. Talks to
    the TP group `group`. Math in fp32; the gradient has the logits' dtype.
    """
    return _VocabParallelCE.apply(logits, target, vocab_size, group)
