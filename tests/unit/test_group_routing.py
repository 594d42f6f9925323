"""Group-limited routing (--moe-router-num-groups / --moe-router-group-topk) and the top-k scaling factor
against a hand-computed case and a per-token reference written out here; the config checks."""
import itertools

import pytest
import torch

from megatron.core.config import TransformerConfig
from megatron.core.config_checks import validate
from megatron.core.errors import ConfigError
from megatron.core.transformer.moe.router import topk_routing


def reference(choice, scores, topk, num_groups, group_topk):
    """Per token: rank the groups by the sum of their top-(topk // group_topk) choice values, keep the best
    group_topk, then the top-k experts among those groups by choice; probs = scores of those experts."""
    tokens, experts = choice.shape
    size = experts // num_groups
    out_idx = []
    for t in range(tokens):
        row = choice[t].tolist()
        sums = [sum(sorted(row[g * size:(g + 1) * size], reverse=True)[:topk // group_topk])
                for g in range(num_groups)]
        groups = sorted(range(num_groups), key=lambda g: -sums[g])[:group_topk]
        allowed = [e for g in groups for e in range(g * size, (g + 1) * size)]
        out_idx.append(sorted(allowed, key=lambda e: -row[e])[:topk])
    idx = torch.tensor(out_idx)
    return scores.gather(1, idx), idx


def test_hand_computed_case():
    # 8 experts in 4 groups of 2, top-2 from 2 groups (sum of each group's top-1)
    logits = torch.tensor([[0.9, 0.1, 0.8, 0.7, 0.2, 0.3, 0.85, 0.0]], dtype=torch.float64)
    # sigmoid is monotone: groups by max logit: g0 0.9, g1 0.8, g2 0.3, g3 0.85 -> g0 and g3; top-2 {0, 6}
    probs, idx, _ = topk_routing(logits, 2, "sigmoid", num_groups=4, group_topk=2)
    assert idx.tolist() == [[0, 6]]
    s = torch.sigmoid(logits[0])
    torch.testing.assert_close(probs[0], torch.stack([s[0], s[6]]) / (s[0] + s[6]), rtol=0, atol=0)
    # group-topk 1 sums each group's top-2 sigmoids: g0 0.711 + 0.525 < g1 0.690 + 0.668 -> g1, though g0 holds the best
    _, idx1, _ = topk_routing(logits, 2, "sigmoid", num_groups=4, group_topk=1)
    assert idx1.tolist() == [[2, 3]]
    # top-4 from 2 groups: sums of top-2 sigmoids g0 0.98, g1 1.358, g2 0.969, g3 1.025 -> g1 and g3, where
    # plain top-4 would take experts 0, 2, 3, 4
    spread = torch.tensor([[0.9, -1.0, 0.8, 0.7, 0.85, -1.0, 0.1, 0.0]], dtype=torch.float64)
    _, plain, _ = topk_routing(spread, 4, "sigmoid")
    _, idx4, _ = topk_routing(spread, 4, "sigmoid", num_groups=4, group_topk=2)
    assert sorted(plain[0].tolist()) == [0, 2, 3, 4] and sorted(idx4[0].tolist()) == [2, 3, 6, 7]


@pytest.mark.parametrize("score,pre,bias,k,groups,gk", [
    ("sigmoid", False, True, 4, 4, 2), ("sigmoid", False, False, 2, 8, 2), ("softmax", True, False, 3, 4, 3),
    ("softmax", False, False, 4, 2, 1), ("softmax", False, True, 2, 4, 2)])
def test_matches_the_reference(score, pre, bias, k, groups, gk):
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(64, 16, generator=g, dtype=torch.float64)
    expert_bias = torch.randn(16, generator=g, dtype=torch.float64) * 0.3 if bias else None
    probs, idx, _ = topk_routing(logits, k, score, pre, expert_bias, groups, gk, scaling_factor=2.5)
    if score == "sigmoid":
        scores = torch.sigmoid(logits)
        choice = scores + expert_bias if bias else scores
        want, want_idx = reference(choice, scores, k, groups, gk)
        want = want / want.sum(-1, keepdim=True)
    elif pre or bias:
        scores = torch.softmax(logits, -1)
        want, want_idx = reference(scores + expert_bias if bias else scores, scores, k, groups, gk)
    else:  # top-k on the logits, softmax over the k
        top, want_idx = reference(logits, logits, k, groups, gk)
        want = torch.softmax(top, -1)
    assert idx.tolist() == want_idx.tolist()
    torch.testing.assert_close(probs, 2.5 * want, rtol=1e-15, atol=0)
    size = 16 // groups  # every token's experts lie in at most gk groups
    assert all(len({e // size for e in row}) <= gk for row in idx.tolist())


def test_without_groups_is_plain_topk_and_scaling_only_scales():
    logits = torch.randn(32, 8, generator=torch.Generator().manual_seed(5))
    for score in ("softmax", "sigmoid"):
        p0, i0, s0 = topk_routing(logits, 2, score)
        p1, i1, s1 = topk_routing(logits, 2, score, num_groups=4, group_topk=4)  # every group kept
        p2, i2, _ = topk_routing(logits, 2, score, scaling_factor=2.5)
        assert torch.equal(i0, i1) and torch.equal(p0, p1) and torch.equal(s0, s1) and torch.equal(i0, i2)
        assert torch.equal(p2, p0 * 2.5)


def _cfg(**kw):
    base = dict(num_layers=2, hidden_size=16, num_attention_heads=2, num_experts=8, moe_router_topk=2,
                vocab_size=32, seq_length=8)
    return TransformerConfig(**{**base, **kw})


@pytest.mark.parametrize("kw,match", [
    (dict(moe_router_group_topk=2), "--moe-router-group-topk needs --moe-router-num-groups"),
    (dict(moe_router_group_topk=2, moe_router_num_groups=3), "must divide --num-experts"),
    (dict(moe_router_group_topk=5, moe_router_num_groups=4), "between 1 and --moe-router-num-groups"),
    (dict(moe_router_group_topk=4, moe_router_num_groups=4), r"--moe-router-topk \(2\) must be between"),
    (dict(moe_router_group_topk=1, moe_router_num_groups=8, moe_router_topk=2), "chosen groups"),
    (dict(moe_router_topk_scaling_factor=0.0), "must be a positive number, got 0.0")])
def test_bad_group_settings_are_one_line(kw, match):
    with pytest.raises(ConfigError, match=match):
        validate(_cfg(**kw))


def test_good_settings_validate():
    for groups, gk in itertools.product((2, 4), (1, 2)):
        validate(_cfg(moe_router_num_groups=groups, moe_router_group_topk=gk, moe_router_topk=2))
