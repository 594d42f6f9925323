"""The fusion flags on CPU through a whole model, on one spawned rank (GPTModel needs its process groups)."""
import torch

from megatron.core.config import TransformerConfig
from tests.harness import spawn


def _flags_off_vs_defaults(groups):
    """On CPU, every fusion flag off must compute exactly what the defaults compute."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.tensor_parallel.initialization import initialize_parameters
    from megatron.core.tensor_parallel.random import model_parallel_seed
    ids = torch.randint(0, 50, (2, 8), generator=torch.Generator().manual_seed(1))
    llama = dict(position_embedding_type="rope", normalization="RMSNorm", swiglu=True)
    off = dict(masked_softmax_fusion=False, bias_gelu_fusion=False, bias_swiglu_fusion=False, norm_fusion=False,
               apply_rope_fusion=False)
    runs = {}
    for name, kw in {"gpt": {}, "gpt-off": off, "llama": llama, "llama-off": {**llama, **off}}.items():
        cfg = TransformerConfig(num_layers=2, hidden_size=32, num_attention_heads=4, seq_length=8, vocab_size=50,
                                make_vocab_size_divisible_by=8, hidden_dropout=0.1, attention_dropout=0.1, **kw)
        cfg.validate()
        model = GPTModel(cfg, groups)
        initialize_parameters(model, 3, 0, 1)
        model_parallel_seed(5, 0, 0, "cpu")
        loss = model(ids, ids).sum()
        loss.backward()
        runs[name] = (loss.detach(), [p.grad for p in model.parameters()],
                      model.decoder.layers[0].mlp.linear_fc1.skip_bias_add)
    failures = []  # plain strings: tensors would travel back through file-descriptor sharing
    for name in ("gpt", "llama"):
        (l0, g0, skip0), (l1, g1, skip1) = runs[name], runs[name + "-off"]
        if not (torch.equal(l0, l1) and all(torch.equal(a, b) for a, b in zip(g0, g1))):
            failures.append(f"{name}: flags off changed the loss or gradients")
        if skip0 or skip1:
            failures.append(f"{name}: on CPU the MLP must keep its bias in the matmul, as before fusions")
    return failures


def test_flags_off_and_defaults_compute_the_same_on_cpu():
    assert spawn(1, _flags_off_vs_defaults, timeout=120) == [[]]
