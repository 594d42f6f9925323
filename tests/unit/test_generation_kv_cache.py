"""Generation with the KV cache equals recomputing the whole sequence, for every GPT the trainer builds.

One process, no process group: one rank's stand-in groups (ParallelLayout.plan_groups) make every TP
collective the identity. Tiny fp32 models with random weights (std 0.3, so that the greedy
tokens depend on the input and a wrong cache would change them)."""
import pytest
import torch

from megatron.core.config import TransformerConfig
from megatron.core.inference.generation import forward_with_cache, generate
from megatron.core.models.bert import BertModel
from megatron.core.models.gpt import GPTModel
from megatron.core.parallel_layout import ParallelLayout
from megatron.core.tensor_parallel.initialization import initialize_parameters
from megatron.core.transformer.kv_cache import KVCache

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
}


def _groups():
    return ParallelLayout(1).plan_groups(0)


def _config(**variant):
    cfg = TransformerConfig(num_layers=2, hidden_size=32, num_attention_heads=4, seq_length=16, vocab_size=VOCAB,
                            make_vocab_size_divisible_by=8, hidden_dropout=0.0, attention_dropout=0.0,
                            init_method_std=0.3, **variant)
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


def _prompt():
    return torch.randint(0, VOCAB, (B, PROMPT), generator=torch.Generator().manual_seed(7))


@pytest.mark.parametrize("name", VARIANTS)
def test_cached_greedy_equals_recomputed(name):
    model = _model(**VARIANTS[name])
    ids = _prompt()
    recomputed = ids
    for _ in range(NEW):
        nxt = _full_logits(model, recomputed)[:, -1].argmax(dim=-1)
        recomputed = torch.cat([recomputed, nxt[:, None]], dim=1)
    assert generate(model, ids, NEW).tolist() == recomputed.tolist()
    assert len(set(recomputed[:, PROMPT:].flatten().tolist())) > 1  # the check can fail: tokens vary

    cache, step = KVCache(), ids
    for end in range(PROMPT, PROMPT + NEW + 1):
        cached = forward_with_cache(model, step, cache)[:, -1]
        torch.testing.assert_close(cached, _full_logits(model, recomputed[:, :end])[:, -1], rtol=1e-5, atol=1e-5)
        assert cache.seq_len == end
        step = recomputed[:, end:end + 1]


@pytest.mark.parametrize("name", ["gpt", "llama", "gqa-unfused"])
def test_prompt_in_pieces(name):
    """Several tokens after a filled cache: the causal mask is no longer square."""
    model = _model(**VARIANTS[name])
    ids = torch.randint(0, VOCAB, (B, 9), generator=torch.Generator().manual_seed(3))
    cache = KVCache()
    pieces = [forward_with_cache(model, ids[:, a:b], cache) for a, b in ((0, 4), (4, 5), (5, 9))]
    torch.testing.assert_close(torch.cat(pieces, dim=1), _full_logits(model, ids), rtol=1e-5, atol=1e-5)


def test_bert_is_refused():
    with pytest.raises(TypeError, match="GPTModel"):
        generate(_model(BertModel), _prompt(), NEW)
