"""MoE experts with biases split over TP on 2 real processes (TP2, experts not folded), against the
same layer in one process: outputs, and every bias gradient: fc1's shards those of one process's,
fc2's (replicated, added once, on TP rank 0) bitwise equal on both ranks and equal to one process's.
Sequential and grouped experts, SwiGLU (fc1's bias in [gate; up] blocks), with and without the
zero-bubble split (pipeline_parallel/backward_split.py: no bias gradient in B, all in W). In fp64:
TP2 sums the row-parallel products in another order, so outputs and gradients compare within the
chain bound of tests/rounding.py
(the grouped experts then take their loop of matmuls: torch._grouped_mm takes fp32 / bf16 only)."""
import torch

from megatron.core.config import TransformerConfig
from megatron.core.pipeline_parallel.backward_split import backward_input
from megatron.core.tensor_parallel.initialization import initialize_parameters, take_shard
from megatron.core.tensor_parallel.param_meta import param_meta, set_init, set_init_key
from megatron.core.transformer.moe.moe_layer import MoELayer
from megatron.core.transformer.moe.placement import expert_placement, one_rank
from tests.harness import spawn
from tests.rounding import assert_chain_close


def _layer(placement, tp_rank, tp_size, grouped):
    cfg = TransformerConfig(num_layers=2, hidden_size=16, num_attention_heads=2, num_experts=4, moe_ffn_hidden_size=8,
                            moe_router_topk=2, swiglu=True, add_bias_linear=True, moe_grouped_gemm=grouped,
                            tensor_model_parallel_size=tp_size, hidden_dropout=0.0, attention_dropout=0.0,
                            params_dtype=torch.float64)
    m = MoELayer(cfg, placement, layer_number=1)
    for name, p in m.named_parameters():
        set_init_key(p, name)
        if name.endswith("_bias"):
            set_init(p, "normal", 0.5)  # not zero: the forward sees them
    initialize_parameters(m, 3, tp_rank, tp_size)
    return m


def _run(m, split):
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(6, 2, 16, generator=gen, dtype=torch.float64).requires_grad_()
    dy = torch.randn(6, 2, 16, generator=gen, dtype=torch.float64)
    y = m(x)
    if split:
        work = backward_input(y, dy, x, {id(p): i for i, p in enumerate(m.parameters())})
        assert all(p.grad is None for n, p in m.named_parameters() if n.endswith("_bias")), "bias grads in B"
        y = y.detach()
        work.run()
    else:
        y.backward(dy)
    return y.detach(), {n: p.grad for n, p in m.named_parameters() if n.endswith("_bias")}


def _compare(groups, grouped, split):
    ref_out, ref_grads = _run(_layer(one_rank(), 0, 1, grouped), split)
    m = _layer(expert_placement(groups), groups.tp_rank, groups.tp_size, grouped)
    out, grads = _run(m, split)
    assert_chain_close(out, ref_out, "output")
    params = dict(m.named_parameters())
    fc2 = {}
    for name, g in grads.items():
        meta = param_meta(params[name])
        want = ref_grads[name]
        if meta.tensor_parallel:  # fc1's: this rank's [gate; up] blocks
            want = take_shard(want, meta.partition_dim, meta.partition_stride, groups.tp_rank, groups.tp_size)
        else:
            fc2[name] = g.tolist()
        assert_chain_close(g, want, name)
    assert len(fc2) == 4 and all(n.endswith("fc2_bias") for n in fc2)
    return fc2


CASES = [(grouped, split) for grouped in (False, True) for split in (False, True)]


def _all(groups):
    return [_compare(groups, grouped, split) for grouped, split in CASES]


def test_expert_biases_over_tp2_are_one_process_biases():
    """(sequential, grouped) x (ordinary backward, zero-bubble B then W), one spawn."""
    ranks = spawn(2, _all, tp=2)
    for case, fc2 in zip(CASES, zip(*ranks)):
        assert fc2[0] == fc2[1], f"{case}: fc2's bias gradients differ between the TP ranks"
