"""Reductions after the last microbatch's backward, before the optimizer step.

With a DistributedDataParallel attached, the DP reduction is its buckets'; without,
every .grad is summed over the DP group in coalesced chunks. Losses are already
normalised by the token count of the whole global batch, so a sum (not a mean) gives
the full-batch gradient. Which parameters need the TP and pipeline sums is their
ParamMeta's (tensor_parallel/param_meta.py).
"""
import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from ..tensor_parallel.param_meta import param_meta
from ..timers import phase

_CHUNK_ELEMS = 64 * 1024 * 1024


def _all_reduce_coalesced(tensors, group):
    """Sum a list of tensors over `group`, a few large all-reduces instead of one per tensor."""
    by_dtype = {}
    for t in tensors:
        by_dtype.setdefault((t.dtype, t.device), []).append(t)
    for ts in by_dtype.values():
        chunk, size = [], 0
        for t in ts + [None]:
            if t is not None and (size + t.numel() <= _CHUNK_ELEMS or not chunk):
                chunk.append(t)
                size += t.numel()
                continue
            flat = _flatten_dense_tensors(chunk)
            dist.all_reduce(flat, group=group)
            for dst, src in zip(chunk, _unflatten_dense_tensors(flat, chunk)):
                dst.copy_(src)
            chunk, size = ([t], t.numel()) if t is not None else ([], 0)


def _grad_of(ddp):
    """Where gradients live: DDP's buffer views (ddp.main_grad) when it is attached, else .grad."""
    return ddp.main_grad if ddp is not None else (lambda p: p.grad)


def sum_tied_copies_here(model, grad_of) -> bool:
    """ZB-V's layout holds both tied-table copies on the first stage (chunks 0 and 1): give each the sum
    of both gradients, locally. Returns whether this rank holds both copies. No communication."""
    tied = [p for p in model.parameters() if param_meta(p).tied_embedding]
    if len(tied) != 2:
        return False
    grads = [grad_of(p) if grad_of(p) is not None else torch.zeros_like(p) for p in tied]
    total = grads[0] + grads[1]
    for p, g in zip(tied, grads):
        g.copy_(total)
        if grad_of(p) is None:
            p.grad = g
    return True


def allreduce_tied_embedding_grads(model, groups, grad_of, copies_summed=False):
    """Sum the tied word embedding's gradient over groups.embd (first and last pipeline stage).

    Both copies start equal (same init_key), so with the same summed gradient and the same
    optimizer step they stay equal. Middle stages hold no copy and do nothing. In ZB-V's
    layout both copies are on the first stage and the last holds none: sum_tied_copies_here,
    unless copies_summed says that was done already.
    """
    if groups.pp_size == 1:
        return
    if copies_summed or sum_tied_copies_here(model, grad_of):
        return
    for p in model.parameters():
        if param_meta(p).tied_embedding:
            grad = grad_of(p)
            if grad is None:  # a stage whose microbatches never touched it: contribute zero
                grad = p.grad = torch.zeros_like(p)
            dist.all_reduce(grad, group=groups.embd)


def finalize_model_grads(model, groups, ddp=None, timers=None):
    """Complete the DP reduction (ddp, or a plain all-reduce of .grad), sum the
    sequence-parallel weights' grads over TP, then the tied embedding's over the first and
    last pipeline stage.

    Talks to groups.dp, groups.tp and groups.embd. model: a module, or an nn.ModuleList of
    pipeline model chunks. With the distributed optimizer only this rank's
    shard of each bucket is meaningful afterwards; the TP sum is right on it too, since
    the DP and TP sums commute. timers: core.timers.Timers (level 1: the three sums under
    Megatron-LM's names all-grads-sync, layernorm-grads-all-reduce, embedding-grads-all-reduce), or None.
    """
    if ddp is not None and ddp.config.shards_optimizer:
        _finalize_sharded(model, groups, ddp, timers)
        return
    if ddp is not None:  # the main grads nothing reached hold the last step's until zeroed
        ddp.zero_unreached_grads()
    # ZB-V's two tied copies: summed before the DP all-reduce where it has not started yet, else after it
    copies_summed = groups.pp_size > 1 and (ddp is None or not ddp.overlap_grad_reduce) \
        and sum_tied_copies_here(model, _grad_of(ddp))
    with phase(timers, "all-grads-sync", 1):
        if ddp is not None:
            ddp.finish_grad_sync()
        elif groups.layout.dp_cp > 1:
            _all_reduce_coalesced([p.grad for p in model.parameters() if p.grad is not None], groups.dp_cp)
    grad_of = _grad_of(ddp)
    with phase(timers, "layernorm-grads-all-reduce", 1):
        if groups.tp_size > 1:
            sp = [grad_of(p) for p in model.parameters()
                  if param_meta(p).sequence_parallel and grad_of(p) is not None]
            if sp:
                _all_reduce_coalesced(sp, groups.tp)
    # last, as in Megatron-LM: after the DP reduction (which may be overlapped) is complete
    with phase(timers, "embedding-grads-all-reduce", 1):
        allreduce_tied_embedding_grads(model, groups, grad_of, copies_summed)


def _finalize_sharded(model, groups, ddp, timers=None):
    """With a sharded optimizer (optim, optim_grads, optim_grads_params) the tied table's sum over
    groups.embd runs on the full gradients, before the DP reduce-scatter (the sums commute; its
    DP shard differs between the first and the last stage: summed after, a stage's shard would add
    the other stage's unreduced values), and the sequence-parallel sum over groups.tp on this rank's
    reduced shards after it (the same ranges on every TP rank; with optim the whole main grads). Timed:
    all-grads-sync (the tied table's sum included) and layernorm-grads-all-reduce."""
    with phase(timers, "all-grads-sync", 1):
        ddp.finish_grad_sync(before_reduce=lambda: allreduce_tied_embedding_grads(model, groups, _grad_of(ddp)))
    with phase(timers, "layernorm-grads-all-reduce", 1):
        if groups.tp_size > 1:
            sp = [g for p in model.parameters() if param_meta(p).sequence_parallel for g in ddp.reduced_grads(p)]
            if sp:
                _all_reduce_coalesced(sp, groups.tp)
