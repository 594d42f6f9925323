"""The fused vocabulary-parallel cross entropy (--cross-entropy-loss-fusion, Megatron-LM's flag).

Same loss and gradient as cross_entropy.py, in fewer passes over the [tokens, vocab/TP] logits and
without an fp32 copy of them: the tokens go in chunks (CHUNK_BYTES of fp32 each), and per chunk

  forward:  one log-softmax that reads the logits (of any dtype) and writes fp32, from which the loss
            (TP 1: -log p[target]) or this rank's log-sum-exp is read (TP > 1: at the row's maximum,
            found by one more read, where log p is largest and so most precise);
  backward: one softmax from the logits again, times the gradient of the loss, written over the logits
            (their storage: the output layer's backward does not need them), the target's -1 added.

Nothing of size [tokens, vocab] is kept for backward but the logits themselves. Over TP the ranks'
log-sum-exps are combined from two [tokens] all-reduces (max, then sum with the target logits), as
cross_entropy.py's max and sums; each rank's softmax is scaled by exp(lse_rank - lse). Vocabulary
padding (columns >= vocab_size) is never read: the softmax runs over a view of the real columns and
the padding's gradient is zeroed.
"""
import torch
import torch.distributed as dist

from .. import comm

CHUNK_BYTES = 256 * 2**20  # fp32 bytes of one chunk's [rows, vocab/TP] temporaries


def _fp32_softmax(x, log):
    """(log-)softmax over the last dim in fp32 from x of any dtype: in one kernel where torch has it for
    half inputs (CUDA), else after a conversion."""
    if x.is_cuda and x.dtype in (torch.float16, torch.bfloat16):
        try:
            return (torch._log_softmax if log else torch._softmax)(x, -1, True)
        except RuntimeError:  # this build converts only some half types
            pass
    return (torch.log_softmax if log else torch.softmax)(x, -1, dtype=torch.float32)


def _chunks(rows, cols):
    step = max(1, CHUNK_BYTES // max(1, 4 * cols))
    return [(r, min(r + step, rows)) for r in range(0, rows, step)]


class _FusedVocabParallelCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, target, vocab_size, group):
        x = logits.reshape(-1, logits.shape[-1])
        t = target.reshape(-1)
        per_rank, tp = x.shape[-1], comm.world(group)
        start = per_rank * comm.rank(group) if tp > 1 else 0
        valid = per_rank if vocab_size is None else max(0, min(per_rank, vocab_size - start))
        xv = x[:, :valid]
        local = t - start
        inside = (local >= 0) & (local < valid) if tp > 1 else None
        if inside is not None:
            local = local.masked_fill(~inside, 0)
        rows = torch.arange(x.shape[0], device=x.device)
        loss = torch.empty(x.shape[0], dtype=torch.float32, device=x.device)
        if valid == 0:  # a rank holding padding only: no mass
            loss.fill_(float("-inf"))
        for r0, r1 in _chunks(x.shape[0], valid) if valid else []:
            logp = _fp32_softmax(xv[r0:r1], log=True)
            if tp == 1:
                loss[r0:r1] = -logp[rows[: r1 - r0], local[r0:r1]]
            else:  # this rank's log-sum-exp, read where log p is largest
                top, at = xv[r0:r1].max(-1)
                loss[r0:r1] = top.float() - logp[rows[: r1 - r0], at]
        scale = None
        if tp > 1:  # loss holds each rank's lse: combine them, then subtract the target logit
            lse_rank = loss
            lse_max = lse_rank.clone()
            dist.all_reduce(lse_max, op=dist.ReduceOp.MAX, group=group)
            target_logit = x[rows, local].float().masked_fill(~inside, 0.0)
            both = torch.stack([torch.exp(lse_rank - lse_max), target_logit])
            dist.all_reduce(both, group=group)
            lse = lse_max + both[0].log()
            scale = torch.exp(lse_rank - lse)  # this rank's softmax -> the global one
            loss = lse - both[1]
        ctx.save_for_backward(logits, local, inside, scale)
        ctx.valid = valid
        return loss.view(target.shape)

    @staticmethod
    def backward(ctx, grad_loss):
        logits, local, inside, scale = ctx.saved_tensors
        x = logits.reshape(-1, logits.shape[-1])  # the gradient is written here, chunk by chunk
        valid, rows = ctx.valid, torch.arange(x.shape[0], device=x.device)
        g = grad_loss.reshape(-1).float()
        factor = g if scale is None else g * scale
        for r0, r1 in _chunks(x.shape[0], valid) if valid else []:
            p = _fp32_softmax(x[r0:r1, :valid], log=False)
            idx, t = rows[: r1 - r0], local[r0:r1]
            at_target = p[idx, t] * factor[r0:r1] - g[r0:r1]  # d/dx_t of (lse - x_t), times g
            if inside is not None:
                at_target = torch.where(inside[r0:r1], at_target, p[idx, t] * factor[r0:r1])
            torch.mul(p, factor[r0:r1, None], out=x[r0:r1, :valid])
            x[r0 + idx, t] = at_target.to(x.dtype)
        if valid < x.shape[-1]:
            x[:, valid:].zero_()
        return x.view(logits.shape), None, None, None


def fused_vocab_parallel_cross_entropy(logits, target, vocab_size, group):
    """Per-token loss [s, b] (fp32) from logits [s, b, V_padded/TP] and target ids [s, b], as
    cross_entropy.vocab_parallel_cross_entropy; the logits' storage receives their gradient in the backward.
    vocab_size: the unpadded vocabulary (columns beyond it are padding). Talks to the TP group `group`."""
    return _FusedVocabParallelCE.apply(logits, target, vocab_size, group)
