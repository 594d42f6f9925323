"""HuggingFace Mixtral <-> ours: the same logits as transformers at one process, and a round trip
through tools/checkpoint/convert.py (HF -> ours -> HF) that gives back every tensor bit for bit."""
import pytest
import torch

transformers = pytest.importorskip("transformers")

from megatron.core.config import TransformerConfig  # noqa: E402
from megatron.core.models.families.mixtral import to_ours as mixtral_to_ours  # noqa: E402
from megatron.core.models.gpt import GPTModel  # noqa: E402
from megatron.core.parallel_layout import ParallelLayout  # noqa: E402
from megatron.core.tensor_parallel.param_meta import param_meta  # noqa: E402
from tests.hf_round_trip import round_trip  # noqa: E402


def tiny_mixtral():
    torch.manual_seed(0)
    cfg = transformers.MixtralConfig(vocab_size=100, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                                     num_experts_per_tok=2, max_position_embeddings=32, tie_word_embeddings=False,
                                     rope_theta=5000.0)
    model = transformers.MixtralForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


def test_mixtral_logits_equal_transformers():
    hf = tiny_mixtral()
    args, tensors = mixtral_to_ours(hf.config, dict(hf.state_dict()))
    config = TransformerConfig(**args, make_vocab_size_divisible_by=1).resolve()
    groups = ParallelLayout(1).plan_groups(0)
    ours = GPTModel(config, groups, device="cpu").eval()
    with torch.no_grad():
        for p in ours.parameters():
            p.copy_(tensors[param_meta(p).init_key])
        ids = torch.tensor([[5, 17, 56, 3, 99, 42, 7, 8]])
        diff = (ours(ids)[..., :100] - hf(ids).logits).abs().max()
    assert diff < 1e-5, diff


def test_convert_round_trip_is_bit_exact(tmp_path):
    back, want = round_trip(tmp_path, tiny_mixtral(), transformers.MixtralForCausalLM)
    assert back.keys() == want.keys()
    assert all(torch.equal(back[k], want[k]) for k in want)
