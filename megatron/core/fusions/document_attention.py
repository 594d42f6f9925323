"""Attention over packed documents (transformer/documents.py): causal within each document, nothing across.

No implementation here builds an [s, s] mask; each keeps memory linear in s beyond what one
document's attention needs:
  segmented  exact per-document SDPA: the documents of a micro-batch grouped by length, one SDPA call
             per distinct length over all of its documents (gathered into [n, heads, L, d]), the outputs
             scattered back. Any device and dtype; the reference every other path is tested against.
  varlen     torch.nn.attention.varlen.varlen_attn (flash attention with cu_seqlens), CUDA, fp16/bf16.
  windowed   a sliding window (--window-size) or an attention sink (--softmax-type off-by-one): explicit
             scores per document-length group with the band mask and the sink column (O(L^2) per document).
  dense      --attention-backend unfused: the documents' [b, 1, s, s] bool mask through the unfused
             front, because that is what the user asked for (Megatron-LM's "local" attention).
Tensors as the other fronts: q [s, b, heads, d], k / v [s, b, groups, d(v)] -> [s, b, heads * d(v)].
"""
import functools
import inspect

import torch
import torch.nn.functional as F

from ._common import HALF_DTYPES, importable

NAMES = {"segmented": "exact per-document SDPA (documents grouped by length, no s x s mask)",
         "varlen": "torch varlen_attn (flash attention over cu_seqlens)",
         "dense": "unfused with the documents' dense [s, s] mask (--attention-backend unfused)"}


def select(backend, device, dtype, dropout=0.0):
    """The document-attention implementation for the resolved --attention-backend `backend`."""
    if backend == "unfused":
        return "dense"
    if (torch.device(device).type == "cuda" and dtype in HALF_DTYPES and dropout == 0
            and importable("torch.nn.attention.varlen")):
        return "varlen"
    return "segmented"


def why(impl):
    return {"dense": "--attention-backend unfused asks for explicit scores",
            "varlen": "CUDA with fp16/bf16, no attention dropout, and torch has varlen flash attention",
            "segmented": "varlen flash attention needs CUDA, fp16/bf16 and --attention-dropout 0"}[impl]


def _flat(t):
    """[s, b, n, d] -> [b * s, n, d], sample-major (the documents' flat offsets)."""
    s, b = t.shape[:2]
    return t.transpose(0, 1).reshape(b * s, *t.shape[2:])


class _Permute(torch.autograd.Function):
    """x[perm] along dim 0 for a permutation perm; its gradient is grad[inverse] (a gather, where index_select's
    own backward would scatter-add into a zero-filled copy)."""

    @staticmethod
    def forward(ctx, x, perm, inverse):
        ctx.save_for_backward(inverse)
        return x.index_select(0, perm)

    @staticmethod
    def backward(ctx, grad):
        (inverse,) = ctx.saved_tensors
        return grad.index_select(0, inverse), None, None


def _grouped(documents, device):
    """(perm, inverse, [(length, count)]): the flat positions ordered document by document, the documents
    grouped by length, so that each group is one contiguous [count * length] run of the permuted tokens."""
    idx = [(starts[:, None] + torch.arange(length, device=device)).reshape(-1)
           for length, starts in documents.by_length]
    perm = torch.cat(idx).to(device)
    return perm, torch.argsort(perm), [(length, len(starts)) for length, starts in documents.by_length]


def segmented(q, k, v, documents, p, scale):
    """Exact causal attention within each document: one SDPA call per distinct document length."""
    s, b, heads, _ = q.shape
    perm, inverse, groups = _grouped(documents, q.device)
    qf, kf, vf = (_Permute.apply(_flat(t), perm, inverse) for t in (q, k, v))
    gqa = {"enable_gqa": True} if k.shape[2] != heads else {}
    # one split per tensor (its backward is one cat; slices would each add into a zero-filled full copy)
    sizes = [count * length for length, count in groups]
    pieces = []
    for (length, count), qg, kg, vg in zip(groups, *(t.split(sizes) for t in (qf, kf, vf))):
        # [n * L, heads, d] -> [n, heads, L, d]: SDPA's layout, each document one batch entry
        qd, kd, vd = (t.view(count, length, t.shape[1], t.shape[2]).transpose(1, 2) for t in (qg, kg, vg))
        out = F.scaled_dot_product_attention(qd, kd, vd, is_causal=True, dropout_p=p, scale=scale, **gqa)
        pieces.append(out.transpose(1, 2).reshape(-1, heads, out.shape[-1]))
    # every flat position belongs to one document: the inverse permutation puts each output home
    out = _Permute.apply(torch.cat(pieces), inverse, perm)
    return out.view(b, s, heads * out.shape[-1]).transpose(0, 1)


def _acc(t):
    """Scores in fp32 at least (fp64 stays fp64)."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


def windowed(q, k, v, documents, p, scale, window=None, sink=None):
    """Causal attention within each document, each query seeing at most `window` earlier keys (None: all) and,
    with `sink` (a logit), exp(sink) added to its softmax denominator: explicit scores per length group."""
    s, b, heads, _ = q.shape
    if k.shape[2] != heads:  # query head i uses key / value group i // (heads / groups)
        k, v = (t.repeat_interleave(heads // k.shape[2], dim=2) for t in (k, v))
    qf, kf, vf = (_flat(t) for t in (q, k, v))
    pieces, order = [], []
    for length, starts in documents.by_length:
        idx = (starts[:, None] + torch.arange(length, device=starts.device)).reshape(-1)
        qd, kd, vd = (t.index_select(0, idx).view(len(starts), length, heads, t.shape[2]).transpose(1, 2)
                      for t in (qf, kf, vf))
        scores = _acc(torch.matmul(qd, kd.transpose(-1, -2))) * scale
        pos = torch.arange(length, device=q.device)
        allowed = pos[:, None] >= pos[None, :]
        if window is not None:
            allowed &= pos[:, None] - pos[None, :] <= window
        scores = scores.masked_fill(~allowed, float("-inf"))
        if sink is not None:  # the sink: one more column every query sees, dropped after the softmax
            scores = torch.cat([scores, scores.new_full(scores.shape[:-1] + (1,), sink)], dim=-1)
        probs = torch.softmax(scores, dim=-1)[..., :length].to(vd.dtype)
        if p > 0:
            probs = F.dropout(probs, p, True)
        out = torch.matmul(probs, vd)
        pieces.append(out.transpose(1, 2).reshape(-1, heads, out.shape[-1]))
        order.append(idx)
    out = torch.cat(pieces)[torch.argsort(torch.cat(order))]
    return out.view(b, s, heads * out.shape[-1]).transpose(0, 1)


def masked_with_sink(q, k, v, mask, scale, sink):
    """q [s, b, h, d], k / v [sk, b, g, d], mask [b, 1, s, sk] bool (True = may attend) -> [s, b, h x d]:
    explicit scores with one more column of `sink` every query sees (its value 0)."""
    s, b, heads, _ = q.shape
    if k.shape[2] != heads:
        k, v = (t.repeat_interleave(heads // k.shape[2], dim=2) for t in (k, v))
    scores = _acc(torch.einsum("sbhd,tbhd->bhst", q, k)) * scale
    scores = scores.masked_fill(~mask, float("-inf"))
    scores = torch.cat([scores, scores.new_full(scores.shape[:-1] + (1,), sink)], dim=-1)
    probs = torch.softmax(scores, dim=-1)[..., :-1].to(v.dtype)
    return torch.einsum("bhst,tbhd->sbhd", probs, v).reshape(s, b, -1)


@functools.cache
def _varlen_kwargs():
    """varlen_attn's causal and GQA arguments in this torch (2.11 spells causal is_causal, 2.13 window_size)."""
    from torch.nn.attention.varlen import varlen_attn
    params = inspect.signature(varlen_attn).parameters
    causal = {"window_size": (-1, 0)} if "window_size" in params else {"is_causal": True}
    return causal, "enable_gqa" in params


def varlen(q, k, v, documents, p, scale):
    """torch's varlen flash attention over the documents' cu_seqlens (no dropout: it takes none)."""
    from torch.nn.attention.varlen import varlen_attn
    if p > 0:
        raise ValueError("varlen attention takes no attention dropout; use --attention-dropout 0 "
                         "or --attention-backend sdpa")
    s, b, heads, _ = q.shape
    causal, takes_gqa = _varlen_kwargs()
    if k.shape[2] != heads and not takes_gqa:  # an older torch: give every query head its key / value
        k, v = (t.repeat_interleave(heads // k.shape[2], dim=2) for t in (k, v))
    extra = {"enable_gqa": True} if k.shape[2] != heads else {}
    cu, longest = documents.cu_seqlens, documents.max_length
    out = varlen_attn(_flat(q), _flat(k), _flat(v), cu, cu, longest, longest, scale=scale, **causal, **extra)
    return out.reshape(b, s, -1).transpose(0, 1)
