"""--recompute-modules layernorm (transformer/norm_recompute.py): a layer gives bitwise the outputs and gradients
of the plain layer (dense, MoE, multi-latent attention; fp32 and bf16), and after its forward it holds exactly
the two norm outputs and the norms' statistics less (the storages autograd saved, measured when the forward is
over: the freed outputs count 0)."""
import pytest
import torch

from megatron.core.config import TransformerConfig
from megatron.core.errors import ConfigError
from megatron.core.parallel_layout import ParallelLayout
from megatron.core.tensor_parallel.random import model_parallel_seed
from megatron.core.transformer.layer import TransformerLayer
from tests.activation_memory import measure

S, B, H = 16, 2, 32
KINDS = {
    "dense": dict(),
    "moe": dict(num_experts=4, moe_router_topk=2, moe_ffn_hidden_size=24, swiglu=True),
    "mla": dict(multi_latent_attention=True, q_lora_rank=12, kv_lora_rank=10, qk_head_dim=8, qk_pos_emb_head_dim=4,
                v_head_dim=8, qk_layernorm=True, normalization="RMSNorm", position_embedding_type="rope"),
}


def _layer(kind, dtype, recompute):
    c = TransformerConfig(num_layers=2, hidden_size=H, num_attention_heads=4, seq_length=S, vocab_size=32,
                          params_dtype=dtype, hidden_dropout=0.0, attention_dropout=0.0, add_bias_linear=kind != "mla",
                          recompute_granularity="selective" if recompute else None,
                          recompute_modules=["layernorm"] if recompute else None, **KINDS[kind]).resolve()
    c.validate()
    model_parallel_seed(3, 0, 0, "cpu")
    layer = TransformerLayer(c, ParallelLayout(1).plan_groups(0), 1, device="cpu").train()
    g = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.2 + (1.0 if p.ndim == 1 else 0.0))
    return layer, c


def _rope(c, dtype):
    if c.multi_latent_attention:
        from megatron.core.transformer.mla_rope import mla_cos_sin
        return mla_cos_sin(c, S, torch.device("cpu"), dtype)
    return None


def _run(kind, dtype, recompute):
    layer, c = _layer(kind, dtype, recompute)
    x = torch.randn(S, B, H, generator=torch.Generator().manual_seed(5)).to(dtype).requires_grad_()
    kept = {}

    def pack(t):  # by storage identity: a freed storage's address may be reused by a later one
        kept.setdefault(t.untyped_storage()._cdata, t.untyped_storage())
        return t
    params = {p.untyped_storage()._cdata for p in layer.parameters()}
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = layer(x, _rope(c, dtype))
    held = sum(st.nbytes() for ptr, st in kept.items() if ptr not in params)  # after the forward: freed ones are 0
    y.float().pow(2).sum().backward()
    return y.detach(), x.grad, {n: p.grad for n, p in layer.named_parameters()}, held


def _same(a, b, exact):
    """Bitwise; or, where the plain fp32 RMSNorm (a composite of ops) adds two terms into its input's gradient
    that the rebuilt norm sums first, one rounding of that three-term sum apart, carried through the backward."""
    if exact:
        return torch.equal(a, b)
    return (a - b).abs().max().item() <= 2e-6 * a.abs().max().item()


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_same_bits_and_two_norm_outputs_less(kind, dtype):
    y0, dx0, g0, held0 = _run(kind, dtype, False)
    y1, dx1, g1, held1 = _run(kind, dtype, True)
    exact = not (kind == "mla" and dtype == torch.float32)
    assert torch.equal(y0, y1) and _same(dx0, dx1, exact)
    assert [n for n in g0 if not _same(g0[n], g1[n], exact)] == []
    # each of the two norms: its output (kept by its reader) and what the norm keeps besides its input (statistics;
    # torch's bf16 RMSNorm keeps an fp32 copy in place of its input, which the recompute keeps instead)
    layer, _ = _layer(kind, dtype, False)
    x = torch.randn(S, B, H, generator=torch.Generator().manual_seed(6), dtype=dtype, requires_grad=True)
    params = list(layer.parameters())
    _, stats = measure(lambda: layer.input_layernorm(x), [x] + params)
    _, with_input = measure(lambda: layer.input_layernorm(x), params)
    kept_input = with_input - stats == x.nbytes
    assert held0 - held1 == 2 * (x.nbytes + stats - (0 if kept_input else x.nbytes))


def test_eval_and_no_grad_run_the_plain_path():
    layer, _ = _layer("dense", torch.float32, True)
    x = torch.randn(S, B, H, generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        a = layer(x)
    assert torch.equal(a, layer.eval()(x))


def test_post_norm_is_refused_in_one_line():
    with pytest.raises(ConfigError, match="post-norm") as e:
        TransformerConfig(num_layers=2, hidden_size=H, num_attention_heads=4, seq_length=S, vocab_size=32,
                          post_norm=True, recompute_granularity="selective",
                          recompute_modules=["layernorm"]).resolve().validate()
    assert "\n" not in str(e.value)



def test_estimator_drops_the_two_norm_outputs():
    from megatron.training.planner.activations import kept_activation_bytes

    def kept(modules, **kw):
        c = TransformerConfig(num_layers=2, hidden_size=H, num_attention_heads=4, seq_length=S, vocab_size=32,
                              params_dtype=torch.bfloat16, recompute_granularity="selective",
                              recompute_modules=modules, **kw).resolve()
        return kept_activation_bytes(c, B, kw.get("tensor_model_parallel_size", 1), 3)[0]
    assert kept(["core_attn"]) - kept(["core_attn", "layernorm"]) == 3 * 2 * 2 * S * B * H
    assert kept(["core_attn"], tensor_model_parallel_size=2, sequence_parallel=True) - kept(
        ["core_attn", "layernorm"], tensor_model_parallel_size=2, sequence_parallel=True) == 3 * 2 * 2 * S * B * H / 2
