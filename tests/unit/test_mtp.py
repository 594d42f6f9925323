"""Multi-token prediction against a reference written out here (the shifts, the norms and their concat order,
the projection, the shared head, the masks and the loss weight; the transformer layer itself is the tested
TransformerLayer), float64, one process."""
import pytest
import torch
import torch.nn.functional as F

from megatron.core.config import TransformerConfig
from megatron.core.config_checks import validate
from megatron.core.errors import ConfigError
from megatron.core.models.gpt import GPTModel
from megatron.core.parallel_layout import ParallelLayout
from megatron.core.transformer import mtp

DT = torch.float64
B, S, V = 2, 9, 50


def _model(depth, untie=True, **kw):
    args = dict(num_layers=2, hidden_size=16, num_attention_heads=2, seq_length=S, vocab_size=V, params_dtype=DT,
                position_embedding_type="rope", normalization="RMSNorm", swiglu=True, add_bias_linear=False,
                untie_embeddings_and_output_weights=untie, hidden_dropout=0.0, attention_dropout=0.0,
                mtp_num_layers=depth, make_vocab_size_divisible_by=1, norm_fusion=False, apply_rope_fusion=False,
                masked_softmax_fusion=False, attention_backend="unfused")
    config = TransformerConfig(**{**args, **kw}).resolve()
    model = GPTModel(config, ParallelLayout(1).plan_groups(0), device="cpu")
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=DT) * (0.2 if p.ndim > 1 else 1.0) + (p.ndim == 1))
    return model


def _batch():
    g = torch.Generator().manual_seed(8)
    t = torch.randint(0, V, (B, S + 1), generator=g)
    mask = (torch.rand(B, S, generator=g) > 0.2).float()
    return {"tokens": t[:, :-1], "labels": t[:, 1:], "loss_mask": mask}, t


def _rms(x, w, eps=1e-5):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w


def reference(model, t, depth):
    """[(per-token CE [b, s] of depth k, its mask shift)] from the equations: depth k embeds tokens k ahead and
    predicts the token k + 1 ahead."""
    tokens = t[:, :S]
    rope = model.rotary(S, 0, torch.zeros(1, dtype=DT))
    h = model.decoder(model.word_embeddings.weight[tokens.t()], rope)  # the decoder's normed output [s, b, h]
    out = []
    for k in range(1, depth + 1):
        m = model.mtp.layers[k - 1]
        ahead = torch.cat([t[:, k:S], torch.zeros(B, k, dtype=t.dtype)], 1)  # token i + k, zeros past the end
        e = model.word_embeddings.weight[ahead.t()]
        x = torch.cat([_rms(e, m.enorm.weight), _rms(h, m.hnorm.weight)], -1) @ m.eh_proj.weight.T
        h = _rms(m.transformer_layer(x, rope), m.final_layernorm.weight)
        logits = (h @ model.output_layer.weight.T).transpose(0, 1)  # [b, s, V]
        target = torch.cat([t[:, k + 1:], torch.zeros(B, k, dtype=t.dtype)], 1)  # token i + k + 1
        out.append(F.cross_entropy(logits.reshape(-1, V), target.reshape(-1), reduction="none").view(B, S))
    return out


@pytest.mark.parametrize("depth", [1, 2])
def test_mtp_losses_match_the_reference(depth):
    model = _model(depth)
    batch, t = _batch()
    batch = mtp.add_mtp_inputs(batch, depth)
    for k in range(1, depth + 1):  # the masks: the loss mask k ahead, the last k positions out
        want = torch.cat([batch["loss_mask"][:, k:], torch.zeros(B, k)], 1)
        assert torch.equal(batch[f"mtp_{k}_loss_mask"], want)
    loss, losses = model(batch["tokens"], labels=batch["labels"], mtp_inputs=mtp.mtp_inputs(batch, model.config))
    assert loss.shape == (B, S) and len(losses) == depth
    for k, (got, want) in enumerate(zip(losses, reference(model, t, depth)), start=1):
        keep = batch[f"mtp_{k}_loss_mask"].bool()
        # the cross entropy is computed in fp32 (vocab_parallel_cross_entropy): fp32 rounding of the fp64 logits
        torch.testing.assert_close(got[keep].double(), want[keep], rtol=1e-6, atol=1e-6)
    # no MTP inputs (generation, logits): the plain model's result
    assert torch.equal(model(batch["tokens"], labels=batch["labels"]), loss)


def test_mtp_gradient_is_scaled_and_the_logged_value_is_not():
    model = _model(2, untie=False, mtp_loss_scaling_factor=0.3)
    batch, _ = _batch()
    batch = mtp.add_mtp_inputs(batch, 2)
    def run():
        return model(batch["tokens"], labels=batch["labels"], mtp_inputs=mtp.mtp_inputs(batch, model.config))[1]
    losses = run()
    terms = mtp.loss_terms(losses, batch, model.config)
    assert list(terms) == ["mtp_1 loss", "mtp_2 loss"] == list(mtp.loss_declaration(model.config))
    assert all(torch.equal(terms[f"mtp_{k} loss"][0], losses[k - 1]) for k in (1, 2))
    mean = [(v * m).sum() / m.sum() for v, m in terms.values()]
    grads = torch.autograd.grad(sum(mean), model.word_embeddings.weight)[0]
    masks = [batch[f"mtp_{k}_loss_mask"] for k in (1, 2)]
    plain = [(v * m).sum() / m.sum() for v, m in zip(run(), masks)]  # the vocab-parallel CE backs up once
    want = torch.autograd.grad(0.3 / 2 * sum(plain), model.word_embeddings.weight)[0]
    # the same gradient up to fp32 rounding in the cross entropy's backward (a factor 0.15 off would be 85%)
    torch.testing.assert_close(grads, want, rtol=0, atol=1e-5 * want.abs().max().item())


def test_mtp_layer_is_moe_where_the_last_decoder_layer_is():
    c = TransformerConfig(num_layers=3, hidden_size=16, num_attention_heads=2, num_experts=4, vocab_size=V,
                          moe_layer_freq=[0, 0, 1], mtp_num_layers=1, position_embedding_type="rope").resolve()
    assert [c.is_moe_layer(n) for n in (1, 2, 3, 4)] == [False, False, True, True]


@pytest.mark.parametrize("kw,match", [
    (dict(mtp_num_layers=0), "--mtp-num-layers must be a positive integer"),
    (dict(mtp_num_layers=1, position_embedding_type="learned_absolute"), "give --position-embedding-type rope"),
    (dict(mtp_num_layers=1, mtp_loss_scaling_factor=-1.0), "non-negative")])
def test_bad_mtp_settings_are_one_line(kw, match):
    c = TransformerConfig(num_layers=2, hidden_size=16, num_attention_heads=2, vocab_size=V, seq_length=S,
                          **{"position_embedding_type": "rope", **kw}).resolve()
    with pytest.raises(ConfigError, match=match):
        validate(c)


def test_memory_estimate_holds_the_mtp_module_on_the_last_stage():
    """The estimator's last stage: the MTP module's parameters and the input table's copy it embeds with (untied
    output), and one more layer of activations; the first stage unchanged."""
    from megatron.training.config.arguments import parse_args
    from megatron.training.config.resolve import resolve, validate
    from megatron.training.planner import memory
    from megatron.training.planner.predict import PLAN_DEFAULTS
    toy = ["--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "64",
           "--vocab-size", "512", "--global-batch-size", "8", "--micro-batch-size", "2", "--position-embedding-type",
           "rope", "--untie-embeddings-and-output-weights", "--pipeline-model-parallel-size", "2"]
    est = {}
    for extra in ([], ["--mtp-num-layers", "1"]):
        c, t = parse_args(PLAN_DEFAULTS + toy + extra)
        resolve(c, t, 2)
        validate(c, t, 2)
        est[bool(extra)] = [memory.estimate(c, t, 2, r) for r in (0, 1)]
        if extra:
            last = memory.stage_chunks(c, t, 2, 1)[0]
            mtp_params = sum(p.numel() for p in last.mtp.parameters()) + last.word_embeddings.weight.numel()
    assert est[True][0] == est[False][0]
    assert est[True][1]["params"] - est[False][1]["params"] == 4 * mtp_params  # fp32 parameters
    assert (est[True][1]["layers"], est[False][1]["layers"]) == (3, 2)
