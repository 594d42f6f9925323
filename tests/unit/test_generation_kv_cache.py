"""Generation with the KV cache equals recomputing the whole sequence, for every GPT the trainer builds.

One process, no process group: one rank's stand-in groups (ParallelLayout.plan_groups) make every TP
collective the identity. Tiny fp64 models with random weights (std 0.3, so that the greedy
tokens depend on the input and a wrong cache would change them): the cached and the whole forward sum
in other orders, so they compare within the chain bound of tests/rounding.py, and a near tie of two
logits cannot pick another greedy token on another CPU."""
import pytest
import torch

from megatron.core.config import TransformerConfig
from megatron.core.inference.generation import forward_with_cache, generate
from megatron.core.models.bert import BertModel
from megatron.core.models.gpt import GPTModel
from megatron.core.parallel_layout import ParallelLayout
from megatron.core.tensor_parallel.initialization import initialize_parameters
from megatron.core.transformer.kv_cache import KVCache
from tests.rounding import CHAIN_RTOL_FP64, assert_within

VOCAB, B, PROMPT, NEW = 40, 2, 5, 6
VARIANTS = {
    "gpt": {},
    "rope": dict(position_embedding_type="rope"),
    "gqa": dict(group_query_attention=True, num_query_groups=2),
    "gqa-unfused": dict(group_query_attention=True, num_query_groups=2, attention_backend="unfused"),
    "swiglu": dict(swiglu=True),
    "rmsnorm": dict(normalization="RMSNorm"),
    "untied": dict(untie_embeddings_and_output_weights=True),
    "post-norm": dict(post_norm=True),
    "llama": dict(position_embedding_type="rope", normalization="RMSNorm", swiglu=True, group_query_attention=True,
                  num_query_groups=2, add_bias_linear=False, untie_embeddings_and_output_weights=True),
    # multi-latent attention: the cache holds the latents and the rotated shared key (YaRN; v wider than q, then
    # no query compression; a DeepSeek-V3 shape with group-limited MoE and an MTP module generation ignores)
    "mla": dict(position_embedding_type="rope", normalization="RMSNorm", multi_latent_attention=True, q_lora_rank=12,
                kv_lora_rank=10, qk_head_dim=6, qk_pos_emb_head_dim=4, v_head_dim=12, qk_layernorm=True,
                rotary_scaling_factor=4.0, mscale_all_dim=1.0, yarn_original_max_position_embeddings=4),
    "mla-q-direct-unfused": dict(position_embedding_type="rope", multi_latent_attention=True, kv_lora_rank=10,
                                 qk_head_dim=8, qk_pos_emb_head_dim=4, v_head_dim=6, rope_type="rope",
                                 attention_backend="unfused"),
    "deepseek": dict(position_embedding_type="rope", normalization="RMSNorm", swiglu=True, add_bias_linear=False,
                     multi_latent_attention=True, q_lora_rank=12, kv_lora_rank=10, qk_head_dim=6,
                     qk_pos_emb_head_dim=4, v_head_dim=6, qk_layernorm=True, num_experts=4, moe_router_topk=2,
                     moe_layer_freq=[0, 1], moe_router_score_function="sigmoid", moe_router_num_groups=2,
                     moe_router_group_topk=1, moe_router_topk_scaling_factor=2.5, mtp_num_layers=1),
}


def _groups():
    return ParallelLayout(1).plan_groups(0)


def _config(**variant):
    cfg = TransformerConfig(num_layers=2, hidden_size=32, num_attention_heads=4, seq_length=16, vocab_size=VOCAB,
                            make_vocab_size_divisible_by=8, hidden_dropout=0.0, attention_dropout=0.0,
                            init_method_std=0.3, params_dtype=torch.float64, **variant)
    cfg.validate()
    return cfg


def _model(cls=GPTModel, **variant):
    model = cls(_config(**variant), _groups())
    initialize_parameters(model, 1234, 0, 1)
    return model.eval()


def _full_logits(model, ids):
    """The plain forward over the whole sequence: [b, s, VOCAB]."""
    with torch.no_grad():
        return model(ids)[..., :VOCAB]


def _assert_close_in_fp32(cached, full, what):
    """forward_with_cache hands back its fp64 logits rounded to fp32: within the chain bound of the whole
    forward's, then one fp32 rounding each, so at most one fp32 ulp (<= eps |x|) further apart."""
    bound = CHAIN_RTOL_FP64 * full.abs().max().item() + torch.finfo(torch.float32).eps * full.abs()
    assert_within(cached.double(), full, bound, what)


def _assert_no_near_tie(full):
    """The greedy tokens of two computations are compared as integers: that holds on any CPU only where the best
    logit leads the second by more than the two can differ (_assert_close_in_fp32's bound, on each side)."""
    top = full.topk(2, dim=-1).values
    bound = CHAIN_RTOL_FP64 * full.abs().max().item() + torch.finfo(torch.float32).eps * top.abs()
    assert (top[:, 0] - top[:, 1] > 2 * bound.max(-1).values).all(), "a near tie: pick another seed"


def _prompt():
    return torch.randint(0, VOCAB, (B, PROMPT), generator=torch.Generator().manual_seed(7))


@pytest.mark.parametrize("name", VARIANTS)
def test_cached_greedy_equals_recomputed(name):
    model = _model(**VARIANTS[name])
    ids = _prompt()
    recomputed = ids
    for _ in range(NEW):
        logits = _full_logits(model, recomputed)[:, -1]
        _assert_no_near_tie(logits)
        recomputed = torch.cat([recomputed, logits.argmax(dim=-1)[:, None]], dim=1)
    assert generate(model, ids, NEW).tolist() == recomputed.tolist()
    assert len(set(recomputed[:, PROMPT:].flatten().tolist())) > 1  # the check can fail: tokens vary

    cache, step = KVCache(), ids
    for end in range(PROMPT, PROMPT + NEW + 1):
        cached = forward_with_cache(model, step, cache)[:, -1]
        _assert_close_in_fp32(cached, _full_logits(model, recomputed[:, :end])[:, -1], f"cached logits at {end}")
        assert cache.seq_len == end
        step = recomputed[:, end:end + 1]


@pytest.mark.parametrize("name", ["gpt", "llama", "gqa-unfused", "mla", "mla-q-direct-unfused"])
def test_prompt_in_pieces(name):
    """Several tokens after a filled cache: the causal mask is no longer square."""
    model = _model(**VARIANTS[name])
    ids = torch.randint(0, VOCAB, (B, 9), generator=torch.Generator().manual_seed(3))
    cache = KVCache()
    pieces = [forward_with_cache(model, ids[:, a:b], cache) for a, b in ((0, 4), (4, 5), (5, 9))]
    _assert_close_in_fp32(torch.cat(pieces, dim=1), _full_logits(model, ids), "logits of the pieces")


def test_bert_is_refused():
    with pytest.raises(TypeError, match="GPTModel"):
        generate(_model(BertModel), _prompt(), NEW)
