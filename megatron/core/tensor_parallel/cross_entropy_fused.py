"""The fused vocabulary-parallel cross entropy (--cross-entropy-loss-fusion, Megatron-LM's flag).

Same loss and gradient as cross_entropy.py, in fewer passes over the [tokens, vocab/TP] logits and
without an fp32 copy of them, by one of two paths:

  compiled (CUDA with torch.compile's GPU backend, triton), as Megatron-LM fuses its own with torch.compile:
            two pure functions over all tokens at once, _lse_and_target (this rank's log-sum-exp of each row,
            padding columns masked, and the target's logit) and _grad_of ((softmax - onehot) g from the global
            log-sum-exp, in the logits' dtype): one kernel that reads the logits in their own dtype forward,
            one that reads them and writes the gradient backward, no [tokens, vocab] temporary;
  eager     (CPU, or no triton): the tokens in chunks (CHUNK_BYTES of fp32 each), and per chunk
              forward:  one log-softmax that reads the logits (of any dtype) and writes fp32, from which the
                        loss (TP 1: -log p[target]) or this rank's log-sum-exp is read (TP > 1: at the row's
                        maximum, found by one more read, where log p is largest and so most precise);
              backward: one softmax from the logits again, times the gradient of the loss, written over the
                        logits (their storage: the output layer's backward does not need them), the target's
                        -1 added.

Nothing of size [tokens, vocab] is kept for backward but the logits themselves. Over TP the ranks'
log-sum-exps are combined from two [tokens] all-reduces (max, then sum with the target logits), as
cross_entropy.py's max and sums (_combine); the eager backward scales each rank's softmax by
exp(lse_rank - lse), the compiled one reads exp(x - lse) directly. Vocabulary padding (columns >= vocab_size)
is out of every sum and its gradient is zero.
"""
import torch
import torch.distributed as dist

from .. import comm
from ..fusions._common import compiled, importable

CHUNK_BYTES = 256 * 2**20  # fp32 bytes of one chunk's [rows, vocab/TP] temporaries (the eager path)


def _fp32_softmax(x, log):
    """(log-)softmax over the last dim in fp32 from x of any dtype: in one kernel where torch has it for
    half inputs (CUDA), else after a conversion."""
    if x.is_cuda and x.dtype in (torch.float16, torch.bfloat16):
        try:
            return (torch._log_softmax if log else torch._softmax)(x, -1, True)
        except RuntimeError:  # this build converts only some half types
            pass
    return (torch.log_softmax if log else torch.softmax)(x, -1, dtype=torch.float32)


def _masked_fp32(x, valid):
    xf = x.float()
    if valid < x.shape[-1]:  # vocabulary padding: out of every sum
        cols = torch.arange(x.shape[-1], device=x.device)
        xf = xf.masked_fill(cols >= valid, float("-inf"))
    return xf


def _lse_and_target(x, local, inside, valid: int):
    """([rows] log-sum-exp over this rank's real columns, [rows] target logit) in fp32 from x [rows, V/TP]."""
    xf = _masked_fp32(x, valid)
    target = xf.gather(-1, local.unsqueeze(-1)).squeeze(-1)
    if inside is not None:
        target = target.masked_fill(~inside, 0.0)
    return torch.logsumexp(xf, -1), target


def _grad_of(x, lse, local, inside, g, valid: int):
    """d(lse - x_target)/dx times g, [rows, V/TP] in x's dtype, from the global log-sum-exp `lse`."""
    xf = _masked_fp32(x, valid)
    cols = torch.arange(x.shape[-1], device=x.device)
    onehot = cols == local.unsqueeze(-1)
    if inside is not None:
        onehot = onehot & inside.unsqueeze(-1)
    return ((torch.exp(xf - lse.unsqueeze(-1)) - onehot.float()) * g.unsqueeze(-1)).to(x.dtype)


def use_compiled(x):
    """The compiled functions run for `x`: a CUDA tensor, and torch.compile's GPU backend installed."""
    return x.is_cuda and importable("triton")


def implementation(device):
    """What runs on `device`, for the start-up log."""
    if torch.device(device).type == "cuda" and importable("triton"):
        return "fused (torch.compile: one read of the logits forward, one backward)"
    return "fused (chunked, gradient over the logits)"


def _chunks(rows, cols):
    step = max(1, CHUNK_BYTES // max(1, 4 * cols))
    return [(r, min(r + step, rows)) for r in range(0, rows, step)]


def _this_rank(logits, target, vocab_size, group):
    """(logits as [tokens, V/TP], TP size, real (unpadded) columns here, each target's column here (0 where another
    rank holds it), where this rank holds it (None at TP 1))."""
    x = logits.reshape(-1, logits.shape[-1])
    per_rank, tp = x.shape[-1], comm.world(group)
    start = per_rank * comm.rank(group) if tp > 1 else 0
    valid = per_rank if vocab_size is None else max(0, min(per_rank, vocab_size - start))
    local = target.reshape(-1) - start
    if tp == 1:
        return x, tp, valid, local, None
    inside = (local >= 0) & (local < per_rank)
    return x, tp, valid, local.masked_fill(~inside, 0), inside


def _combine(lse_rank, target_logit, group):
    """(the whole vocabulary's log-sum-exp, loss) per token from each TP rank's log-sum-exp (-inf on a rank of
    padding only) and target logit (0 where the rank does not hold the target)."""
    lse_max = lse_rank.clone()
    dist.all_reduce(lse_max, op=dist.ReduceOp.MAX, group=group)
    both = torch.stack([torch.exp(lse_rank - lse_max), target_logit])
    dist.all_reduce(both, group=group)
    lse = lse_max + both[0].log()
    return lse, lse - both[1]


class _FusedVocabParallelCE(torch.autograd.Function):
    """The eager path (module docstring)."""

    @staticmethod
    def forward(ctx, logits, target, vocab_size, group):
        x, tp, valid, local, inside = _this_rank(logits, target, vocab_size, group)
        xv = x[:, :valid]
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
            lse, loss = _combine(lse_rank, x[rows, local].float().masked_fill(~inside, 0.0), group)
            scale = torch.exp(lse_rank - lse)  # this rank's softmax -> the global one
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


class _CompiledVocabParallelCE(torch.autograd.Function):
    """The compiled path (module docstring)."""

    @staticmethod
    def forward(ctx, logits, target, vocab_size, group):
        x, tp, valid, local, inside = _this_rank(logits, target, vocab_size, group)
        lse, target_logit = compiled(_lse_and_target)(x, local, inside, valid)
        if tp > 1:
            lse, loss = _combine(lse, target_logit, group)
        else:
            loss = lse - target_logit
        ctx.save_for_backward(logits, lse, local, inside)
        ctx.valid = valid
        return loss.view(target.shape)

    @staticmethod
    def backward(ctx, grad_loss):
        logits, lse, local, inside = ctx.saved_tensors
        x = logits.reshape(-1, logits.shape[-1])
        g = grad_loss.reshape(-1).float()
        return compiled(_grad_of)(x, lse, local, inside, g, ctx.valid).view(logits.shape), None, None, None


def fused_vocab_parallel_cross_entropy(logits, target, vocab_size, group):
    """Per-token loss [s, b] (fp32) from logits [s, b, V_padded/TP] and target ids [s, b], as
    cross_entropy.vocab_parallel_cross_entropy; on the eager path the logits' storage receives their gradient in
    the backward. vocab_size: the unpadded vocabulary (columns beyond it are padding). Talks to the TP group
    `group`."""
    fn = _CompiledVocabParallelCE if use_compiled(logits) else _FusedVocabParallelCE
    return fn.apply(logits, target, vocab_size, group)
