"""Model FLOPs (flops.py) and the MFU peak table (docs/mfu.md)."""

import pytest
import torch

from megatron.core.config import TransformerConfig
from megatron.training.config.logging_flags import LoggingOptions
from megatron.training.observability import flops, log


def _gpt(**kw):
    cfg = TransformerConfig(**{**dict(num_layers=3, hidden_size=64, num_attention_heads=4, seq_length=32,
                                      vocab_size=500, make_vocab_size_divisible_by=128), **kw})
    cfg.validate()
    return cfg


def test_standard_gpt_is_korthikantis_72_B_L_s_h2():
    for L, h, a, s, V, B in [(24, 1024, 16, 2048, 51200, 8), (3, 64, 4, 32, 512, 2), (96, 12288, 96, 2048, 51200, 1)]:
        cfg = _gpt(num_layers=L, hidden_size=h, num_attention_heads=a, seq_length=s, vocab_size=V)
        assert cfg.padded_vocab_size == V  # multiples of 128: the formula's V is the padded one
        expected = 72 * B * L * s * h ** 2 * (1 + s / (6 * h) + V / (12 * h * L))
        assert flops.num_floating_point_operations(cfg, B) == pytest.approx(expected, rel=1e-12)


def test_gqa_swiglu_and_untied_heads():
    base = _gpt()
    B, s, h, L = 2, base.seq_length, base.hidden_size, base.num_layers
    f0 = flops.num_floating_point_operations(base, B)
    # GQA: K and V projections shrink from h to g d columns each
    gqa = _gpt(group_query_attention=True, num_query_groups=1)
    kv_saved = 3 * B * s * L * 2 * h * 2 * (h - gqa.kv_channels)
    assert f0 - flops.num_floating_point_operations(gqa, B) == kv_saved
    # SwiGLU: three h x f matrices instead of two
    sw = _gpt(swiglu=True, ffn_hidden_size=4 * h)
    assert flops.num_floating_point_operations(sw, B) - f0 == 3 * B * s * L * 2 * h * 4 * h
    # an untied output layer does the same product as the tied one
    assert flops.num_floating_point_operations(_gpt(untie_embeddings_and_output_weights=True), B) == f0


def test_multi_latent_attention_and_mtp_counted_term_by_term():
    h, n, s, V = 64, 4, 32, 512
    mla = dict(multi_latent_attention=True, position_embedding_type="rope", q_lora_rank=24, kv_lora_rank=16,
               qk_head_dim=16, qk_pos_emb_head_dim=8, v_head_dim=12, vocab_size=V, make_vocab_size_divisible_by=128)
    cfg = _gpt(**mla)
    dq, dv = 24, 12
    attention = (2 * h * 24 + 2 * 24 * n * dq + 2 * h * (16 + 8) + 2 * 16 * n * (16 + dv)
                 + 2 * s * n * dq + 2 * s * n * dv + 2 * n * dv * h)
    assert flops.attention_flops_per_token(cfg) == attention
    layer = attention + 2 * h * cfg.ffn_hidden_size * 2
    assert flops.num_floating_point_operations(cfg, 2) == 3 * 2 * s * (3 * layer + 2 * h * V)
    direct = _gpt(**dict(mla, q_lora_rank=None))  # no query compression: one h x n dq projection
    assert flops.attention_flops_per_token(cfg) - flops.attention_flops_per_token(direct) == \
        2 * h * 24 + 2 * 24 * n * dq - 2 * h * n * dq
    # each MTP module: one more layer, its 2h -> h projection and the logits again
    mtp = _gpt(**dict(mla, mtp_num_layers=2))
    assert flops.num_floating_point_operations(mtp, 2) - flops.num_floating_point_operations(cfg, 2) == \
        3 * 2 * s * 2 * (layer + 2 * 2 * h * h + 2 * h * V)
    # an MoE last layer makes the MTP layer MoE too: its MLP replaced by the active experts
    moe = dict(num_experts=4, moe_router_topk=2, moe_ffn_hidden_size=32, moe_layer_freq=[0, 0, 1])
    per_moe = 2 * h * 4 + 2 * h * 2 * 2 * 32 - 2 * h * cfg.ffn_hidden_size * 2
    assert flops.num_floating_point_operations(_gpt(**dict(mla, mtp_num_layers=2, **moe)), 2) - \
        flops.num_floating_point_operations(mtp, 2) == 3 * 2 * s * 3 * per_moe


@pytest.mark.parametrize("name,precision,expected", [
    ("NVIDIA H100 80GB HBM3", "bf16", ("H100 SXM", 989)),
    ("NVIDIA H100 PCIe", "bf16", ("H100 PCIe", 756)),
    ("NVIDIA H100 NVL", "bf16", ("H100 NVL", 835)),
    ("NVIDIA H200", "bf16", ("H200", 989)),
    ("NVIDIA GH200 480GB", "bf16", ("GH200", 989)),
    ("NVIDIA A100-SXM4-80GB", "bf16", ("A100", 312)),
    ("NVIDIA A100-PCIE-40GB", "tf32", ("A100", 156)),
    ("NVIDIA H100 80GB HBM3", "fp32", ("H100 SXM", 67)),
    ("NVIDIA L4", "bf16", ("L4", 121)),
    ("NVIDIA L40S", "bf16", ("L40S", 362)),
    ("NVIDIA L40", "bf16", None),        # not L4, not L40S: unknown
    ("NVIDIA A10", "bf16", None),        # not an A100
    ("Tesla V100-SXM2-32GB", "bf16", None),
    ("NVIDIA H100 NVL", "fp32", None),   # a precision without a datasheet entry here
    ("NVIDIA H100 80GB HBM3", "fp8", ("H100 SXM", 1979)),  # twice bf16 (issue 28)
    ("NVIDIA H200", "fp8", ("H200", 1979)),
    ("NVIDIA A100-SXM4-80GB", "fp8", None),  # no FP8 tensor cores
])
def test_peak_table(name, precision, expected):
    assert flops.lookup_peak(name, precision) == expected


def test_fp8_peak_is_named_with_what_stays_in_bf16(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: "NVIDIA H100 80GB HBM3")
    desc, peak = flops.peak_tflops_per_gpu(torch.device("cuda", 0), torch.bfloat16, fp8=True)
    assert peak == 1979.0 and desc == ("H100 SXM fp8 dense peak 1979 TFLOP/s (datasheet; attention and output "
                                       "layer in bf16)")
    assert flops.peak_tflops_per_gpu(torch.device("cuda", 0), torch.bfloat16)[1] == 989.0


def test_no_mfu_on_cpu():
    assert flops.peak_tflops_per_gpu(torch.device("cpu"), torch.bfloat16) is None
    assert flops.matmul_precision(torch.bfloat16) == flops.matmul_precision(torch.float16) == "bf16"


def test_log_line_has_mfu_only_with_a_peak(monkeypatch, capsys):
    monkeypatch.setattr(log, "is_logging_rank", lambda: True)
    lines = {}
    for peak, throughput in ((None, True), (100.0, True), (100.0, False)):
        logger = log.TrainingLogger(10, peak_tflops=peak, options=LoggingOptions(log_throughput=throughput))
        logger.add_iteration({"lm loss": (torch.tensor(2.0), torch.tensor(1.0))}, torch.tensor(1.0), True)
        logger.log(1, 8, 1e-3, 8, flops_per_iter=1e12, world_size=1)
        lines[peak, throughput] = capsys.readouterr().out
    assert "MFU" not in lines[None, True] and "TFLOP/s/GPU" in lines[None, True]
    # Megatron-LM's --log-throughput: without it, neither the throughput nor (ours) the MFU
    assert "TFLOP/s/GPU" not in lines[100.0, False] and "MFU" not in lines[100.0, False]
    lines[100.0] = lines[100.0, True]
    tflops = float(lines[100.0].split("(TFLOP/s/GPU): ")[1].split(" ")[0])
    mfu = float(lines[100.0].split("MFU: ")[1].split("%")[0])
    assert mfu == pytest.approx(tflops, abs=0.06)  # TFLOP/s / 100 TFLOP/s peak, in percent
