"""Sliding windows (--window-size, --window-attn-skip-freq) and the off-by-one sink (--softmax-type) in
CoreAttention, with and without packed documents, against dense-mask attention written out here (fp32)."""
import pytest
import torch

from megatron.core.config import TransformerConfig
from megatron.core.errors import ConfigError
from megatron.core.transformer.core_attention import CoreAttention
from megatron.core.transformer.documents import Documents
from megatron.core.transformer.window_config import window_tuple

S, B, HEADS, GROUPS, D = 24, 2, 4, 2, 8


def _config(**kw):
    c = TransformerConfig(num_layers=4, hidden_size=HEADS * D, num_attention_heads=HEADS, seq_length=S,
                          vocab_size=32, attention_dropout=0.0, group_query_attention=True, num_query_groups=GROUPS,
                          **kw)
    c.resolve()
    c.validate()
    return c


def _reference(q, k, v, segments, window, sink):
    """[s, b, h, d] -> [s, b, h x d]: explicit scores, the mask (causal, same document, within the window)
    and the sink column, written out."""
    k, v = (t.repeat_interleave(HEADS // GROUPS, dim=2) for t in (k, v))
    scores = torch.einsum("sbhd,tbhd->bhst", q, k) / D ** 0.5
    i, j = torch.arange(S)[:, None], torch.arange(S)[None, :]
    allowed = (j <= i) & (segments[:, None, :, None] == segments[:, None, None, :])
    if window is not None:
        allowed = allowed & (i - j <= window)
    scores = scores.masked_fill(~allowed, float("-inf"))
    if sink is not None:
        scores = torch.cat([scores, torch.full(scores.shape[:-1] + (1,), sink)], dim=-1)
    probs = scores.softmax(-1)[..., :S]
    return torch.einsum("bhst,tbhd->sbhd", probs, v).reshape(S, B, HEADS * D)


SEGMENTS = torch.tensor([[0] * 3 + [1] * 13 + [2] * 8, [0] * S])


@pytest.mark.parametrize("window", [None, 2, 5, 40])  # 40: longer than every document
@pytest.mark.parametrize("softmax_type", ["vanilla", "off-by-one"])
@pytest.mark.parametrize("documents", [False, True])
def test_window_and_sink_equal_the_dense_reference(window, softmax_type, documents):
    if window is None and softmax_type == "vanilla":
        pytest.skip("neither: the document / causal paths (test_packed_documents.py)")
    c = _config(window_size=None if window is None else (window, 0), softmax_type=softmax_type)
    attn = CoreAttention(c, layer_number=1)
    g = torch.Generator().manual_seed(9)
    q, k, v = (torch.randn(S, B, n, D, generator=g).requires_grad_() for n in (HEADS, GROUPS, GROUPS))
    dout = torch.randn(S, B, HEADS * D, generator=g)
    segments = SEGMENTS if documents else torch.zeros(B, S, dtype=torch.long)
    out = attn(q, k, v, Documents(segments) if documents else None)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    ref = _reference(q, k, v, segments, window, 0.0 if softmax_type == "off-by-one" else None)
    ref_grads = torch.autograd.grad(ref, (q, k, v), dout)
    for name, got, want in zip(("out", "dq", "dk", "dv"), (out, *grads), (ref, *ref_grads)):
        err = ((got - want).abs().max() / want.abs().max()).item()
        assert err <= 1e-6, f"{name}: relative {err:.2e}"


def test_window_layers_follow_megatron_skip_freq():
    assert [_config(window_size=(4, 0)).layer_window(i) for i in range(1, 5)] == [4, 4, 4, 4]
    every2 = _config(window_size=(4, 0), window_attn_skip_freq=2)
    assert [every2.layer_window(i) for i in range(1, 5)] == [4, None, 4, None]
    pattern = _config(window_size=(4, 0), window_attn_skip_freq=[0, 1, 1, 0])
    assert [pattern.layer_window(i) for i in range(1, 5)] == [None, 4, 4, None]
    assert _config().layer_window(1) is None and _config().attention_sink() is None
    assert window_tuple("(128,0)") == (128, 0) and window_tuple("128,-1") == (128, -1)


@pytest.mark.parametrize("kw,match", [
    (dict(window_size=(4, 2)), "give right 0"),
    (dict(window_size=(4, 0), window_attn_skip_freq=[1, 0]), "gives 2 layers"),
    (dict(softmax_type="learnable"), "not built here"),
])
def test_bad_window_flags_are_refused(kw, match):
    with pytest.raises(ConfigError, match=match):
        _config(**kw)
