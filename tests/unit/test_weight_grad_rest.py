"""Every parameter of GPT, MoE GPT and BERT models under the zero-bubble backward split
(pipeline_parallel/backward_split.py), one process: B leaves every parameter's gradient untouched and
fires no post-accumulate-grad hook; W gives each parameter its ordinary-backward gradient, bit for bit,
its hook once per microbatch (what DDP's buckets count). tests/split_check.py does the comparing, with
and without gradient-accumulation fusion (the linears' weight gradients added into DDP's buffer in W).

The guard that nothing is computed in B: the parameters whose hooks fire in W must be *all* of the
model's. Each model runs as the stages a pipeline cuts it into: the first (token ids in, hidden states
out: no input gradient, so W is the whole backward), the last (hidden states in, the loss out) and a
middle one (hidden states in and out). Parameters reached by other ops than a layer's linear and norm:
learned absolute position embeddings (slice and position_ids), skip_bias_add biases a fusion adds
(dense MLP and shared expert: the csrc kernel needs CUDA, so on CPU the activation front's torch
fallback adds them, the same graph around the linear), the router, the shared-expert gate, BERT's token
types, pooler, binary head and LM head, and the tied word table on the last stage."""

import pytest
import torch

from megatron.core.comm import PlanGroup
from megatron.core.config import TransformerConfig
from megatron.core.models.bert import BertModel
from megatron.core.models.gpt import GPTModel
from megatron.core.parallel_layout import ParallelLayout
from megatron.core.tensor_parallel.initialization import initialize_parameters
from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
from megatron.core.transformer.mlp import MLP
from megatron.core.transformer.moe import step_hooks
from tests.split_check import check_split

B, S, V, H = 2, 8, 50, 16
BASE = dict(num_layers=2, hidden_size=H, num_attention_heads=2, seq_length=S, vocab_size=V, hidden_dropout=0.0,
            attention_dropout=0.0, position_embedding_type="learned_absolute", add_bias_linear=True)
MOE = dict(num_experts=4, moe_ffn_hidden_size=8, moe_router_topk=2, moe_shared_expert_intermediate_size=12,
           moe_shared_expert_gate=True, moe_aux_loss_coeff=0.1, moe_z_loss_coeff=0.01)
MODELS = {
    "gpt-fused-bias": ("gpt", dict()),
    "gpt-untied-position-ids": ("gpt", dict(untie_embeddings_and_output_weights=True, positions=True)),
    "gpt-swiglu-fused-bias": ("gpt", dict(swiglu=True, normalization="RMSNorm")),
    "gpt-qk-norm": ("gpt", dict(swiglu=True, normalization="RMSNorm", qk_layernorm=True, kv_channels=6)),
    "gpt-moe-shared-gate": ("gpt", MOE),
    "gpt-moe-grouped-recompute": ("gpt", dict(MOE, moe_grouped_gemm=True, recompute_granularity="full",
                                              recompute_method="uniform", recompute_num_layers=1)),
    "bert-post-norm": ("bert", dict(post_norm=True)),
    "bert-pre-norm": ("bert", dict()),
}
STAGES = {"first": (True, False), "middle": (False, False), "last": (False, True)}
# what the split must reach beyond the layers' linears and norms (by name suffix), on the stage that has it
MUST_HAVE = {
    ("gpt", "first"): ["position_embeddings", "word_embeddings.weight", "linear_fc1.bias"],
    ("gpt", "last"): ["word_embeddings.weight|output_layer.weight", "linear_fc1.bias", "final_layernorm.weight"],
    ("bert", "first"): ["position_embeddings", "tokentype_embeddings", "linear_fc1.bias"],
    ("bert", "last"): ["lm_head.bias", "lm_head.dense.weight", "pooler.weight", "pooler.bias", "binary_head.weight",
                       "binary_head.bias", "word_embeddings.weight"],
}


def _as_if_fused(model):
    """Every MLP's fc1 skips its bias and the activation front adds it (what a fused bias-GeLU/SwiGLU
    kernel does on a GPU; on CPU the front falls back to torch's x + bias after the linear)."""
    fused = [m for m in model.modules() if isinstance(m, MLP)]
    for m in fused:
        m.activation_impl, m.linear_fc1.skip_bias_add = "csrc", True
    return len(fused)


def _build(name, stage):
    kind, kw = MODELS[name]
    kw = dict(kw)
    positions = kw.pop("positions", False)
    cfg = TransformerConfig(**{**BASE, **kw})
    cfg.validate()
    groups = ParallelLayout(1).plan_groups(0)
    pre, post = STAGES[stage]
    model = (GPTModel if kind == "gpt" else BertModel)(cfg, groups, pre_process=pre, post_process=post)
    with torch.no_grad():
        initialize_parameters(model, 7, 0, 1)
        for n, p in model.named_parameters():  # biases start at zero: make their paths matter
            if n.endswith("bias"):
                p.normal_(0, 0.1, generator=torch.Generator().manual_seed(len(n)))
    assert _as_if_fused(model) >= 1
    g = torch.Generator().manual_seed(3)
    steps = []
    for _ in range(2):
        ids = torch.randint(0, V, (B, S), generator=g)
        hidden = None if pre else torch.randn(S, B, H, generator=g)
        # the loss: logits against fixed random weights (the vocab-parallel cross entropy wants a process group)
        w = torch.randn(B, S, cfg.padded_vocab_size, generator=g) if post else torch.randn(S, B, H, generator=g)
        if kind == "bert":
            extra = dict(padding_mask=torch.ones(B, S, dtype=torch.bool),
                         tokentype_ids=torch.randint(0, 2, (B, S), generator=g))
        else:
            extra = dict(position_ids=torch.randint(0, S, (B, S), generator=g) if positions else None)
        steps.append(_step(kind, ids, hidden, w, extra, post))
    return kind, model, steps


def _step(kind, ids, hidden, w, extra, post):
    def step(model):
        inp = None if hidden is None else hidden.clone().requires_grad_()
        out = model(ids, hidden_states=inp, **extra)
        if not post:
            return out, w, inp
        logits, binary = out if kind == "bert" else (out, None)
        return (logits * w).sum() + (0 if binary is None else binary.pow(2).sum()), None, inp
    return step


# weights whose gradients gradient-accumulation fusion adds into the grad sink (by name suffix)
FUSED = ("linear_qkv.weight", "linear_proj.weight", "linear_fc1.weight", "linear_fc2.weight", "router.weight",
         "gate_weight", "fc1_weight", "fc2_weight", "output_layer.weight", "pooler.weight", "binary_head.weight",
         "lm_head.dense.weight")


@pytest.mark.parametrize("fusion", [False, True], ids=["autograd", "fused"])
@pytest.mark.parametrize("stage", list(STAGES))
@pytest.mark.parametrize("name", list(MODELS))
def test_every_parameter_gets_its_gradient_in_w_equal_to_the_ordinary_backward(name, stage, fusion):
    kind, model, steps = _build(name, stage)
    names = [n for n, _ in model.named_parameters()]
    for suffix in MUST_HAVE.get((kind, stage), []):
        assert any(n.endswith(alt) for n in names for alt in suffix.split("|")), suffix
    if "moe" in name:
        for suffix in ("shared_experts.gate_weight", "shared_experts.linear_fc1.bias", "router.weight", "fc1_weight"):
            assert any(n.endswith(suffix) for n in names), suffix
    if (losses := step_hooks.bind(model)) is not None:  # the MoE balance losses of both runs
        losses.start_iteration(1.0, 2 * len(steps))
    figures = check_split(model, steps, fusion=fusion)
    if fusion:  # every linear's weight, and nothing else, reached its sink without a .grad
        tied_here = kind == "gpt" and stage == "last"  # the word table's one use on a last stage: the logits
        want = sorted(n for n in names if n.endswith(FUSED) or tied_here and n == "word_embeddings.weight")
        assert figures["fused"] == want
    if stage == "first":  # no input gradient: B has nothing to compute
        assert figures["b_gemms"] == 0 and not figures["input_grads"]
    else:  # B ran the input-gradient GEMMs, W the weights'
        assert figures["b_gemms"] > 0 and figures["w_gemms"] > 0 and len(figures["input_grads"]) == 2


@pytest.mark.parametrize("fusion", [False, True], ids=["autograd", "fused"])
@pytest.mark.parametrize("cls", [ColumnParallelLinear, RowParallelLinear])
def test_skip_bias_add_bias_gets_its_gradient_in_w(cls, fusion):
    lin = cls(6, 4, group=PlanGroup(1, 0), skip_bias_add=True)
    g = torch.Generator().manual_seed(4)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(lin.weight.shape, generator=g))
        lin.bias.copy_(torch.randn(lin.bias.shape, generator=g))
    x, gy = torch.randn(3, 2, 6, generator=g), torch.randn(3, 2, 4, generator=g)

    def step(m):
        inp = x.clone().requires_grad_()
        y, bias = m(inp)
        assert bias is m.bias  # the very parameter: the caller adds it, the split finds it
        return y + bias, gy, inp
    check_split(lin, [step, step], fusion=fusion)
