"""MoE in one process: the router's choice, its losses against the formulas written out here,
the layer against a token-by-token reference, grouped GEMM, expert-bias balancing, flag checks.
Comparisons of one function computed in two orders run in fp64 (tests/rounding.py)."""
import math

import pytest
import torch
import torch.nn.functional as F

from megatron.core.config import ConfigError, TransformerConfig
from megatron.core.parallel_layout import ParallelLayout
from megatron.core.tensor_parallel.initialization import initialize_parameters
from megatron.core.tensor_parallel.param_meta import is_expert_parallel, set_init_key
from megatron.core.transformer.moe import aux_losses, step_hooks
from megatron.core.transformer.moe.grouped_gemm import grouped_mm
from megatron.core.transformer.moe.moe_layer import MoELayer
from megatron.core.transformer.moe.placement import one_rank
from megatron.core.transformer.moe.router import topk_routing
from tests.rounding import assert_chain_close, assert_within, matmul_bound


def cfg(**kw):
    base = dict(num_layers=2, hidden_size=16, num_attention_heads=2, num_experts=4, moe_ffn_hidden_size=8,
                add_bias_linear=False, hidden_dropout=0.0, attention_dropout=0.0)
    base.update(kw)
    return TransformerConfig(**base)


def layer(config):
    m = MoELayer(config, one_rank(), layer_number=1)
    for name, p in m.named_parameters():
        set_init_key(p, name)
    initialize_parameters(m, 3, 0, 1)
    return m


LOGITS = torch.tensor([[2.0, 1.0, 0.5, -1.0], [0.1, 0.3, 0.2, 0.0], [-1.0, -2.0, 3.0, 2.5]])


def test_topk_softmax_after_and_before():
    probs, idx, scores = topk_routing(LOGITS, 2)
    assert idx.tolist() == [[0, 1], [1, 2], [2, 3]]
    e = math.exp(1.0)  # softmax over the two chosen logits 2.0 and 1.0
    assert probs[0].tolist() == pytest.approx([e / (e + 1), 1 / (e + 1)])
    assert torch.allclose(scores, torch.softmax(LOGITS, -1))
    pre, idx2, _ = topk_routing(LOGITS, 2, pre_softmax=True)
    assert idx2.tolist() == idx.tolist()
    assert torch.allclose(pre, torch.softmax(LOGITS, -1).gather(1, idx))  # not renormalised


def test_topk_sigmoid_and_expert_bias():
    probs, idx, _ = topk_routing(LOGITS, 2, "sigmoid")
    s = torch.sigmoid(LOGITS)
    assert idx.tolist() == [[0, 1], [1, 2], [2, 3]]
    assert torch.allclose(probs, s.gather(1, idx) / s.gather(1, idx).sum(-1, keepdim=True))
    bias = torch.tensor([0.0, 0.0, 0.0, 5.0])  # pushes expert 3 into every choice, probs stay unbiased
    probs_b, idx_b, _ = topk_routing(LOGITS, 1, "sigmoid", expert_bias=bias)
    assert idx_b.flatten().tolist() == [3, 3, 3]
    assert torch.allclose(probs_b.flatten(), s[:, 3])


def test_aux_and_z_loss_formulas():
    T, E, k, s, coeff = 12, 4, 2, 6, 0.01
    # fp64: the references below sum in Python's order; the router's fp32 softmax rounds scores alike for both
    logits = torch.randn(T, E, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    _, idx, scores = topk_routing(logits, k)
    n = torch.bincount(idx.flatten(), minlength=E).float()
    # Switch / GShard: E / (k T^2) sum_e (sum_t p_te) n_e, times the coefficient
    want = coeff * E / (k * T * T) * sum(float(scores[:, e].sum()) * float(n[e]) for e in range(E))
    assert float(aux_losses.switch_load_balancing_loss(scores, n, k, coeff)) == pytest.approx(want, rel=1e-6)
    # per sequence (tokens laid out [s, b]): f_be = n_be E / (k s), P_be = mean_s p
    b = T // s
    total = 0.0
    for j in range(b):
        rows = [si * b + j for si in range(s)]
        n_j = torch.bincount(idx[rows].flatten(), minlength=E).float()
        total += float(((n_j * E / (k * s)) * scores[rows].mean(0)).sum())
    got = aux_losses.sequence_load_balancing_loss(scores, idx, s, k, coeff)
    assert float(got) == pytest.approx(coeff * total / b, rel=1e-6)
    z = sum(math.log(sum(math.exp(v) for v in row)) ** 2 for row in logits.tolist()) / T
    assert float(aux_losses.z_loss(logits, 1e-3)) == pytest.approx(1e-3 * z, rel=1e-6)


@pytest.mark.parametrize("kw", [dict(), dict(swiglu=True, moe_shared_expert_intermediate_size=12),
                                dict(moe_token_dispatcher_type="alltoall", moe_router_score_function="sigmoid"),
                                dict(moe_grouped_gemm=True, swiglu=True)])
def test_layer_matches_token_by_token_reference(kw):
    config = cfg(moe_router_topk=2, params_dtype=torch.float64, **kw)
    m = layer(config)
    x = torch.randn(5, 3, 16, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    got = m(x)
    tokens = x.reshape(15, 16)
    probs, idx, _ = topk_routing(F.linear(tokens, m.router.weight), 2, config.moe_router_score_function)
    experts = m.experts.local_experts
    want = torch.stack([sum(probs[t, j] * experts[str(int(idx[t, j]))](tokens[t:t + 1])[0] for j in range(2))
                        for t in range(15)]).view(5, 3, 16)
    if m.shared_experts is not None:
        want = want + m.shared_experts(x)
    assert_chain_close(got, want, "layer against token by token")
    assert all(is_expert_parallel(p) for p in m.experts.parameters())


def test_router_loss_gradient_enters_backward():
    config = cfg(moe_aux_loss_coeff=0.1, moe_z_loss_coeff=0.01)
    m = layer(config)
    x = torch.randn(4, 2, 16, generator=torch.Generator().manual_seed(3))
    losses = step_hooks.bind(m)
    assert m.router.losses is losses
    losses.start_iteration(1.0, 1)
    m(x).sum().backward()
    with_aux = m.router.weight.grad.clone()
    report = aux_losses.iteration_report(["load_balancing_loss", "z_loss"], _OneRank, 1, 1, "cpu", losses)
    assert set(report) == {"load_balancing_loss", "z_loss"} and float(report["z_loss"][0]) > 0
    m.zero_grad()
    losses.start_iteration(0.0, 1)  # scale 0: the router losses add nothing
    m(x).sum().backward()
    assert not torch.allclose(with_aux, m.router.weight.grad)
    assert aux_losses.iteration_report(["z_loss"], _OneRank, 1, 1, "cpu", losses)["z_loss"][0] > 0
    assert not hasattr(aux_losses, "_STATE")  # the loop's RouterLosses, no module state


_OneRank = ParallelLayout(1).plan_groups(0)  # sizes 1: no collective


def test_grouped_mm_equals_loop_and_its_gradient():
    torch.manual_seed(1)
    x = torch.randn(10, 16, requires_grad=True)
    w = torch.randn(3, 16, 8, requires_grad=True)
    counts = [4, 0, 6]
    y = grouped_mm(x, w, counts)
    ref = torch.cat([x[:4] @ w[0], x[4:] @ w[2]])
    # one GEMM per group each, maybe in other orders (the grouped kernel against mm): not bitwise (issue 48)
    xs = (x[:4].detach(), x[4:].detach())
    assert_within(y, ref, torch.cat([matmul_bound(xi, w[e].detach()) for xi, e in zip(xs, (0, 2))]), "y")
    g = torch.randn_like(y)
    dx, dw = torch.autograd.grad(y, (x, w), g)
    rx, rw = torch.autograd.grad(ref, (x, w), g)
    gs = (g[:4], g[4:])
    assert_within(dx, rx, torch.cat([matmul_bound(gi, w[e].detach().t()) for gi, e in zip(gs, (0, 2))]), "dx")
    for gi, xi, e in zip(gs, xs, (0, 2)):
        assert_within(dw[e], rw[e], matmul_bound(xi.t(), gi), "dw")
    assert not dw[1].any()


def test_expert_bias_moves_load_towards_balance():
    torch.manual_seed(0)
    config = cfg(moe_router_topk=1, moe_router_score_function="sigmoid", moe_router_enable_expert_bias=True,
                 moe_router_bias_update_rate=0.02, moe_aux_loss_coeff=0.0)
    m = layer(config)
    with torch.no_grad():
        m.router.weight.normal_(0.0, 0.5)
        x = torch.randn(32, 4, 16) + 2.0 * m.router.weight[0]  # skewed towards expert 0

    def spread():
        with torch.no_grad():
            return torch.bincount(topk_routing(F.linear(x.reshape(-1, 16), m.router.weight), 1, "sigmoid",
                                               expert_bias=m.router.expert_bias)[1].flatten(), minlength=4)
    before = spread()
    for _ in range(30):
        with torch.enable_grad():  # the router alone: it counts the tokens the update reads
            m.router(x.reshape(-1, 16), 32)
        m.router.update_expert_bias(_OneRank)
    after = spread()
    print(f"tokens per expert before {before.tolist()}, after 30 updates {after.tolist()}")
    assert (after.max() - after.min()) < (before.max() - before.min()) / 2, (before, after)


@pytest.mark.parametrize("kw,flag", [
    (dict(num_experts=6, expert_model_parallel_size=4), "--expert-model-parallel-size"),
    (dict(moe_router_topk=5), "--moe-router-topk"),
    (dict(moe_pad_expert_input_to_capacity=True), "--moe-expert-capacity-factor"),
    (dict(tensor_model_parallel_size=2, num_attention_heads=4, expert_tensor_parallel_size=3),
     "--expert-tensor-parallel-size")])
def test_bad_moe_flags_name_the_flag(kw, flag):
    with pytest.raises(ConfigError, match=flag):
        cfg(**kw).validate()


def test_capacity_drop_rules():
    from megatron.core.transformer.moe.capacity import drop_over_capacity
    # 4 tokens, k=1, 2 experts, factor 0.5: capacity ceil(4 x 1 / 2 x 0.5) = 1 token per expert
    probs = torch.tensor([[0.3], [0.9], [0.6], [0.8]])
    idx = torch.tensor([[0], [0], [1], [1]])
    p, i = drop_over_capacity(probs, idx, 2, 0.5, "probs")
    assert i.flatten().tolist() == [2, 0, 2, 1] and p.flatten().tolist() == pytest.approx([0, 0.9, 0, 0.8])
    p, i = drop_over_capacity(probs, idx, 2, 0.5, "position")
    assert i.flatten().tolist() == [0, 2, 1, 2] and p.flatten().tolist() == pytest.approx([0.3, 0, 0.6, 0])


@pytest.mark.parametrize("dispatcher,pad", [("allgather", False), ("alltoall", False), ("alltoall", True)])
def test_layer_with_capacity_skips_dropped_pairs(dispatcher, pad):
    config = cfg(moe_router_topk=2, moe_expert_capacity_factor=0.5, moe_token_dispatcher_type=dispatcher,
                 moe_pad_expert_input_to_capacity=pad, params_dtype=torch.float64)
    m = layer(config)
    x = torch.randn(6, 2, 16, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    tokens = x.reshape(12, 16)
    from megatron.core.transformer.moe.capacity import drop_over_capacity
    probs, idx, _ = topk_routing(F.linear(tokens, m.router.weight), 2)
    probs, idx = drop_over_capacity(probs, idx, 4, 0.5)
    assert (idx == 4).any()  # some pairs are dropped
    experts = m.experts.local_experts
    want = torch.stack([sum((probs[t, j] * experts[str(int(idx[t, j]))](tokens[t:t + 1])[0]
                             for j in range(2) if idx[t, j] < 4), torch.zeros(16, dtype=x.dtype)) for t in range(12)])
    assert_chain_close(m(x), want.view(6, 2, 16), "layer against token by token")


def test_flops_count_active_experts_only():
    from megatron.training.observability.flops import num_floating_point_operations
    dense = TransformerConfig(num_layers=2, hidden_size=16, num_attention_heads=2, ffn_hidden_size=64, vocab_size=100)
    moe = TransformerConfig(num_layers=2, hidden_size=16, num_attention_heads=2, ffn_hidden_size=64, vocab_size=100,
                            num_experts=8, moe_router_topk=2, moe_ffn_hidden_size=32, moe_layer_freq=2)
    # layer 1 is MoE: its MLP (2 h f x 2 = 4096) becomes router 2 h E (256) + 2 experts x 2 h f_moe x 2 (4096)
    per_token_change = 256 + 4096 - 4096
    assert num_floating_point_operations(moe, 3) - num_floating_point_operations(dense, 3) == 3 * 3 * 256 * \
        per_token_change


def test_expert_groups_carved_out_of_data_parallel_ranks():
    from megatron.core.parallel_layout import ParallelLayout
    from megatron.core.parallel_state import ParallelConfigError
    layout = ParallelLayout(8, tp=2, ep=2)  # parallel_layout's example
    assert sorted(layout.rank_lists("ep")) == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert sorted(layout.rank_lists("edp")) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    layout = ParallelLayout(4, pp=2, ep=2)
    assert layout.rank_lists("ep") == [[0, 1], [2, 3]] and layout.rank_lists("edp") == [[0], [1], [2], [3]]
    with pytest.raises(ParallelConfigError, match="--expert-model-parallel-size"):
        ParallelLayout(6, ep=4)
