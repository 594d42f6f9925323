"""Context parallelism, one process: the chunk layout, batch slicing with padding, size checks,
and the ring's block math (log-sum-exp merge, block backward) against autograd."""
import math

import pytest
import torch

from megatron.core.config import ConfigError, TransformerConfig
from megatron.core.parallel_layout import ParallelLayout
from megatron.core.parallel_state import ParallelConfigError
from megatron.core.transformer.context_parallel import CPSlice, batch_on_this_cp_rank, local_positions, slice_sequence
from megatron.core.transformer.ring_attention import merge
from megatron.core.transformer.ring_kernels import BlockKernel


def test_chunks_i_and_2c_minus_1_minus_i_cover_the_sequence_once():
    for cp in (1, 2, 4):
        got = torch.cat([local_positions(16, r, cp) for r in range(cp)])
        assert sorted(got.tolist()) == list(range(16))
    assert local_positions(16, 1, 4).tolist() == [2, 3, 12, 13]  # chunks 1 and 6 of 8
    x = torch.arange(16).view(1, 16)
    assert slice_sequence(x, 1, 0, 2).tolist() == [[0, 1, 2, 3, 12, 13, 14, 15]]


def test_batch_is_padded_with_masked_tokens_and_gets_global_positions():
    b, s = 2, 13
    batch = {"tokens": torch.arange(b * s).view(b, s), "labels": torch.arange(b * s).view(b, s) + 1,
             "loss_mask": torch.ones(b, s)}
    parts = [batch_on_this_cp_rank(batch, CPSlice(r, 2, 4)) for r in range(2)]
    assert all(p["tokens"].shape == (b, 8) for p in parts)  # 13 -> 16 = multiple of 2 x CP x TP(2)
    assert sum(p["loss_mask"].sum().item() for p in parts) == b * s
    assert parts[1]["position_ids"][0].tolist() == [4, 5, 6, 7, 8, 9, 10, 11]
    assert parts[0]["position_ids"][0].tolist() == [0, 1, 2, 3, 12, 0, 0, 0]  # the padding gets position 0
    assert parts[0]["loss_mask"][0].tolist() == [1, 1, 1, 1, 1, 0, 0, 0]
    # packed documents: every rank keeps the whole sequence's segment ids, the padding a document of its own
    segments = torch.zeros(b, s, dtype=torch.long)
    segments[:, 7:] = 1
    part = batch_on_this_cp_rank(dict(batch, segment_ids=segments), CPSlice(0, 2, 4))["segment_ids"]
    assert part[0].tolist() == [0] * 7 + [1] * 6 + [2] * 3


def test_sizes_are_checked_before_any_group():
    assert ParallelLayout(8, tp=2, cp=2, pp=2).dp == 1
    assert ParallelLayout(8, cp=4).dp == 2
    with pytest.raises(ParallelConfigError, match="--context-parallel-size 2 x --pipeline-model-parallel-size 2"):
        ParallelLayout(4, tp=2, cp=2, pp=2)
    p = ParallelLayout(8, tp=2, cp=2, pp=2).position(7)
    assert (p.tp, p.cp, p.dp, p.pp) == (1, 1, 0, 1)  # tp + TP (cp + CP (dp + DP pp))


def test_config_errors_name_the_flags():
    base = dict(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=64, vocab_size=100,
                context_parallel_size=2, attention_dropout=0.0)
    TransformerConfig(**base).resolve().validate()
    with pytest.raises(ConfigError, match="--attention-dropout 0"):
        TransformerConfig(**dict(base, attention_dropout=0.1)).resolve().validate()
    with pytest.raises(ConfigError, match="--cp-comm-type a2a needs --num-attention-heads"):
        TransformerConfig(**dict(base, cp_comm_type="a2a", context_parallel_size=8)).resolve().validate()


@pytest.mark.parametrize("kernel", ["cpu_flash", "math"])
def test_block_math_matches_autograd(kernel):
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 4, 6, 8, generator=gen, dtype=torch.float64) for _ in range(3))
    k, v = k[:, :2], v[:, :2]  # GQA: 2 groups for 4 heads
    scale = 1 / math.sqrt(8)
    blocks = BlockKernel(kernel)
    out, lse = blocks.forward(q, k, v, scale, causal=True)
    # two halves of the keys merged by their log-sum-exp give the whole (full mask)
    whole, whole_lse = blocks.forward(q, k, v, scale, causal=False)
    a, la = blocks.forward(q, k[:, :, :3], v[:, :, :3], scale, causal=False)
    b, lb = blocks.forward(q, k[:, :, 3:], v[:, :, 3:], scale, causal=False)
    merged, merged_lse = merge(a, la, b, lb)
    assert torch.allclose(merged, whole) and torch.allclose(merged_lse, whole_lse)
    qa, ka, va = (t.clone().requires_grad_() for t in (q, k, v))
    ref = torch.softmax((qa @ ka.repeat_interleave(2, 1).transpose(-1, -2) * scale).masked_fill(
        torch.ones(6, 6, dtype=torch.bool).triu(1), float("-inf")), -1) @ va.repeat_interleave(2, 1)
    assert torch.allclose(out, ref)
    dout = torch.randn(ref.shape, generator=gen, dtype=torch.float64)
    ref.backward(dout)
    dq, dk, dv = blocks.backward(q, k, v, out, dout, lse, scale, causal=True)
    for got, want in ((dq, qa.grad), (dk, ka.grad), (dv, va.grad)):
        assert torch.allclose(got, want)


def test_grid_tp2_cp2_pp2_matches_documented_order():
    lists = ParallelLayout(8, tp=2, cp=2, pp=2).rank_lists
    assert lists("tp") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert lists("cp") == lists("dp_cp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert lists("dp") == [[r] for r in range(8)]
    assert lists("pp") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert lists("mp") == [[0, 1, 4, 5], [2, 3, 6, 7]]  # TP x PP: the CP ranks are not in it
    assert ParallelLayout(4, cp=2).rank_lists("dp_cp") == [[0, 1, 2, 3]]
    assert ParallelLayout(4, cp=2).rank_lists("dp") == [[0, 2], [1, 3]]


def test_estimated_activations_fall_as_one_over_cp():
    from megatron.core.transformer.context_parallel import activation_bytes_per_layer
    one = activation_bytes_per_layer(16384, 1, 256, 8, cp=1)
    for cp in (2, 4):
        assert activation_bytes_per_layer(16384, 1, 256, 8, cp=cp) * cp == one
