"""Packed documents without a mask (transformer/documents.py, fusions/document_attention.py), one process:
the document path's loss and every gradient equal the dense-mask path's (fp32) for GPT, Llama-style (RoPE
per document, GQA) and MLA; no logit of one document depends on another; the document facts by hand."""
import pytest
import torch

from megatron.core.config import TransformerConfig
from megatron.core.datasets.gpt_masks import EodOptions, ltor_masks
from megatron.core.fusions import document_attention
from megatron.core.models.gpt import GPTModel
from megatron.core.parallel_layout import ParallelLayout
from megatron.core.tensor_parallel.random import model_parallel_seed
from megatron.core.transformer.documents import Documents
from tests.rounding import assert_chain_close

EOD, S, V = 0, 32, 50
MODELS = {
    "gpt": dict(),
    "llama": dict(position_embedding_type="rope", normalization="RMSNorm", swiglu=True, num_query_groups=2,
                  add_bias_linear=False),
    "mla": dict(multi_latent_attention=True, q_lora_rank=12, kv_lora_rank=10, qk_head_dim=8, qk_pos_emb_head_dim=4,
                v_head_dim=6, normalization="RMSNorm", position_embedding_type="rope", add_bias_linear=False),
}
# fp32: each tensor's largest difference over the largest gradient of the model (relative to its own
# magnitude, a norm weight's gradient, a sum that cancels, shows rounding near 1e-6 already); fp64: each
# tensor within tests/rounding.py's chain bound of its own magnitude
REL = 1e-6


def _tokens():
    """Two samples: documents of lengths 5, 1, 9, 5, 1, 11 (repeated lengths share one attention call) and
    7, 25 (a document running to the end without its EOD)."""
    g = torch.Generator().manual_seed(3)
    t = torch.randint(1, V, (2, S), generator=g)
    for i, ends in enumerate(([4, 5, 14, 19, 20], [6])):
        t[i, ends] = EOD
    return t


def _model(kind, backend="auto", dtype=torch.float32, **extra):
    c = TransformerConfig(num_layers=2, hidden_size=32, num_attention_heads=4, seq_length=S, vocab_size=V,
                          hidden_dropout=0.0, attention_dropout=0.0, attention_backend=backend, params_dtype=dtype,
                          **MODELS[kind], **extra)
    c.resolve()
    c.validate()
    model_parallel_seed(5, 0, 0, "cpu")
    model = GPTModel(c, ParallelLayout(1).plan_groups(0), device="cpu")
    g = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=dtype) * 0.1 + (1.0 if p.ndim == 1 else 0.0))
    return model


def _batch(tokens):
    _, positions, segments = ltor_masks(tokens, EodOptions(EOD, reset_position_ids=True, reset_attention_mask=True))
    return positions, Documents(segments)


def _loss_and_grads(model, tokens, mask, positions):
    model.zero_grad()
    labels = torch.roll(tokens, -1, 1)
    loss = model(tokens, labels=labels, position_ids=positions, attention_mask=mask).mean()
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def _rel(a, b):
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_document_path_equals_dense_mask(kind):
    model, tokens = _model(kind), _tokens()
    positions, docs = _batch(tokens)
    assert model.decoder.layers[0].self_attention.core_attention.documents_impl == "segmented"
    loss, grads = _loss_and_grads(model, tokens, docs, positions)
    dense_loss, dense_grads = _loss_and_grads(model, tokens, docs.dense_mask(), positions)
    assert _rel(loss, dense_loss) <= REL, f"loss {loss.item()} vs {dense_loss.item()}"
    scale = max(g.abs().max().item() for g in dense_grads.values())
    worst = max(((grads[n] - dense_grads[n]).abs().max().item() / scale, n) for n in grads)
    print(f"{kind}: loss relative {_rel(loss, dense_loss):.2e}, worst gradient {worst[1]} relative {worst[0]:.2e}")
    assert worst[0] <= REL, f"gradient of {worst[1]}: relative {worst[0]:.2e}"
    model64 = _model(kind, dtype=torch.float64)
    _, grads64 = _loss_and_grads(model64, tokens, docs, positions)  # (the loss itself is fp32: cross entropy)
    _, dense_grads64 = _loss_and_grads(model64, tokens, docs.dense_mask(), positions)
    for n in grads64:
        assert_chain_close(grads64[n], dense_grads64[n], n)
    # the documents change the function: the plain causal model sees across them
    assert _rel(loss, _loss_and_grads(model, tokens, None, positions)[0]) > 1e-4


@pytest.mark.parametrize("kind", ["llama", "mla"])
def test_no_document_sees_another(kind):
    model, tokens = _model(kind).eval(), _tokens()
    positions, docs = _batch(tokens)
    changed = tokens.clone()
    changed[0, 6:14] = (tokens[0, 6:14] % (V - 2)) + 1 + (tokens[0, 6:14] % (V - 2) + 1 == tokens[0, 6:14])
    assert (changed[0, 6:14] != tokens[0, 6:14]).all() and (changed[0, 6:14] != EOD).all()
    with torch.no_grad():
        before = model(tokens, position_ids=positions, attention_mask=docs)
        after = model(changed, position_ids=positions, attention_mask=Documents(docs.segment_ids))
    inside = torch.zeros(2, S, dtype=torch.bool)
    inside[0, 6:15] = True  # document A: positions 6..14 (its EOD at 14 ends it)
    scale = before.abs().max().item()
    leak = (after - before).abs()[~inside].max().item()
    assert leak <= 1e-6 * scale, f"a logit outside the changed document moved by {leak:.3g}"
    assert (after - before).abs()[inside].max().item() > 1e-3 * scale  # the document itself did change


def test_unfused_backend_takes_the_dense_mask_and_agrees():
    model, tokens = _model("gpt", backend="unfused"), _tokens()
    positions, docs = _batch(tokens)
    assert model.decoder.layers[0].self_attention.core_attention.documents_impl == "dense"
    loss, _ = _loss_and_grads(model, tokens, docs, positions)
    ref, _ = _loss_and_grads(_model("gpt"), tokens, docs, positions)
    assert _rel(loss, ref) <= REL


@pytest.mark.parametrize("recompute", [dict(recompute_granularity="selective"),
                                       dict(recompute_granularity="full", recompute_method="uniform",
                                            recompute_num_layers=1)])
def test_recompute_replays_the_documents(recompute):
    # the same ops in the same order (the documents object rides along into the recomputed call): bitwise
    tokens = _tokens()
    positions, docs = _batch(tokens)
    loss, grads = _loss_and_grads(_model("llama"), tokens, docs, positions)
    again, again_grads = _loss_and_grads(_model("llama", **recompute).train(), tokens, docs, positions)
    assert torch.equal(loss, again) and all(torch.equal(grads[n], again_grads[n]) for n in grads)


def test_documents_by_hand():
    docs = Documents(ltor_masks(_tokens(), EodOptions(EOD, reset_attention_mask=True))[2])
    assert docs.lengths == [5, 1, 9, 5, 1, 11, 7, 25]
    groups = {n: starts.tolist() for n, starts in docs.by_length}
    assert groups == {1: [5, 20], 5: [0, 15], 7: [32], 9: [6], 11: [21], 25: [39]}
    assert docs.cu_seqlens.tolist() == [0, 5, 6, 15, 20, 21, 32, 39, 64] and docs.max_length == 25
    # two samples whose ids are equal across the boundary are still two documents
    assert Documents(torch.zeros(2, 4, dtype=torch.long)).lengths == [4, 4]


def test_implementation_choice():
    assert document_attention.select("unfused", "cpu", torch.float32) == "dense"
    assert document_attention.select("sdpa", "cpu", torch.bfloat16) == "segmented"
    assert document_attention.select("auto", "cuda", torch.float32) == "segmented"


def test_flops_document_masking_removes():
    from megatron.training.observability.flops import (
        core_attention_flops_per_token,
        document_attention_flops_removed,
        document_attention_share,
    )
    assert document_attention_share([S], S) == 1.0  # one document: the full square Megatron-LM counts
    assert document_attention_share([S // 2, S // 2, S], S) == pytest.approx(0.75)  # (1/4 + 1/4 + 1) / 2
    c = _model("gpt").config
    removed = document_attention_flops_removed(c, [S // 4] * 4)
    assert removed == pytest.approx(3 * S * c.num_layers * core_attention_flops_per_token(c) * 0.75)
