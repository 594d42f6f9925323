"""The loss contract (pipeline_parallel/losses.py) in one process: named terms in, per-term
(sum, count) out, each term's gradient that of its own mean over the global batch."""
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from megatron.core.pipeline_parallel import forward_backward, loss_means
from megatron.core.pipeline_parallel.losses import masked_sums
from tests.rounding import assert_within, gamma, unit_roundoff

ONE_RANK = SimpleNamespace(pp_size=1, pp_rank=0, dp_size=1, cp_size=1, tp_size=1, is_last_stage=True)
TERMS = {"token loss": "loss_mask", "sample loss": None}


def _batches():
    g = torch.Generator().manual_seed(0)
    return [{"tokens": torch.randn(2, 5, 3, generator=g), "loss_mask": (torch.rand(2, 5, generator=g) > 0.3).float()}
            for _ in range(3)]


def _step(model, batch):
    per_token = model(batch["tokens"]).squeeze(-1) ** 2  # [b, s]
    per_sample = per_token.mean(-1)  # [b]
    return {"sample loss": (per_sample, torch.ones_like(per_sample)), "token loss": (per_token, batch["loss_mask"])}


def test_each_term_is_averaged_over_its_own_count_and_the_means_added():
    torch.manual_seed(0)
    model, batches = nn.Linear(3, 1), _batches()
    losses = forward_backward(model, batches, _step, ONE_RANK, TERMS)
    got = [p.grad.clone() for p in model.parameters()]

    model.zero_grad()
    terms = [_step(model, b) for b in batches]
    token = sum((t["token loss"][0] * t["token loss"][1]).sum() for t in terms)
    tokens = sum(b["loss_mask"].sum() for b in batches)
    sample = sum(t["sample loss"][0].sum() for t in terms)
    (token / tokens + sample / 6).backward()

    assert list(losses) == list(TERMS)
    assert losses["token loss"][1].item() == tokens.item() and losses["sample loss"][1].item() == 6
    means = loss_means(losses)
    # both sides sum the same 30 non-negative fp32 terms (squares), maybe in other orders, then divide
    rel = 2 * gamma(30, torch.float32) + 2 * unit_roundoff(torch.float32)
    assert means["token loss"].item() == pytest.approx((token / tokens).item(), rel=rel)
    assert means["sample loss"].item() == pytest.approx((sample / 6).item(), rel=rel)
    # each gradient sums 2 x 30 per-token terms 2 c y dy/dparam (c the token's weight in the loss,
    # dy/dw = x, dy/db = 1) in other orders, each term a product of 4 roundings at most: within
    # 2 gamma(60 + 4) of the terms' absolute sum (Higham eq. 3.4 with products of 4 factors)
    with torch.no_grad():
        abs_w, abs_b = 0, 0
        for b in batches:
            c = b["loss_mask"] / tokens + 1 / 30  # token loss over its count, sample loss: mean of 5, over 6
            t = 2 * c * model(b["tokens"]).squeeze(-1).abs()
            abs_w, abs_b = abs_w + (t.unsqueeze(-1) * b["tokens"].abs()).sum((0, 1)), abs_b + t.sum()
    for a, p, terms_abs in zip(got, model.parameters(), (abs_w, abs_b)):
        assert_within(a, p.grad, 2 * gamma(64, torch.float32) * terms_abs, "gradient")


def test_forward_only_returns_the_same_sums_without_gradients():
    torch.manual_seed(0)
    model, batches = nn.Linear(3, 1), _batches()
    with torch.no_grad():
        losses = forward_backward(model, batches, _step, ONE_RANK, TERMS, forward_only=True)
    assert all(p.grad is None for p in model.parameters())
    assert losses["sample loss"][1].item() == 6


def test_a_term_forward_step_does_not_return_is_named():
    loss = torch.ones(2)
    with pytest.raises(ValueError, match="returned the loss terms \\['lm loss'\\]; the declaration names"):
        masked_sums({"lm loss": (loss, loss)}, ["lm loss", "sop loss"])
