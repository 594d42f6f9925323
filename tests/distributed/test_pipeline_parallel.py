"""The schedule executor on real gloo processes, against one process computed on every rank.

For each schedule (1F1B, GPipe, interleaved) the pipelined loss and every parameter's
gradient (matched by init_key, which numbers layers over the whole model) equal those of
the full model run as plain gradient accumulation; sent outputs are freed; the real
executor holds as many microbatches as the simulator predicts; forward-only (evaluation)
gives the same loss; and the tied embedding's two copies stay bitwise equal while training.
Comparisons are recorded, not raised, so every rank keeps issuing the same collectives.
"""
import dataclasses

import pytest
import torch
import torch.distributed as dist

from megatron.core.config import TransformerConfig
from megatron.core.distributed import DistributedDataParallel, finalize_model_grads
from megatron.core.models.gpt import GPTModel
from megatron.core.optimizer import LRScheduler, MegatronOptimizer
from megatron.core.pipeline_parallel import (
    as_chunks,
    build_schedule,
    forward_backward,
    get_forward_backward_func,
    loss_means,
)
from megatron.core.pipeline_parallel.simulator import simulate
from megatron.core.tensor_parallel.initialization import initialize_parameters
from megatron.core.tensor_parallel.param_meta import param_meta
from megatron.core.tensor_parallel.random import model_parallel_seed
from megatron.training.loop.training import build_model, train_step
from tests.harness import spawn

SEED, VOCAB, SEQ, MICRO = 11, 64, 16, 2


def _config(P, layers, V=None, **kw):
    cfg = TransformerConfig(num_layers=layers, hidden_size=32, num_attention_heads=4, seq_length=SEQ,
                            vocab_size=VOCAB, hidden_dropout=0.0, attention_dropout=0.0,
                            make_vocab_size_divisible_by=8, pipeline_model_parallel_size=P,
                            virtual_pipeline_model_parallel_size=V, **kw)
    cfg.resolve().validate()
    return cfg


def _batches(M, seed):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(M):
        t = torch.randint(0, VOCAB, (MICRO, SEQ + 1), generator=g)
        mask = (torch.rand(MICRO, SEQ, generator=g) > 0.2).float()  # some tokens do not count
        out.append({"tokens": t[:, :-1].contiguous(), "labels": t[:, 1:].contiguous(), "loss_mask": mask})
    return out


def _forward_step(model, batch):
    out = model(batch["tokens"], labels=batch["labels"])
    return {"lm loss": (out, batch["loss_mask"])} if model.post_process else out


def _provider(cfg, groups, device, pre_process=True, post_process=True, vp_stage=None):
    return GPTModel(cfg, groups, pre_process=pre_process, post_process=post_process, vp_stage=vp_stage)


def _reference(cfg, groups, batches):
    """Loss and {init_key: grad} of the whole model in this process (TP 1, no pipeline)."""
    full = GPTModel(cfg, groups, num_layers=cfg.num_layers, layer_offset=0)
    initialize_parameters(full, SEED, 0, 1)
    tokens = sum(b["loss_mask"].sum() for b in batches)
    total = 0.0
    for b in batches:
        loss_sum = (full(b["tokens"], labels=b["labels"]) * b["loss_mask"]).sum()
        (loss_sum / tokens).backward()
        total += loss_sum.item()
    return total / tokens.item(), {param_meta(p).init_key: p.grad for p in full.parameters()}


def _check_schedule(groups, fails, name, layers, V, M, untie):
    tag = f"{name} P={groups.pp_size} V={V} M={M} untie={untie}"
    cfg = _config(groups.pp_size, layers, V, untie_embeddings_and_output_weights=untie)
    groups = groups.with_pipeline(cfg.virtual_pipeline_model_parallel_size, name)  # V chunks per rank
    batches = _batches(M, seed=M)
    ref_loss, ref_grads = _reference(cfg, groups, batches)
    model = build_model(_provider, cfg, groups, "cpu")
    initialize_parameters(model, SEED, 0, 1)
    stats = {}
    loss = loss_means(forward_backward(model, batches, _forward_step, groups, schedule=name, stats=stats))["lm loss"]
    finalize_model_grads(model, groups)
    if groups.is_last_stage and abs(loss.item() - ref_loss) > 1e-6 * abs(ref_loss):
        fails.append(f"{tag}: loss {loss.item()} vs one process {ref_loss}")
    for p in model.parameters():
        if not torch.allclose(p.grad, ref_grads[param_meta(p).init_key], rtol=1e-5, atol=1e-8):
            err = (p.grad - ref_grads[param_meta(p).init_key]).abs().max().item()
            fails.append(f"{tag} rank {groups.rank}: grad of {param_meta(p).init_key} differs (max abs {err:.2e})")
    plan = simulate(build_schedule(groups.pp_size, M, V or 1, name))
    if stats["peak_in_flight"] != plan.peak_in_flight[groups.pp_rank]:
        fails.append(f"{tag} rank {groups.rank}: {stats['peak_in_flight']} microbatches in flight, "
                     f"simulator says {plan.peak_in_flight[groups.pp_rank]}")
    if not groups.is_last_stage and stats["peak_kept_output_elems"] > stats["peak_in_flight"]:
        fails.append(f"{tag} rank {groups.rank}: sent outputs not freed "
                     f"({stats['peak_kept_output_elems']} elements kept)")
    with torch.no_grad():
        model.eval()
        eval_loss = loss_means(forward_backward(model, batches, _forward_step, groups, schedule=name,
                                                forward_only=True))["lm loss"]
        model.train()
    if groups.is_last_stage and abs(eval_loss.item() - ref_loss) > 1e-6 * abs(ref_loss):
        fails.append(f"{tag}: forward-only loss {eval_loss.item()} vs {ref_loss}")


def _tied_embeddings_stay_equal(groups, fails, V):
    cfg = _config(groups.pp_size, 2 * groups.pp_size * (V or 1), V)
    groups = groups.with_pipeline(cfg.virtual_pipeline_model_parallel_size)
    model = build_model(_provider, cfg, groups, "cpu")
    initialize_parameters(model, SEED, 0, 1)
    ddp = DistributedDataParallel(model, groups)
    opt = MegatronOptimizer(ddp, groups, 1e-2, 0.1)
    sched = LRScheduler(opt, 1e-2, 1e-3, 10, 0)
    mine = [c.word_embeddings.weight for c in as_chunks(model) if hasattr(c, "word_embeddings")]
    start = [w.detach().clone() for w in mine]
    for it in range(1, 4):
        train_step(model, ddp, opt, sched, _batches(2 * groups.pp_size, seed=100 + it), _forward_step, groups, it,
                   get_forward_backward_func())
        if groups.embd is None:  # middle stages hold no copy
            continue
        w = mine[0].detach().clone()
        first = w.clone()
        dist.broadcast(first, src=groups.pp_ranks[0], group=groups.embd)
        if not torch.equal(w, first):
            fails.append(f"V={V} step {it} rank {groups.rank}: tied embedding differs from the first stage's "
                         f"(max {(w - first).abs().max().item():.2e})")
    if mine and torch.equal(mine[0], start[0]):
        fails.append(f"V={V} rank {groups.rank}: embedding never updated")


def _uneven_split_places_layers_by_global_number(groups, fails):
    cfg = dataclasses.replace(_config(2, 4), decoder_first_pipeline_num_layers=1)
    cfg.validate()
    model = build_model(_provider, cfg, groups, "cpu")
    keys = sorted({int(param_meta(p).init_key.split(".")[2])
            for p in model.parameters() if param_meta(p).init_key.startswith("decoder.layers.")})
    if (len(model.decoder.layers), keys) != [(1, [0]), (3, [1, 2, 3])][groups.pp_rank]:
        fails.append(f"uneven 1 + 3 split, rank {groups.rank}: {len(model.decoder.layers)} layers, keys {keys}")


def _run(groups, cases):
    torch.manual_seed(0)
    model_parallel_seed(SEED, groups.tp_rank, groups.pp_rank, "cpu")
    fails = []
    for case in cases:
        if case[0] == "tied":
            _tied_embeddings_stay_equal(groups, fails, case[1])
        elif case[0] == "uneven":
            _uneven_split_places_layers_by_global_number(groups, fails)
        else:
            _check_schedule(groups, fails, *case)
    return fails


P2_CASES = [("1f1b", 4, None, 4, False), ("1f1b", 4, None, 1, False), ("gpipe", 4, None, 3, True),
            ("interleaved_1f1b", 4, 2, 4, False), ("interleaved_1f1b", 8, 2, 2, True), ("gpipe", 4, 2, 4, False),
            ("1f1b", 6, None, 3, False), ("tied", None), ("tied", 2), ("uneven",)]
P4_CASES = [("1f1b", 4, None, 6, False), ("interleaved_1f1b", 8, 2, 8, True), ("tied", None)]


@pytest.mark.parametrize("P,cases", [(2, P2_CASES), (4, P4_CASES)], ids=["pp2", "pp4"])
def test_pipelined_gradients_equal_one_process(P, cases):
    fails = [f for rank in spawn(P, _run, cases, pp=P, timeout=240) for f in rank]
    assert not fails, "\n".join(fails[:30])

