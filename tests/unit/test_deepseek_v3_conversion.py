"""HuggingFace DeepSeek-V3 <-> ours: the same logits as transformers' DeepseekV3ForCausalLM (fp32, random tiny
configs: with and without query compression, YaRN and plain RoPE, group-limited routing with an expert bias,
dense first layers, shared experts), a round trip through tools/checkpoint/convert.py that gives back every
tensor bit for bit, and one-line refusals for what one side cannot hold."""
import pytest
import torch

transformers = pytest.importorskip("transformers")

from megatron.core.checkpointing.hf_deepseek_v3 import deepseek_v3_to_ours, ours_to_deepseek_v3  # noqa: E402
from megatron.core.checkpointing.pieces import CheckpointError  # noqa: E402
from megatron.core.config import TransformerConfig  # noqa: E402
from megatron.core.models.gpt import GPTModel  # noqa: E402
from megatron.core.parallel_layout import ParallelLayout  # noqa: E402
from megatron.core.tensor_parallel.param_meta import param_meta  # noqa: E402
from tests.hf_round_trip import round_trip  # noqa: E402

YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8, "beta_fast": 32, "beta_slow": 1,
        "mscale": 1.0, "mscale_all_dim": 1.0, "rope_theta": 10000.0}


def tiny(q_lora_rank=12, rope=YARN, seed=0, **kw):
    torch.manual_seed(seed)
    args = dict(vocab_size=100, hidden_size=32, intermediate_size=48, moe_intermediate_size=16, num_hidden_layers=3,
                num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1, n_routed_experts=8,
                routed_scaling_factor=2.5, kv_lora_rank=10, q_lora_rank=q_lora_rank, qk_rope_head_dim=4,
                v_head_dim=6, qk_nope_head_dim=8, n_group=4, topk_group=2, num_experts_per_tok=4,
                first_k_dense_replace=1, max_position_embeddings=32, rope_parameters=dict(rope),
                tie_word_embeddings=False)
    model = transformers.DeepseekV3ForCausalLM(transformers.DeepseekV3Config(**{**args, **kw})).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(torch.randn_like(b) * 0.05)  # the expert bias moves the choice
    return model


def ours_from(hf):
    args, tensors = deepseek_v3_to_ours(hf.config, dict(hf.state_dict()))
    config = TransformerConfig(**args, make_vocab_size_divisible_by=1).resolve()
    config.validate()
    model = GPTModel(config, ParallelLayout(1).plan_groups(0), device="cpu").eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(tensors[param_meta(p).init_key])
        for name, b in model.named_buffers():
            if name.endswith("expert_bias"):
                b.copy_(tensors[name])
    return model


@pytest.mark.parametrize("kw", [{}, {"q_lora_rank": None}, {"rope": {"rope_type": "default", "rope_theta": 5000.0}},
                                {"n_group": 1, "topk_group": 1, "tie_word_embeddings": True}],
                         ids=["q-lora-yarn", "q-direct", "plain-rope", "no-groups-tied"])
def test_logits_equal_transformers(kw):
    hf = tiny(**kw)
    ours = ours_from(hf)
    ids = torch.tensor([[5, 17, 56, 3, 99, 42, 7, 8, 11, 64, 2, 33], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]])
    with torch.no_grad():
        got, want = ours(ids)[..., :100], hf(ids).logits
    rel = ((got - want).abs().max() / want.abs().max()).item()
    assert rel <= 1e-5, rel


def test_convert_round_trip_is_bit_exact_with_the_expert_bias(tmp_path):
    back, want = round_trip(tmp_path, tiny(), transformers.DeepseekV3ForCausalLM)
    assert back.keys() == want.keys()
    assert all(torch.equal(back[k], want[k]) for k in want), [k for k in want if not torch.equal(back[k], want[k])]
    assert back["model.layers.1.mlp.gate.e_score_correction_bias"].abs().min() > 0


@pytest.mark.parametrize("kw,match", [
    ({"n_group": 2, "topk_group": 1}, "top-2 scores"),
    ({"norm_topk_prob": False}, "norm_topk_prob"),
    ({"rms_norm_eps": 1e-5}, "latent norms"),
    ({"rope_interleave": False}, "rope_interleave")])
def test_what_ours_cannot_hold_is_refused_in_one_line(kw, match):
    hf = tiny(**kw)
    with pytest.raises(CheckpointError, match=match) as e:
        deepseek_v3_to_ours(hf.config, dict(hf.state_dict()))
    assert "\n" not in str(e.value)


def test_what_hf_cannot_hold_is_refused_in_one_line():
    hf = tiny()
    args, tensors = deepseek_v3_to_ours(hf.config, dict(hf.state_dict()))
    bias = {k: tensors.pop(k) for k in [k for k in tensors if k.endswith("expert_bias")]}
    for change, match in ((dict(mtp_num_layers=1), "multi-token prediction"),
                          (dict(moe_layer_freq=[1, 0, 1]), "dense layers first"),
                          (dict(moe_router_group_topk=1), "top-2 scores")):
        with pytest.raises(CheckpointError, match=match) as e:
            ours_to_deepseek_v3(dict(args, **change), tensors, dict(bias))
        assert "\n" not in str(e.value)
