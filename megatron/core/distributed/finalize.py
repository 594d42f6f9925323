"""Reductions after the last microbatch's backward, before the optimizer step.

Plain data parallelism: every gradient is summed over the DP group in coalesced
chunks. Losses are already normalised by the token count of the whole global batch,
so a sum (not a mean) gives the full-batch gradient.
"""
import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from ..pipeline_parallel.tied_embeddings import allreduce_tied_embedding_grads

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


def finalize_model_grads(model, groups):
    """Sum sequence-parallel weights' grads over TP, then all grads over DP, then the tied
    embedding's over the first and last pipeline stage.

    Talks to groups.tp (norm weights and biases applied to sequence shards), groups.dp and
    groups.embd. model: a module, or an nn.ModuleList of pipeline model chunks.
    """
    if groups.tp_size == 1 and groups.dp_size == 1 and groups.pp_size == 1:
        return
    params = [p for p in model.parameters() if p.grad is not None]
    if groups.tp_size > 1:
        sp = [p.grad for p in params if getattr(p, "sequence_parallel", False)]
        if sp:
            _all_reduce_coalesced(sp, groups.tp)
    if groups.dp_size > 1:
        _all_reduce_coalesced([p.grad for p in params], groups.dp)
    # last, as in Megatron-LM: after the DP reduction (which may be overlapped) is complete
    allreduce_tied_embedding_grads(model, groups)
