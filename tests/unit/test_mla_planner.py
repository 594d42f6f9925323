"""Multi-latent attention and multi-token prediction on paper (training/planner/mla_cost.py, cost.mtp_costs,
traffic.mtp_collectives, flops.py): the saved bytes the estimator counts equal what autograd keeps at one
process (the TP ranks' in tests/distributed/test_activation_memory.py), the estimator's layer is Korthikanti
et al.'s with MLA's terms written out here, and the FLOPs and step time count both."""
import itertools

import pytest
import torch

from megatron.core.comm import PlanGroup
from megatron.core.config import TransformerConfig
from megatron.core.parallel_layout import ParallelLayout
from megatron.core.tensor_parallel.random import model_parallel_seed
from megatron.core.transformer.mla import MultiLatentAttention
from megatron.core.transformer.mla_rope import mla_cos_sin
from megatron.training.observability import flops
from megatron.training.planner import activations, cost, mla_cost
from megatron.training.planner.hardware import gemm_time, make_cluster
from megatron.training.planner.predict import configs, hardware_flops, predict
from tests.activation_memory import cpu_latent_norm_extra, measure

ONE = ParallelLayout(1)  # one rank: the cost functions' layout for a single GPU

S, B, H, N, RKV, RQ = 32, 2, 48, 4, 20, 12
T = S * B


def _config(q_lora=None, ln=False, qk=8, rope=4, v=12, dtype=torch.bfloat16, **kw):
    return TransformerConfig(
        num_layers=2, hidden_size=H, num_attention_heads=N, seq_length=S, vocab_size=32, multi_latent_attention=True,
        q_lora_rank=q_lora, kv_lora_rank=RKV, qk_head_dim=qk, qk_pos_emb_head_dim=rope, v_head_dim=v,
        qk_layernorm=ln, normalization="RMSNorm", position_embedding_type="rope", attention_dropout=0.1,
        params_dtype=dtype, attention_backend="unfused", **kw).resolve()


# (qk, rope, v): v padded to the query head (12 > 12? no: equal, v a view), v shorter (padded), v longer (q padded)
SHAPES = [(8, 4, 12), (8, 4, 6), (8, 4, 16)]


@pytest.mark.parametrize("q_lora,ln,shape,dtype", list(itertools.product(
    [None, RQ], [False, True], SHAPES, [torch.bfloat16, torch.float32])))
def test_saved_bytes_are_what_autograd_keeps(q_lora, ln, shape, dtype):
    c = _config(q_lora, ln, *shape, dtype=dtype)
    model_parallel_seed(1, 0, 0, "cpu")
    m = MultiLatentAttention(c, PlanGroup(1, 0), device="cpu").train()
    x = torch.randn(S, B, H, generator=torch.Generator().manual_seed(0), dtype=dtype, requires_grad=True)
    rope = mla_cos_sin(c, S, x.device, dtype)  # one table per model, shared by the layers: not the layer's
    y, saved = measure(lambda: m(x, rope), list(m.parameters()) + list(rope))
    y.float().sum().backward()
    act = dtype.itemsize
    # written out: input h, latents, q and k at d, v (padded, else the up-projection's output), the projection's
    # input, then softmax output, dropout noise (CPU: act bytes) and dropout output over n heads
    qk, r, v = shape
    d = max(qk + r, v)
    latents = (RQ * (2 if ln else 1) if q_lora else 0) + RKV + r + (RKV if ln else 0)
    heads = 2 * N * d + (N * d if v < d else N * (qk + v)) + N * v
    want = act * T * (H + latents + heads) + 3 * act * N * S * T
    assert mla_cost.attention_bytes(c, T, act=act, mask_bytes=act) == want
    assert saved == want + T * cpu_latent_norm_extra(c, act)


def test_estimator_layer_is_korthikanti_with_mla_terms():
    c = _config(RQ, True, dtype=torch.bfloat16, tensor_model_parallel_size=2, sequence_parallel=True)
    dense = S * B * H * (34 + 5 * N * S / H) / 2  # TP 2 + SP
    d = 12
    latents = 2 * RQ + RKV + 4 + RKV
    heads = 2 * N * d + N * (8 + 12) + N * 12
    delta = 2 * (T / 2 * latents + T * heads / 2) - 2 * 4 * T * H / 2  # MLA's terms for standard Q, K, V, proj
    assert activations.activation_bytes_per_layer(c, B, 2, True) == pytest.approx(dense + delta, rel=1e-12)
    c32 = _config(RQ, True, dtype=torch.float32)
    assert activations.activation_bytes_per_layer(c32, B, 1, False) == pytest.approx(
        2 * (S * B * H * (34 + 5 * N * S / H) + 2 * (T * latents + T * heads) - 2 * 4 * T * H), rel=1e-12)


def test_flops_count_the_latent_core_and_mtp():
    c = _config(RQ, False, qk=8, rope=4, v=6, mtp_num_layers=2)
    assert flops.core_attention_flops_per_token(c) == 2 * S * N * (12 + 6)
    c.recompute_granularity = "selective"
    base = flops.num_floating_point_operations(c, 4)
    assert hardware_flops(c, 4) == base + 4 * S * (2 + 2) * 2 * S * N * 18  # MTP's layers recompute too
    c.recompute_granularity = "full"
    layer = flops.attention_flops_per_token(c) + 2 * H * c.ffn_hidden_size * 2
    assert hardware_flops(c, 4) == base + 4 * S * 2 * layer  # the decoder's 2 layers, not MTP's or the logits


def test_projection_time_is_the_latent_gemms():
    cluster = make_cluster("H100-SXM", 1)
    c = _config(RQ, True, qk=8, rope=4, v=6, tensor_model_parallel_size=2, sequence_parallel=True)
    m = S * B
    want = (gemm_time(cluster, m // 2, RQ, H) + gemm_time(cluster, m, N * 12 // 2, RQ)  # down on the SP shard
            + gemm_time(cluster, m // 2, RKV + 4, H) + gemm_time(cluster, m, N * (8 + 6) // 2, RKV)
            + gemm_time(cluster, m, H, N * 6 // 2))
    assert mla_cost.projection_time(c, m, cluster, 2) == want
    assert mla_cost.core_head_dim(c) == 12


MLA = ["--num-layers", "4", "--hidden-size", "512", "--num-attention-heads", "8", "--seq-length", "1024",
       "--max-position-embeddings", "1024", "--micro-batch-size", "1", "--global-batch-size", "8",
       "--vocab-size", "32000", "--bf16", "--multi-latent-attention", "--kv-lora-rank", "128",
       "--qk-head-dim", "64", "--qk-pos-emb-head-dim", "32", "--v-head-dim", "64", "--position-embedding-type",
       "rope"]


def test_step_time_and_memory_count_the_latents_and_mtp():
    cluster = make_cluster("H100-SXM", 1)
    base = predict(MLA, cluster)
    wider = predict(MLA + ["--kv-lora-rank", "512"], cluster)
    mtp = predict(MLA + ["--mtp-num-layers", "2"], cluster)
    assert wider.step.layer_forward > base.step.layer_forward and wider.memory_bytes > base.memory_bytes
    assert mtp.memory_bytes > base.memory_bytes
    # one process, 8 microbatches: the step grows by 8 x the two MTP modules' forward + backward, each a layer,
    # the 2h -> h projection, the embedding and the head
    c = _config(v=12, mtp_num_layers=2)
    layer, head, emb = cost.layer_costs(c, B, cluster, ONE), cost.head_costs(c, B, cluster, ONE), \
        cost.embedding_costs(c, B, cluster, ONE)
    g = gemm_time(cluster, T, H, 2 * H)
    got = cost.mtp_costs(c, B, cluster, ONE, layer, head, emb)
    assert got.forward == pytest.approx(2 * (layer.forward + head.forward + emb.forward + g), rel=1e-12)
    assert got.backward == pytest.approx(2 * (layer.backward + head.backward + emb.backward + 2 * g), rel=1e-12)
    cm, _ = configs(MLA + ["--mtp-num-layers", "2"], 1)
    big = [f(cm, 1, cluster, ONE) for f in (cost.layer_costs, cost.head_costs, cost.embedding_costs)]
    extra = cost.mtp_costs(cm, 1, cluster, ONE, *big)
    assert mtp.step.pipeline - base.step.pipeline == pytest.approx(8 * (extra.forward + extra.backward), rel=1e-9)


def test_full_recompute_leaves_mtp_layers_whole():
    c = _config(mtp_num_layers=1, recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
    whole = activations.activation_bytes_per_layer(c, B, 1, False)
    kept, working = activations.kept_activation_bytes(c, B, 1, 3, mtp_layers=1)
    assert (kept, working) == (2 * S * B * H * 2 + int(whole), int(whole))  # 2 decoder inputs kept, MTP's whole
