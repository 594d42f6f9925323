"""Muon's update of a TP-split matrix is this rank's shard of the whole matrix's update: duplicated
(gathered) and distributed (Gram all-reduced) modes, split along rows (strided, as SwiGLU's [gate; up]) or
columns, and a fused GQA QKV weight split by query groups; blockwise is the shard's own, another update."""
import types

import pytest
import torch
from torch import nn

from megatron.core.optimizer.muon import MuonConfig
from megatron.core.optimizer.muon_matrix import orthogonalize
from megatron.core.optimizer.newton_schulz import coefficient_schedule
from megatron.core.tensor_parallel.initialization import take_shard
from megatron.core.tensor_parallel.param_meta import set_qkv_split, set_tensor_parallel
from tests.harness import spawn

# (full shape, partition dim, stride, QKV rows per query group or None)
CASES = {"rows-strided": ((48, 16), 0, 2, None), "columns": ((16, 40), 1, 1, None),
         "qkv-gqa": ((4 * (2 + 2) * 4, 24), 0, 1, (8, 4, 4))}  # 4 query groups of 2 heads, head dim 4
# newton_schulz's test: fp32 within 1.5e-6 of fp64; two fp32 orders within twice that, with room
RTOL = 1e-4


def _param(shape, dim, stride, qkv, rank, tp):
    full = torch.randn(shape, generator=torch.Generator().manual_seed(shape[0] * shape[1]))
    shard = nn.Parameter(take_shard(full, dim, stride, rank, tp).clone())
    set_tensor_parallel(shard, dim, stride)
    whole = nn.Parameter(full.clone())
    for p in (shard, whole):
        if qkv:
            set_qkv_split(p, qkv)
    return whole, shard


def _updates(groups, mode):
    schedule = coefficient_schedule("quintic", 5)
    one = types.SimpleNamespace(tp=None, etp=None)  # the whole matrix on this rank, no group
    out = {}
    for name, (shape, dim, stride, qkv) in CASES.items():
        whole, shard = _param(shape, dim, stride, qkv, groups.tp_rank, groups.tp_size)
        cfg = MuonConfig(tp_mode=mode)
        want = take_shard(orthogonalize(whole.detach(), whole, one, cfg, schedule, torch.float32), dim, stride,
                          groups.tp_rank, groups.tp_size)
        got = orthogonalize(shard.detach(), shard, groups, cfg, schedule, torch.float32)
        out[name] = ((got - want).abs().max() / want.abs().max()).item()
    return out


@pytest.mark.parametrize("tp", [2, 4])
def test_tp_modes_give_the_whole_matrix_update(tp):
    for mode in ("duplicated", "distributed", "blockwise"):
        for rank, diffs in enumerate(spawn(tp, _updates, mode, tp=tp)):
            for name, rel in diffs.items():
                if mode == "blockwise":  # layout-dependent, as documented: far from the whole matrix's update
                    assert rel > 1e-2, (mode, name, rank, rel)
                else:
                    assert rel <= RTOL, (mode, name, rank, rel)
