"""The whole model on a GPU: fused kernels vs plain torch, recompute with CUDA dropout, and
saved-activation bytes against the paper with CUDA's 1-byte dropout masks and fp32 norm
statistics (tests/activation_memory.py)."""
import itertools

import pytest
import torch

from megatron.core.config import TransformerConfig
from megatron.core.models.gpt import GPTModel
from megatron.core.tensor_parallel.initialization import initialize_parameters
from megatron.core.tensor_parallel.random import get_rng_tracker, model_parallel_seed
from megatron.core.transformer.block import TransformerBlock
from tests.activation_memory import korthikanti, measure, ours
from tests.harness import spawn

LLAMA = dict(position_embedding_type="rope", normalization="RMSNorm", swiglu=True, group_query_attention=True,
             num_query_groups=2, add_bias_linear=False)
OFF = dict(masked_softmax_fusion=False, bias_gelu_fusion=False, bias_swiglu_fusion=False, norm_fusion=False,
           apply_rope_fusion=False)


def _cfg(**kw):
    cfg = TransformerConfig(**{**dict(num_layers=2, hidden_size=256, num_attention_heads=8, seq_length=128,
                                      vocab_size=1000, params_dtype=torch.bfloat16, attention_backend="unfused"),
                               **kw})
    cfg.resolve().validate()
    return cfg


def _losses(groups, cfg, steps=3):
    """Per-step losses of a few SGD steps and the grads' norm, on cuda:0, from fixed seeds."""
    torch.cuda.set_device(0)
    model = GPTModel(cfg, groups, device="cuda")
    initialize_parameters(model, 1, 0, 1)
    model_parallel_seed(3, 0, 0, "cuda")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ids = torch.randint(0, cfg.vocab_size, (4, cfg.seq_length), device="cuda",
                        generator=torch.Generator(device="cuda").manual_seed(0))
    out, first_grads = [], None
    for _ in range(steps):
        opt.zero_grad()
        loss = model(ids, ids).float().mean()
        loss.backward()
        if first_grads is None:  # numpy: returned by value (tensors would go through fd sharing)
            first_grads = torch.cat([p.grad.float().flatten() for p in model.parameters()]).cpu().numpy()
        opt.step()
        out.append(loss.item())
    impls = [(n, getattr(m, "impl", None) or getattr(m, "activation_impl", None) or getattr(m, "rope_impl", None))
             for n, m in model.named_modules() if hasattr(m, "impl") or hasattr(m, "activation_impl")]
    rng = [str(get_rng_tracker().get_states()[k].sum().item()) for k in get_rng_tracker().states]
    return out, impls, rng + [str(torch.cuda.get_rng_state().sum().item())], first_grads


@pytest.mark.parametrize("kind", ["gpt", "llama"])
def test_fused_model_matches_torch_path(kind):
    kw = LLAMA if kind == "llama" else {}
    # our kernels wherever they run, whatever the kernel table says of their speed
    fused, impls, _, _ = spawn(1, _losses, _cfg(hidden_dropout=0.0, attention_dropout=0.0, fused_kernels="csrc", **kw),
                               timeout=600)[0]
    plain, plain_impls, _, _ = spawn(1, _losses, _cfg(hidden_dropout=0.0, attention_dropout=0.0, **kw, **OFF),
                                     timeout=600)[0]
    # the reference: the plain-torch model in fp32 (the same seeds, so the same function)
    fp32, _, _, _ = spawn(1, _losses, _cfg(hidden_dropout=0.0, attention_dropout=0.0, params_dtype=torch.float32,
                                           **kw, **OFF), timeout=600)[0]
    assert impls and all(i == "csrc" for _, i in impls), f"--fused-kernels csrc, yet: {impls}"
    assert all(i == "torch" for _, i in plain_impls), plain_impls
    for a, b, r in zip(fused, plain, fp32):
        assert a == pytest.approx(b, rel=2e-2), (fused, plain)  # bf16: rounding differs, the function does not
        assert a == pytest.approx(r, rel=2e-2) and b == pytest.approx(r, rel=2e-2), (fused, plain, fp32)


@pytest.mark.parametrize("mode", [dict(recompute_granularity="full"), dict(recompute_granularity="selective")],
                         ids=["full", "selective"])
@pytest.mark.parametrize("backend", ["unfused", "sdpa"])
def test_recompute_with_cuda_dropout(mode, backend):
    """Same gradients up to GPU nondeterminism (atomics in attention backward: ~1e-3 in bf16);
    a wrong dropout mask in the recompute would change them by order 1."""
    cfg = dict(hidden_dropout=0.1, attention_dropout=0.1, attention_backend=backend)
    ref = spawn(1, _losses, _cfg(**cfg), timeout=600)[0]
    got = spawn(1, _losses, _cfg(**cfg, **mode), timeout=600)[0]
    assert got[0][0] == ref[0][0]
    g, g_ref = torch.from_numpy(got[3]), torch.from_numpy(ref[3])
    assert (g - g_ref).norm() <= 1e-2 * g_ref.norm()
    assert got[0] == pytest.approx(ref[0], rel=1e-2)
    assert got[2] == ref[2], "the CUDA / tracker generators end elsewhere than without recompute"


S, B, H, A = 512, 2, 256, 8


def _saved(groups):
    torch.cuda.set_device(0)
    out = {}
    for (backend, core), rec in itertools.product([("unfused", "unfused"), ("sdpa", "sdpa-flash")],
                                                  [None, "selective", "full"]):
        cfg = _cfg(num_layers=2, hidden_size=H, num_attention_heads=A, seq_length=S, hidden_dropout=0.1,
                   attention_dropout=0.1, attention_backend=backend, recompute_granularity=rec)
        model_parallel_seed(1, 0, 0, "cuda")
        block = TransformerBlock(cfg, groups.tp, post_process=False, device="cuda").train()
        x = torch.randn(S, B, H, dtype=torch.bfloat16, device="cuda", requires_grad=True)
        _, n = measure(lambda: block(x), list(block.parameters()))
        out[(core, rec)] = n / 2
    return out


def test_saved_activation_bytes_on_cuda():
    measured = spawn(1, _saved, timeout=600)[0]
    sbh = S * B * H
    for (core, rec), got in measured.items():
        expected = ours(S, B, H, A, 1, False, rec, core, mask_bytes=1, stat_bytes=4)
        assert abs(got / expected - 1) <= 0.10, f"{core} {rec}: {got / sbh:.3f} sbh vs {expected / sbh:.3f}"
        if core == "unfused" or rec is not None:  # the paper's layer: within 10% of the paper itself
            paper = korthikanti(S, B, H, A, 1, False, rec)
            assert abs(got / paper - 1) <= 0.10, f"{core} {rec}: {got / sbh:.3f} sbh vs paper {paper / sbh:.3f}"
