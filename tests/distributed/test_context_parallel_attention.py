"""Context-parallel attention on 4 real processes against dense attention over the whole sequence:
forward and backward, causal and full masks, GQA, for ring (p2p), all_gather and a2a."""
import math

import torch
import torch.distributed as dist

from megatron.core.transformer.context_parallel import context_parallel_attention, slice_sequence
from tests.harness import spawn


def _dense(q, k, v, causal):
    """Reference: [s, b, h, d] -> [s, b, h x d], plain softmax attention in fp64."""
    h, g = q.shape[2], k.shape[2]
    k, v = (t.repeat_interleave(h // g, dim=2) for t in (k, v))
    scores = torch.einsum("sbhd,tbhd->bhst", q, k) / math.sqrt(q.shape[-1])
    if causal:
        s = q.shape[0]
        scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
    out = torch.einsum("bhst,tbhd->sbhd", scores.softmax(-1), v)
    return out.reshape(q.shape[0], q.shape[1], -1)


def _compare(groups, cases):
    cp, rank = dist.get_world_size(), dist.get_rank()
    errors = {}
    for comm_type, causal, heads, kv_groups in cases:
        gen = torch.Generator().manual_seed(7)
        s, b, d = 8 * cp, 2, 8
        q, k, v = (torch.randn(s, b, n, d, generator=gen, dtype=torch.float64)
                   for n in (heads, kv_groups, kv_groups))
        dout = torch.randn(s, b, heads * d, generator=gen, dtype=torch.float64)
        full = [t.clone().requires_grad_() for t in (q, k, v)]
        ref = _dense(*full, causal)
        ref.backward(dout)
        local = [slice_sequence(t, 0, rank, cp).clone().requires_grad_() for t in (q, k, v)]
        out = context_parallel_attention(*local, dist.group.WORLD, comm_type, 1 / math.sqrt(d), causal)
        out.backward(slice_sequence(dout, 0, rank, cp))
        err = (out - slice_sequence(ref, 0, rank, cp)).abs().max().item()
        for t, f in zip(local, full):
            err = max(err, (t.grad - slice_sequence(f.grad, 0, rank, cp)).abs().max().item())
        errors[(comm_type, causal, heads, kv_groups)] = err
    return errors


CASES = [(c, causal, 4, g) for c in ("p2p", "all_gather", "a2a") for causal in (True, False) for g in (4, 2)]


def test_cp4_matches_dense_attention_forward_and_backward():
    for rank_errors in spawn(4, _compare, CASES):
        for case, err in rank_errors.items():
            assert err < 1e-10, f"{case}: max abs error {err}; all: {rank_errors}"
