"""The fused vocabulary-parallel cross entropy (--cross-entropy-loss-fusion, Megatron-LM's flag).

Same loss and gradient as cross_entropy.py, in fewer passes over the [tokens, vocab/TP] logits and
without an fp32 copy of them. Two pure functions hold the math:

  _lse_and_target: this rank's log-sum-exp of each row (padding columns masked to -inf) and the
                   target's logit (0 where another rank holds the target);
  _grad_of:        (softmax - onehot) g from the logits and the global log-sum-exp, in the logits'
                   dtype, zero in the padding columns.

On CUDA with torch.compile's GPU backend (triton) each runs compiled over all tokens at once, as Megatron-LM
fuses its own with torch.compile: one kernel that reads the logits in their own dtype in the forward, one
that reads them and writes the gradient in the backward, and no [tokens, vocab] temporary. Elsewhere
(CPU, no triton) the same functions run eagerly over chunks of tokens (CHUNK_BYTES of fp32 temporaries
each) and the gradient is written over the logits' storage (the output layer's backward does not need them).
Nothing of size [tokens, vocab] is kept for backward but the logits themselves.

Over TP the ranks' log-sum-exps are combined from two [tokens] all-reduces (max, then sum with the target
logits); the backward then reads exp(x - lse) of the global lse, the global softmax, on every rank.
"""
import torch
import torch.distributed as dist

from .. import comm
from ..fusions._common import compiled, importable

CHUNK_BYTES = 256 * 2**20  # fp32 bytes of one chunk's [rows, vocab/TP] temporaries (the eager path)


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


class _FusedVocabParallelCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, target, vocab_size, group):
        x = logits.reshape(-1, logits.shape[-1])
        t = target.reshape(-1)
        per_rank, tp = x.shape[-1], comm.world(group)
        start = per_rank * comm.rank(group) if tp > 1 else 0
        valid = per_rank if vocab_size is None else max(0, min(per_rank, vocab_size - start))
        local, inside = t - start, None
        if tp > 1:
            inside = (local >= 0) & (local < per_rank)
            local = local.masked_fill(~inside, 0)
        if use_compiled(x):
            lse, target_logit = compiled(_lse_and_target)(x, local, inside, valid)
        else:
            lse = torch.empty(x.shape[0], dtype=torch.float32, device=x.device)
            target_logit = torch.empty_like(lse)
            for r0, r1 in _chunks(x.shape[0], per_rank):
                lse[r0:r1], target_logit[r0:r1] = _lse_and_target(
                    x[r0:r1], local[r0:r1], None if inside is None else inside[r0:r1], valid)
        if tp > 1:  # each rank's lse (-inf on a rank of padding only) -> the whole vocabulary's
            lse_max = lse.clone()
            dist.all_reduce(lse_max, op=dist.ReduceOp.MAX, group=group)
            both = torch.stack([torch.exp(lse - lse_max), target_logit])
            dist.all_reduce(both, group=group)
            lse, target_logit = lse_max + both[0].log(), both[1]
        ctx.save_for_backward(logits, lse, local, inside)
        ctx.valid = valid
        return (lse - target_logit).view(target.shape)

    @staticmethod
    def backward(ctx, grad_loss):
        logits, lse, local, inside = ctx.saved_tensors
        x = logits.reshape(-1, logits.shape[-1])
        g = grad_loss.reshape(-1).float()
        if use_compiled(x):
            return compiled(_grad_of)(x, lse, local, inside, g, ctx.valid).view(logits.shape), None, None, None
        for r0, r1 in _chunks(*x.shape):  # written over the logits, chunk by chunk
            x[r0:r1] = _grad_of(x[r0:r1], lse[r0:r1], local[r0:r1], None if inside is None else inside[r0:r1],
                                g[r0:r1], ctx.valid)
        return x.view(logits.shape), None, None, None


def fused_vocab_parallel_cross_entropy(logits, target, vocab_size, group):
    """Per-token loss [s, b] (fp32) from logits [s, b, V_padded/TP] and target ids [s, b], as
    cross_entropy.vocab_parallel_cross_entropy; on the eager path the logits' storage receives their
    gradient in the backward. vocab_size: the unpadded vocabulary (columns beyond it are padding). Talks to
    the TP group `group`."""
    return _FusedVocabParallelCE.apply(logits, target, vocab_size, group)
