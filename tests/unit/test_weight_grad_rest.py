"""Every parameter of a GPT and a BERT model under the zero-bubble backward split
(tensor_parallel/weight_grad.py), one process: B (a backward inside deferring()) leaves every
parameter's gradient untouched and fires no post-accumulate-grad hook; W (apply) gives the ordinary
backward's gradients, each parameter's hook once per microbatch (what DDP's buckets count).

The guard that nothing slips back into B: the parameters whose hooks fire in W must be *all* of the
model's. Covered here beyond test_weight_grad.py / test_moe_weight_grad.py: learned absolute position
embeddings (slice and position_ids), skip_bias_add biases a fusion adds (dense MLP and shared expert:
the csrc kernel needs CUDA, so on CPU the activation front's torch fallback adds them, the same graph
around the linear; the column linear's W computes their gradient, a row linear's goes through
weight_grad.deferred), the shared-expert gate, BERT's token types, pooler, binary head and LM head.

The two paths compute the same function in another order (a norm's affine apart from its
normalisation, the weight GEMM transposed), so the models run in fp64 and compare within the chain
bound of tests/rounding.py; every draw comes from a seeded generator."""
import types

import pytest
import torch

from megatron.core.comm import PlanGroup
from megatron.core.config import TransformerConfig
from megatron.core.models.bert import BertModel
from megatron.core.models.gpt import GPTModel
from megatron.core.tensor_parallel import weight_grad
from megatron.core.tensor_parallel.initialization import initialize_parameters
from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
from megatron.core.transformer.mlp import MLP
from megatron.core.transformer.moe import aux_losses
from tests.rounding import assert_chain_close, assert_within, sum_bound

B, S, V = 2, 8, 50
BASE = dict(num_layers=2, hidden_size=16, num_attention_heads=2, seq_length=S, vocab_size=V, hidden_dropout=0.0,
            attention_dropout=0.0, position_embedding_type="learned_absolute", add_bias_linear=True)
MOE = dict(num_experts=4, moe_ffn_hidden_size=8, moe_router_topk=2, moe_shared_expert_intermediate_size=12,
           moe_shared_expert_gate=True, moe_aux_loss_coeff=0.1, moe_z_loss_coeff=0.01)
MODELS = {
    "gpt-fused-bias": ("gpt", dict()),
    "gpt-untied-position-ids": ("gpt", dict(untie_embeddings_and_output_weights=True, positions=True)),
    "gpt-swiglu-fused-bias": ("gpt", dict(swiglu=True, normalization="RMSNorm")),
    "gpt-moe-shared-gate": ("gpt", MOE),
    "bert-post-norm": ("bert", dict(post_norm=True)),
    "bert-pre-norm": ("bert", dict()),
}
# what the split must reach beyond the layers' linears and norms (by name suffix)
MUST_HAVE = {
    "gpt": ["position_embeddings", "word_embeddings.weight", "linear_fc1.bias"],
    "bert": ["position_embeddings", "tokentype_embeddings", "lm_head.bias", "lm_head.dense.weight", "pooler.weight",
             "pooler.bias", "binary_head.weight", "binary_head.bias", "linear_fc1.bias"],
}


def _as_if_fused(model):
    """Every MLP's fc1 skips its bias and the activation front adds it (what a fused bias-GeLU/SwiGLU
    kernel does on a GPU; on CPU the front falls back to torch's x + bias after the linear)."""
    fused = [m for m in model.modules() if isinstance(m, MLP)]
    for m in fused:
        m.activation_impl, m.linear_fc1.skip_bias_add = "csrc", True
    return len(fused)


def _build(name):
    kind, kw = MODELS[name]
    kw = dict(kw)
    positions = kw.pop("positions", False)
    cfg = TransformerConfig(**{**BASE, **kw}, params_dtype=torch.float64)
    cfg.validate()
    groups = types.SimpleNamespace(tp=PlanGroup(1, 0), tp_size=1, tp_rank=0, pp_size=1, pp_rank=0)
    model = (GPTModel if kind == "gpt" else BertModel)(cfg, groups)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        initialize_parameters(model, 7, 0, 1)
        for n, p in model.named_parameters():  # biases start at zero: make their paths matter
            if n.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.1)
    assert _as_if_fused(model) >= 2
    batches = []
    for _ in range(2):
        # the loss: logits against fixed random weights (the vocab-parallel cross entropy wants a process group)
        ids, w = torch.randint(0, V, (B, S), generator=g), torch.randn(B, S, cfg.padded_vocab_size, generator=g,
                                                                 dtype=torch.float64)
        if kind == "bert":
            mask, types_ = torch.ones(B, S, dtype=torch.bool), torch.randint(0, 2, (B, S), generator=g)
            batches.append(lambda m, a=(ids, mask, types_), w=w: _dot(*m(*a), w))
        else:
            pos = torch.randint(0, S, (B, S), generator=g) if positions else None
            batches.append(lambda m, a=(ids, None, None, None, pos), w=w: _dot(m(*a), None, w))
    return kind, model, batches


def _dot(logits, binary, w):
    return (logits * w).sum() + (0 if binary is None else binary.pow(2).sum())


def _run(model, batches, split):
    """Forward and backward of each microbatch; with split, B then W and the checks between them.
    Returns (param grads, hook calls per parameter)."""
    calls = {}
    handles = [p.register_post_accumulate_grad_hook(lambda p, n=n: calls.__setitem__(n, calls.get(n, 0) + 1))
               for n, p in model.named_parameters()]
    aux_losses.start_iteration(1.0, len(batches))
    for i, step in enumerate(batches):
        with weight_grad.splitting(split):
            loss = step(model)
        if not split:
            loss.backward()
            continue
        before = {n: None if p.grad is None else p.grad.clone() for n, p in model.named_parameters()}
        with weight_grad.splitting(), weight_grad.deferring() as work:  # B: input gradients only
            loss.backward()
        early = sorted(n for n, c in calls.items() if c > i)
        assert not early, f"computed in B, not deferred to W: {early}"
        for n, p in model.named_parameters():
            assert (p.grad is None) if before[n] is None else torch.equal(p.grad, before[n]), f"{n} changed in B"
        weight_grad.apply(work)  # W
        missing = sorted(n for n, _ in model.named_parameters() if calls.get(n, 0) != i + 1)
        assert not missing, f"no gradient (or not one) in W: {missing}"
    for h in handles:
        h.remove()
    return {n: p.grad.clone() for n, p in model.named_parameters()}, calls


@pytest.mark.parametrize("name", list(MODELS))
def test_every_parameter_gets_its_gradient_in_w_equal_to_the_ordinary_backward(name):
    kind, model, batches = _build(name)
    names = [n for n, _ in model.named_parameters()]
    for suffix in MUST_HAVE[kind]:
        assert any(n.endswith(suffix) for n in names), suffix
    if "moe" in name:
        assert any(n.endswith("shared_experts.gate_weight") for n in names)
        assert any(n.endswith("shared_experts.linear_fc1.bias") for n in names)
    want, want_calls = _run(model, batches, split=False)
    model.zero_grad(set_to_none=True)
    got, calls = _run(model, batches, split=True)
    assert calls == want_calls and set(calls) == set(names)  # every parameter, once per microbatch
    for n in names:
        assert_chain_close(got[n], want[n], n)


@pytest.mark.parametrize("cls", [ColumnParallelLinear, RowParallelLinear])
def test_skip_bias_add_bias_waits_for_w(cls):
    lin = cls(6, 4, group=PlanGroup(1, 0), skip_bias_add=True)
    g = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for p in (lin.weight, lin.bias):
            p.copy_(torch.randn(p.shape, generator=g))
    x, gy = torch.randn(3, 2, 6, generator=g), torch.randn(3, 2, 4, generator=g)
    y, bias = lin(x)
    assert bias is lin.bias  # outside the zero-bubble schedules the very parameter, as before
    (y + bias).backward(gy)
    want = lin.bias.grad.clone()
    lin.zero_grad(set_to_none=True)
    with weight_grad.splitting():
        y, bias = lin(x)
    assert bias is not lin.bias and torch.equal(bias, lin.bias)
    with weight_grad.splitting(), weight_grad.deferring() as work:
        (y + bias).backward(gy)
    assert lin.bias.grad is None and lin.weight.grad is None
    weight_grad.apply(work)
    assert_within(lin.bias.grad, want, sum_bound(gy.reshape(-1, 4), 0), "bias gradient")  # both sum gy


def test_deferred_outside_deferring_accumulates_in_the_backward():
    p = torch.nn.Parameter(torch.randn(5, generator=torch.Generator().manual_seed(5)))
    calls = []
    p.register_post_accumulate_grad_hook(lambda q: calls.append(1))
    (weight_grad.deferred(p) * 3).sum().backward()
    assert torch.equal(p.grad, torch.full((5,), 3.0)) and calls == [1]
