"""HuggingFace Qwen3 <-> ours beyond tests/functional/test_conversion.py's untied TP1 / TP2 case: a tied model's
logits at one process, the tied copy HF files may hold, and one line for what either side cannot hold."""
import pytest
import torch

transformers = pytest.importorskip("transformers")

from megatron.core.checkpointing import CheckpointError  # noqa: E402
from megatron.core.config import TransformerConfig  # noqa: E402
from megatron.core.models.families import qwen3  # noqa: E402
from megatron.core.models.gpt import GPTModel  # noqa: E402
from megatron.core.parallel_layout import ParallelLayout  # noqa: E402
from megatron.core.tensor_parallel.param_meta import param_meta  # noqa: E402


def tiny(**kw):
    torch.manual_seed(0)
    cfg = transformers.Qwen3Config(**{**dict(vocab_size=100, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                             num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                             max_position_embeddings=32, tie_word_embeddings=True), **kw})
    model = transformers.Qwen3ForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


def test_tied_qwen3_logits_equal_transformers():
    hf = tiny()
    args, tensors = qwen3.to_ours(hf.config, dict(hf.state_dict()))  # lm_head.weight: the tied copy, checked equal
    assert args["qk_layernorm"] and not args["untie_embeddings_and_output_weights"] and args["kv_channels"] == 16
    config = TransformerConfig(**args, make_vocab_size_divisible_by=1).resolve()
    ours = GPTModel(config, ParallelLayout(1).plan_groups(0), device="cpu").eval()
    with torch.no_grad():
        for p in ours.parameters():
            p.copy_(tensors[param_meta(p).init_key])
        ids = torch.tensor([[5, 17, 56, 3, 99, 42, 7, 8]])
        diff = (ours(ids)[..., :100] - hf(ids).logits).abs().max()
    assert diff < 1e-5, diff
    cfg, sd = qwen3.to_hf(args, tensors)
    assert sd.keys() == hf.state_dict().keys() and all(torch.equal(sd[k], hf.state_dict()[k]) for k in sd)


@pytest.mark.parametrize("kw,match", [({"attention_bias": True}, "attention_bias"),
                                      ({"use_sliding_window": True, "max_window_layers": 1}, "sliding-window")])
def test_what_ours_cannot_hold_is_refused_in_one_line(kw, match):
    hf = tiny(**kw)
    with pytest.raises(CheckpointError, match=match) as e:
        qwen3.to_ours(hf.config, dict(hf.state_dict()))
    assert "\n" not in str(e.value)


def test_what_hf_cannot_hold_is_refused_in_one_line():
    hf = tiny()
    args, tensors = qwen3.to_ours(hf.config, dict(hf.state_dict()))
    for change, match in ((dict(add_bias_linear=True), "linear biases"), (dict(add_qkv_bias=True), "linear biases"),
                          (dict(normalization="LayerNorm"), "LayerNorm with SwiGLU"),
                          (dict(position_embedding_type="learned_absolute"), "learned absolute positions")):
        with pytest.raises(CheckpointError, match=match) as e:
            qwen3.to_hf(dict(args, **change), tensors)
        assert "\n" not in str(e.value) and "HF Qwen3 holds" in str(e.value)
    del tensors["decoder.layers.1.self_attention.k_layernorm.weight"]
    with pytest.raises(CheckpointError, match="k_layernorm"):
        qwen3.to_hf(args, tensors)
