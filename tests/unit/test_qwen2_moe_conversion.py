"""HuggingFace Qwen2-MoE <-> ours (shared expert with its sigmoid gate, q/k/v biases, both router
normalisations): the same logits as transformers at one process and at EP2 (2 ranks, each a different
prompt, so tokens cross ranks), the Hub's per-expert layout read as the fused one, and a round trip
through tools/checkpoint/convert.py (HF -> ours -> HF) that gives back every tensor bit for bit."""
import os
import sys

import pytest
import torch

transformers = pytest.importorskip("transformers")

from megatron.core.comm import PlanGroup  # noqa: E402
from megatron.core.config import TransformerConfig  # noqa: E402
from megatron.core.models.families.qwen2_moe import to_ours as qwen2_moe_to_ours  # noqa: E402
from megatron.core.models.gpt import GPTModel  # noqa: E402
from megatron.core.parallel_layout import ParallelLayout  # noqa: E402
from megatron.core.tensor_parallel.param_meta import param_meta  # noqa: E402
from tests.harness import spawn  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROMPTS = [[5, 17, 56, 3, 99, 42, 7, 8], [64, 1, 2, 90, 33, 33, 12, 70]]


def tiny_qwen2_moe(norm_topk_prob=False):
    torch.manual_seed(0)
    cfg = transformers.Qwen2MoeConfig(
        vocab_size=100, hidden_size=32, intermediate_size=40, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24,
        shared_expert_intermediate_size=48, norm_topk_prob=norm_topk_prob, max_position_embeddings=32,
        rope_parameters={"rope_type": "default", "rope_theta": 5000.0})
    model = transformers.Qwen2MoeForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():  # biases and gates non-zero, experts and routing varied
            p.add_(torch.randn_like(p) * 0.05)
    return model


def _ours(args, tensors, groups, ep=1):
    config = TransformerConfig(**args, make_vocab_size_divisible_by=1, expert_model_parallel_size=ep).resolve()
    model = GPTModel(config, groups, device="cpu").eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(tensors[param_meta(p).init_key])
    return model


@pytest.mark.parametrize("norm_topk_prob", [False, True])
def test_qwen2_moe_logits_equal_transformers(norm_topk_prob):
    hf = tiny_qwen2_moe(norm_topk_prob)
    groups = ParallelLayout(1).plan_groups(0)
    ours = _ours(*qwen2_moe_to_ours(hf.config, dict(hf.state_dict())), groups)
    assert ours.config.moe_router_pre_softmax is not norm_topk_prob and ours.config.add_qkv_bias
    ids = torch.tensor(PROMPTS)
    with torch.no_grad():
        diff = (ours(ids)[..., :100] - hf(ids).logits).abs().max()
    print(f"norm_topk_prob {norm_topk_prob}: max |logits - transformers| {diff:.3g}")
    assert diff < 1e-5, diff


def _ep2_logits(groups, args, tensors):
    from megatron.core import parallel_state
    groups = parallel_state.initialize_model_parallel(1, 1, expert_model_parallel_size=2)  # the harness built EP 1
    ours = _ours(args, tensors, groups, ep=2)
    assert sorted(ours.decoder.layers[0].mlp.experts.local_experts) == [str(2 * groups.ep_rank + e) for e in (0, 1)]
    with torch.no_grad():
        return ours(torch.tensor([PROMPTS[groups.ep_rank]]))[0, :, :100]


def test_qwen2_moe_logits_at_ep2_equal_transformers():
    hf = tiny_qwen2_moe()
    ranks = spawn(2, _ep2_logits, *qwen2_moe_to_ours(hf.config, dict(hf.state_dict())))  # no transformers there
    with torch.no_grad():
        want = hf(torch.tensor(PROMPTS)).logits
    diff = max((got - want[r]).abs().max().item() for r, got in enumerate(ranks))
    print(f"EP2: max |logits - transformers| {diff:.3g}")
    assert diff < 1e-5, diff


def test_per_expert_layout_reads_as_fused():
    hf = tiny_qwen2_moe()
    sd = dict(hf.state_dict())
    split = {k: v for k, v in sd.items() if ".mlp.experts." not in k}
    for i in range(2):
        x = f"model.layers.{i}.mlp.experts."
        for e in range(4):
            split[f"{x}{e}.gate_proj.weight"], split[f"{x}{e}.up_proj.weight"] = sd[x + "gate_up_proj"][e].chunk(2)
            split[f"{x}{e}.down_proj.weight"] = sd[x + "down_proj"][e]
    fused, per_expert = qwen2_moe_to_ours(hf.config, sd)[1], qwen2_moe_to_ours(hf.config, split)[1]
    assert fused.keys() == per_expert.keys() and all(torch.equal(fused[k], per_expert[k]) for k in fused)


def test_convert_round_trip_is_bit_exact(tmp_path):
    sys.path.insert(0, os.path.join(REPO, "tools", "checkpoint"))
    import convert
    hf = tiny_qwen2_moe()
    hf.save_pretrained(tmp_path / "hf")
    for loader, saver, src, dst in (("hf", "megatron", "hf", "ours"), ("megatron", "hf", "ours", "back")):
        flags = {"--loader": loader, "--saver": saver, "--load-dir": tmp_path / src, "--save-dir": tmp_path / dst}
        assert convert.main([str(x) for kv in flags.items() for x in kv]) == 0, (loader, saver)
    back_model = transformers.Qwen2MoeForCausalLM.from_pretrained(tmp_path / "back")
    assert back_model.config.norm_topk_prob is False and back_model.config.qkv_bias is True
    back, want = back_model.state_dict(), hf.state_dict()
    assert back.keys() == want.keys() and all(torch.equal(back[k], want[k]) for k in want)


def test_shared_expert_gate_sums_its_grad_over_tp_with_sequence_parallel():
    from megatron.core.transformer.moe.shared_experts import SharedExpertMLP
    kw = dict(num_layers=1, hidden_size=8, num_attention_heads=2, ffn_hidden_size=12, sequence_parallel=True,
              tensor_model_parallel_size=2)
    tp = PlanGroup(2, 0)
    gated = SharedExpertMLP(TransformerConfig(**kw, moe_shared_expert_gate=True), tp, device="meta")
    assert param_meta(gated.gate_weight).sequence_parallel  # each TP rank gates its own tokens
    assert SharedExpertMLP(TransformerConfig(**kw), tp, device="meta").gate_weight is None


def test_hf_savers_refuse_models_their_family_routes_differently():
    from megatron.core.checkpointing import CheckpointError
    from megatron.core.models.families import mixtral, qwen2_moe
    with pytest.raises(CheckpointError, match="--moe-router-pre-softmax"):
        mixtral.to_hf({"num_experts": 4, "moe_router_pre_softmax": True}, {})
    with pytest.raises(CheckpointError, match="--moe-shared-expert-gate"):  # an ungated shared expert
        qwen2_moe.to_hf({"num_experts": 4, "moe_shared_expert_intermediate_size": 8}, {})
