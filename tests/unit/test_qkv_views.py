"""q, k and v come out of the fused QKV projection as views of one split: the backward concatenates their
gradients into qkv's in one pass, with no zero-filled qkv-sized tensor per piece (a dispatch-mode record of
the backward), and the gradients are those of the indexing it replaces."""
import pytest
import torch

from megatron.core.comm import PlanGroup
from megatron.core.config import TransformerConfig
from megatron.core.transformer.attention import SelfAttention
from tests.op_record import OpRecord

ZERO_FILLS = {"select_backward", "slice_backward", "zeros", "zeros_like", "new_zeros", "zero_", "fill_"}


def _attention(groups):
    cfg = TransformerConfig(num_layers=1, hidden_size=32, num_attention_heads=4, seq_length=8, hidden_dropout=0.0,
                            attention_dropout=0.0, group_query_attention=groups < 4, num_query_groups=groups)
    torch.manual_seed(0)
    attn = SelfAttention(cfg, PlanGroup(1))
    with torch.no_grad():
        for p in attn.parameters():
            p.normal_(0, 0.2)
    return attn


@pytest.mark.parametrize("groups", [4, 2], ids=["mha", "gqa"])
def test_qkv_backward_fills_no_zeros(groups):
    attn = _attention(groups)
    x = torch.randn(8, 2, 32, requires_grad=True)
    qkv_numel = 8 * 2 * attn.linear_qkv.weight.shape[0]
    seen = []

    def keep_grad(module, args, out):  # qkv's gradient, as the split's backward makes it
        out[0].register_hook(lambda g: seen.append(g.clone()))
    attn.linear_qkv.register_forward_hook(keep_grad)
    y = attn(x)
    record = OpRecord()
    with record:
        y.sum().backward()
    filled = [(name, o.numel()) for name, outs in record.calls for o in outs
              if name in ZERO_FILLS and o.numel() >= qkv_numel]
    assert not filled, f"zero-filled qkv-sized tensors in the backward: {filled}"
    assert record.names().count("cat") >= 1

    # the same gradient as q, k, v taken by indexing (the layout per query group: [q_1..q_k, k, v])
    def by_indexing(qkv):
        s, b = qkv.shape[:2]
        per = attn.num_attention_heads_per_partition // attn.num_query_groups_per_partition
        qkv = qkv.view(s, b, attn.num_query_groups_per_partition, per + 2, attn.head_dim)
        q = qkv[:, :, :, :per].reshape(s, b, -1, attn.head_dim)
        return attn.linear_proj(attn.core_attention(q, qkv[:, :, :, per], qkv[:, :, :, per + 1]))[0]
    qkv = attn.linear_qkv(x.detach())[0].detach().requires_grad_()
    by_indexing(qkv).sum().backward()
    torch.testing.assert_close(seen[0], qkv.grad, rtol=0, atol=0)
