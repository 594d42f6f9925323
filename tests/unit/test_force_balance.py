"""--moe-router-force-load-balancing (moe/force_balance.py): a router that sends every token to expert 0 is
overridden by random logits that spread the load evenly, the router's logits get the gradient straight through,
and a token's random logits do not depend on which other tokens share its batch."""
import torch

from megatron.core.config import TransformerConfig
from megatron.core.transformer.moe import force_balance
from megatron.core.transformer.moe.router import TopKRouter
from megatron.core.transformer.moe.token_counts import tokens_per_expert

T, H, E, K = 4096, 32, 8, 2


def _router(forced):
    c = TransformerConfig(num_layers=2, hidden_size=H, num_attention_heads=4, seq_length=16, vocab_size=32,
                          num_experts=E, moe_router_topk=K, moe_router_force_load_balancing=forced).resolve()
    r = TopKRouter(c, 1, device="cpu")
    with torch.no_grad():
        r.weight.zero_()
        r.weight[0] = 1.0  # the router's own logits: expert 0 first for every token with a positive sum
    return r


def _tokens():
    return torch.randn(T, H, generator=torch.Generator().manual_seed(0)).abs() + 0.1


def test_forced_routing_spreads_a_collapsed_router_evenly():
    x = _tokens()
    plain = tokens_per_expert(_router(False)(x, 16)[1], E)
    assert plain[0] == T  # collapsed: every token's first choice
    counts = tokens_per_expert(_router(True)(x, 16)[1], E).float()
    mean = T * K / E
    assert counts.sum() == T * K and ((counts - mean).abs() <= 0.1 * mean).all(), counts  # binomial sd ~ 0.03 mean


def test_router_logits_get_the_gradient_straight_through():
    x = _tokens()[:64].requires_grad_()
    r = _router(True)
    probs, _, _ = r(x, 16)
    w = torch.randn(probs.shape, generator=torch.Generator().manual_seed(1))
    (probs * w).sum().backward()
    # by hand: the same routing from the random logits as a leaf, its gradient through the router's linear map
    routed = force_balance.random_logits(x.detach() @ r.weight.t(), x.detach(), r.force_projection)
    routed = routed.detach().requires_grad_()
    from megatron.core.transformer.moe.router import topk_routing
    p2, _, _ = topk_routing(routed, K, "softmax")
    (p2 * w).sum().backward()
    assert torch.allclose(r.weight.grad, routed.grad.t() @ x.detach(), rtol=1e-6, atol=1e-7)


def test_a_tokens_logits_do_not_depend_on_its_batch():
    x = _tokens()[:40]
    m = force_balance.projection(H, E, 3)
    whole = force_balance.random_logits(torch.zeros(40, E), x, m)
    part = force_balance.random_logits(torch.zeros(7, E), x[11:18], m)
    assert torch.allclose(whole[11:18], part, rtol=1e-6, atol=1e-6)
    assert not torch.allclose(m, force_balance.projection(H, E, 4))  # each layer its own matrix
