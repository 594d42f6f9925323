"""Saved-activation bytes per layer against Korthikanti et al.'s formula (see tests/activation_memory.py).

Measured with torch.autograd.graph.saved_tensors_hooks over the forward of a 2-layer block
in bf16 (storages counted once, parameters excluded), for no recompute, selective and full,
on one process, and at TP 2 with and without sequence parallelism (each rank measures its
own). The expected value is the paper's sum itemised for our layer, `ours()`, whose only
departures from the paper are named parameters, each explained in docs/activation_memory.md:
  * on CPU a dropout mask costs 2 bytes (F.dropout keeps the bf16 scaled noise; CUDA keeps
    a bool mask), and LayerNorm keeps bf16 mean and rstd (fp32 on CUDA, ignored by the paper);
  * the attention core: "unfused" is the paper's layer; SDPA's fused kernels keep no s x s
    tensor, only an fp32 log-sum-exp; CPU SDPA with attention dropout runs torch's fp32
    math fallback.
tests/unit/test_activation_memory.py shows that with the paper's parameters (1-byte masks,
no statistics, unfused core) `ours()` is exactly the paper's formula. The tolerance is the
issue's 10%; the measured values match `ours()` exactly on torch 2.13 (CPU).
"""
import itertools

import pytest
import torch

from megatron.core.config import TransformerConfig
from megatron.core.tensor_parallel.random import model_parallel_seed
from megatron.core.transformer.block import TransformerBlock
from megatron.core.transformer.mla import MultiLatentAttention
from megatron.core.transformer.mla_rope import mla_cos_sin
from megatron.training.planner.mla_cost import attention_bytes
from tests.activation_memory import cpu_latent_norm_extra, korthikanti, measure, ours
from tests.harness import spawn

S, B, H, A, LAYERS = 64, 2, 64, 4, 2  # a s / h = 4: the s x s term is large, as at long sequences
CPU = dict(mask_bytes=2, stat_bytes=2)
# (backend flag, attention dropout, core accounting)
CORES = [("unfused", 0.1, "unfused"), ("sdpa", 0.0, "sdpa-flash"), ("sdpa", 0.1, "sdpa-math")]
RECOMPUTE = [None, "selective", "full"]


def _measure_all(groups):
    """{(sp, core, recompute): bytes per layer} on this rank."""
    t = groups.tp_size
    out = {}
    for sp in ([False] if t == 1 else [False, True]):
        for (backend, attn_dropout, core), recompute in itertools.product(CORES, RECOMPUTE):
            cfg = TransformerConfig(
                tensor_model_parallel_size=t, sequence_parallel=sp, num_layers=LAYERS, hidden_size=H,
                num_attention_heads=A, seq_length=S, hidden_dropout=0.1, attention_dropout=attn_dropout,
                attention_backend=backend, params_dtype=torch.bfloat16, recompute_granularity=recompute,
                vocab_size=64)
            cfg.resolve().validate()
            model_parallel_seed(1, groups.tp_rank, 0, "cpu")
            block = TransformerBlock(cfg, groups, post_process=False).train()
            x = torch.randn(S // (t if sp else 1), B, H, dtype=torch.bfloat16, requires_grad=True)
            y, saved = measure(lambda: block(x), list(block.parameters()))
            y.float().sum().backward()  # the saved graph is usable (recompute included)
            out[(sp, core, recompute)] = saved / LAYERS
        for q_lora in (None, 12):  # multi-latent attention's module (planner/mla_cost.py)
            out[("mla", sp, q_lora)] = _measure_mla(groups, sp, q_lora)
    return out


def _mla_config(t, sp, q_lora):
    return TransformerConfig(
        tensor_model_parallel_size=t, sequence_parallel=sp, num_layers=LAYERS, hidden_size=H, num_attention_heads=A,
        seq_length=S, attention_dropout=0.1, attention_backend="unfused", params_dtype=torch.bfloat16, vocab_size=64,
        multi_latent_attention=True, q_lora_rank=q_lora, kv_lora_rank=20, qk_head_dim=8, qk_pos_emb_head_dim=4,
        v_head_dim=10, qk_layernorm=True, normalization="RMSNorm", position_embedding_type="rope").resolve()


def _measure_mla(groups, sp, q_lora):
    t = groups.tp_size
    cfg = _mla_config(t, sp, q_lora)
    model_parallel_seed(1, groups.tp_rank, 0, "cpu")
    m = MultiLatentAttention(cfg, groups.tp, device="cpu").train()
    x = torch.randn(S // (t if sp else 1), B, H, generator=torch.Generator().manual_seed(2 + groups.tp_rank),
                    dtype=torch.bfloat16, requires_grad=True)
    rope = mla_cos_sin(cfg, S, x.device, torch.bfloat16)
    y, saved = measure(lambda: m(x, rope), list(m.parameters()) + list(rope))
    y.float().sum().backward()
    return saved


@pytest.fixture(scope="module")
def measured():
    return {1: spawn(1, _measure_all, timeout=300), 2: spawn(2, _measure_all, tp=2, timeout=300)}


CASES = [(t, sp, core, rec) for t, sp in [(1, False), (2, False), (2, True)]
         for (_, _, core), rec in itertools.product(CORES, RECOMPUTE)]


@pytest.mark.parametrize("t,sp,core,recompute", CASES,
                         ids=[f"tp{t}{'-sp' if sp else ''}-{core}-{rec or 'none'}" for t, sp, core, rec in CASES])
def test_saved_bytes_per_layer_match_the_formula(measured, t, sp, core, recompute):
    sbh = S * B * H
    expected = ours(S, B, H, A, t, sp, recompute, core, **CPU)
    paper = korthikanti(S, B, H, A, t, sp, recompute)
    for rank, per_rank in enumerate(measured[t]):
        got = per_rank[(sp, core, recompute)]
        assert abs(got / expected - 1) <= 0.10, (
            f"rank {rank}: measured {got / sbh:.3f} sbh, formula adapted to our layer {expected / sbh:.3f} sbh "
            f"(paper {paper / sbh:.3f} sbh)")


MLA_CASES = [(t, sp, q) for t, sp in [(1, False), (2, False), (2, True)] for q in (None, 12)]


@pytest.mark.parametrize("t,sp,q_lora", MLA_CASES)
def test_mla_saved_bytes_are_the_planners(measured, t, sp, q_lora):
    """Each rank keeps mla_cost.attention_bytes exactly (CPU dropout noise in bf16; the latent norms' CPU
    extras on this rank's tokens: all of them without SP, its shard with SP)."""
    cfg, tokens = _mla_config(t, sp, q_lora), S * B
    want = attention_bytes(cfg, tokens, t, sp, act=2, mask_bytes=2) + tokens / (t if sp else 1) * \
        cpu_latent_norm_extra(cfg, 2)
    for rank, per_rank in enumerate(measured[t]):
        assert per_rank[("mla", sp, q_lora)] == want, rank


def test_recompute_saves_what_the_paper_says(measured):
    """The orderings that make recompute worth it: full << selective < none, TP and SP divide."""
    one, tp2 = measured[1][0], measured[2][0]
    for core in ("unfused", "sdpa-math"):
        assert one[(False, core, "full")] < one[(False, core, "selective")] < one[(False, core, None)]
    assert tp2[(True, "unfused", None)] < tp2[(False, "unfused", None)] < one[(False, "unfused", None)]
    assert tp2[(True, "unfused", "full")] == one[(False, "unfused", "full")] / 2
