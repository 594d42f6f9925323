"""Activation recompute gives the loss and gradients of no recompute, with dropout on.

Dropout (hidden 0.1, attention 0.1) makes every forward draw random masks: from the default
generator (replicated activations) and from the tracker's model-parallel state (attention
probabilities; sequence-parallel shards). The recomputed forward must draw the same masks,
and afterwards every generator must stand where it would without recompute. Each layout is
one spawned run; inside it, every recompute mode is compared with no recompute on the same
rank, from the same seed. A negative control switches the RNG restore off and checks that
the gradients then differ: the comparison can fail.
"""

import pytest
import torch

from megatron.core.config import TransformerConfig
from megatron.core.models.gpt import GPTModel
from megatron.core.tensor_parallel import random as tp_random
from megatron.core.tensor_parallel.initialization import initialize_parameters
from megatron.core.tensor_parallel.random import get_rng_tracker, model_parallel_seed
from tests.harness import spawn

MODES = {
    "full-uniform-1": dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1),
    "full-uniform-2": dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=2),
    "full-block-3": dict(recompute_granularity="full", recompute_method="block", recompute_num_layers=3),
    "selective": dict(recompute_granularity="selective"),
}
GPT = dict(position_embedding_type="learned_absolute", normalization="LayerNorm")
LLAMA = dict(position_embedding_type="rope", normalization="RMSNorm", swiglu=True, group_query_attention=True,
             num_query_groups=2, add_bias_linear=False, untie_embeddings_and_output_weights=True)
VOCAB, B, S = 64, 2, 16


def _config(tp, sp, model, backend, **recompute):
    cfg = TransformerConfig(tensor_model_parallel_size=tp, sequence_parallel=sp, num_layers=4, hidden_size=32,
                            num_attention_heads=4, seq_length=S, hidden_dropout=0.1, attention_dropout=0.1,
                            attention_backend=backend, make_vocab_size_divisible_by=8, vocab_size=VOCAB,
                            **model, **recompute)
    cfg.validate()
    return cfg


def _step(groups, cfg, seed=11):
    """Two microbatches forward + backward from a fixed seed: (losses, grads, RNG states after)."""
    model = GPTModel(cfg, groups)
    initialize_parameters(model, 1234, groups.tp_rank, groups.tp_size)
    model.train()
    model_parallel_seed(seed, groups.tp_rank, 0, "cpu")
    gen = torch.Generator().manual_seed(5)
    losses = []
    for _ in range(2):
        ids = torch.randint(0, VOCAB, (B, S), generator=gen)
        labels = torch.randint(0, VOCAB, (B, S), generator=gen)
        loss = model(ids, labels).mean()
        loss.backward()
        losses.append(loss.detach())
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    return torch.stack(losses), grads, (torch.get_rng_state(), get_rng_tracker().get_states())


def _compare(ref, got):
    """Failures (strings) between two _step results; exact equality is expected."""
    (l0, g0, r0), (l1, g1, r1) = ref, got
    out = []
    if not torch.equal(l0, l1):
        out.append(f"losses {l1.tolist()} != {l0.tolist()}")
    for name in g0:
        if not torch.equal(g0[name], g1[name]):
            err = (g0[name] - g1[name]).abs().max().item()
            out.append(f"grad {name}: max |diff| {err:.3e} (scale {g0[name].abs().max().item():.3e})")
    if not torch.equal(r0[0], r1[0]):
        out.append("default generator state differs after the step")
    if any(not torch.equal(r0[1][k], r1[1][k]) for k in r0[1]):
        out.append("tracker state differs after the step")
    return out


def _run_modes(groups, sp, cases):
    """{case name: failures} for every (model, backend) x recompute mode, plus negative controls."""
    results = {}
    tp = groups.tp_size
    for model_name, backend in cases:
        model = GPT if model_name == "gpt" else LLAMA
        ref = _step(groups, _config(tp, sp, model, backend))
        dropout_matters = _step(groups, _config(tp, sp, model, backend), seed=12)
        results[f"{model_name}-{backend}-dropout-is-on"] = (
            [] if not torch.equal(ref[0], dropout_matters[0]) else ["another dropout seed gives the same loss"])
        for mode, kw in MODES.items():
            results[f"{model_name}-{backend}-{mode}"] = _compare(
                ref, _step(groups, _config(tp, sp, model, backend, **kw)))
    # negative control: without the RNG restore, recompute must be caught
    model_name, backend = cases[0]
    model = GPT if model_name == "gpt" else LLAMA
    ref = _step(groups, _config(tp, sp, model, backend))
    restore = tp_random._set_rng_states
    tp_random._set_rng_states = lambda states: None
    try:
        for mode in ("full-uniform-1", "selective"):
            broken = _compare(ref, _step(groups, _config(tp, sp, model, backend, **MODES[mode])))
            results[f"control-{mode}-without-rng-restore-is-caught"] = (
                [] if any(f.startswith("grad") for f in broken) else ["no gradient differs without the RNG restore"])
    finally:
        tp_random._set_rng_states = restore
    return results


def _one_process(groups):
    return _run_modes(groups, False, [("gpt", "sdpa"), ("gpt", "unfused"), ("llama", "sdpa")])


def _tp2(groups):
    torch.manual_seed(0)
    out = {}
    for sp in (False, True):
        for name, fails in _run_modes(groups, sp, [("gpt", "sdpa"), ("llama", "unfused")]).items():
            out[f"{'sp' if sp else 'nosp'}-{name}"] = fails
    return out


@pytest.fixture(scope="module")
def one_process():
    return spawn(1, _one_process, timeout=300)


@pytest.fixture(scope="module")
def tp2():
    return spawn(2, _tp2, tp=2, timeout=300)


def _check(per_rank, prefix):
    names = [n for n in per_rank[0] if n.startswith(prefix)]
    assert names, f"no case {prefix!r}"
    failures = [f"rank {r} {n}: {f}" for r, res in enumerate(per_rank) for n in names for f in res[n]]
    assert not failures, "\n".join(failures[:30])


@pytest.mark.parametrize("case", ["gpt-sdpa", "gpt-unfused", "llama-sdpa", "control"])
def test_recompute_one_process(one_process, case):
    _check(one_process, case)


@pytest.mark.parametrize("case", ["nosp-gpt-sdpa", "nosp-llama-unfused", "sp-gpt-sdpa", "sp-llama-unfused",
                                  "nosp-control", "sp-control"])
def test_recompute_tp2(tp2, case):
    _check(tp2, case)
