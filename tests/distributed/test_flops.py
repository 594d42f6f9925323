"""The FLOPs formula (flops.py) against torch's FLOP counter over a real model on one spawned rank."""
import pytest
import torch

from megatron.core.config import TransformerConfig
from megatron.training.observability import flops
from tests.harness import spawn


def _counted(groups, cfg):
    from torch.utils.flop_counter import FlopCounterMode

    from megatron.core.models.gpt import GPTModel
    from megatron.core.tensor_parallel.initialization import initialize_parameters
    model = GPTModel(cfg, groups)
    initialize_parameters(model, 1, 0, 1)
    ids = torch.randint(0, cfg.vocab_size, (2, cfg.seq_length), generator=torch.Generator().manual_seed(0))
    with FlopCounterMode(display=False) as counter:
        model(ids, ids).sum().backward()
    return counter.get_total_flops()


@pytest.mark.parametrize("kind", ["gpt", "llama"])
def test_formula_equals_torchs_flop_counter(kind):
    """torch counts every matmul of a real forward + backward (the unfused attention's bmm, whose backward
    is exactly 2x forward; SDPA's counter would add its backward's recompute of the scores)."""
    kw = dict(attention_backend="unfused", hidden_dropout=0.0, attention_dropout=0.0)
    if kind == "llama":
        kw.update(position_embedding_type="rope", normalization="RMSNorm", swiglu=True, group_query_attention=True,
                  num_query_groups=2, add_bias_linear=False, untie_embeddings_and_output_weights=True)
    cfg = TransformerConfig(num_layers=3, hidden_size=64, num_attention_heads=4, seq_length=32, vocab_size=500,
                            make_vocab_size_divisible_by=128, **kw)
    cfg.validate()
    (counted,) = spawn(1, _counted, cfg, timeout=120)
    assert counted == flops.num_floating_point_operations(cfg, 2)
