"""The optimizer state API: state_pieces -> load_state_pieces into a fresh optimizer gives the
same state (Adam's moments; Muon's momentum and AdamW's on the rest) and the same next step, with and
without the distributed optimizer (DP=1)."""
import pytest
import torch

from megatron.core.config import TransformerConfig
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads
from megatron.core.models.gpt import GPTModel
from megatron.core.optimizer import (
    STATE_NAMES,
    DistributedOptimizer,
    DynamicGradScaler,
    MegatronOptimizer,
    StatePiece,
    get_megatron_optimizer,
)
from megatron.core.tensor_parallel.initialization import initialize_parameters
from megatron.core.tensor_parallel.param_meta import param_meta
from tests.harness import spawn


def _build(groups, distributed, seed, optimizer="adam"):
    cfg = TransformerConfig(num_layers=2, hidden_size=16, num_attention_heads=2, seq_length=8, vocab_size=64,
                            hidden_dropout=0.0, attention_dropout=0.0)
    cfg.validate()
    model = GPTModel(cfg, groups)
    initialize_parameters(model, seed, 0, 1)
    ddp = DistributedDataParallel(model, groups, DistributedDataParallelConfig("optim" if distributed else "no_shard",
                                                                               bucket_size=3000))
    return model, ddp, get_megatron_optimizer(ddp, groups, 1e-2, 0.1, grad_scaler=DynamicGradScaler(2.0 ** 8),
                                              optimizer=optimizer)


def _train(model, ddp, opt, groups, steps, seed):
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        ids = torch.randint(0, 64, (2, 8), generator=gen)
        ddp.start_step(1)
        (model(ids, ids).mean() * opt.loss_scale).backward()
        finalize_model_grads(model, groups, ddp)
        opt.step()


def _snapshot(opt):
    return [(param_meta(sp.param).init_key, sp.start, sp.end, {k: v.clone() for k, v in sp.tensors.items()})
            for sp in opt.state_pieces()], opt.scalar_state()


def _round_trip(groups, distributed, optimizer="adam"):
    model, ddp, opt = _build(groups, distributed, seed=1, optimizer=optimizer)
    assert isinstance(opt, DistributedOptimizer) == distributed
    _train(model, ddp, opt, groups, 3, seed=2)
    saved, scalars = _snapshot(opt)
    assert scalars["step"] == 3.0 and scalars["grad_scaler"]["scale"] == 2.0 ** 8 and scalars["optimizer"] == optimizer
    names = {(param_meta(sp.param).init_key, sp.start): ("param",) + opt.state_names(sp.param)
             for sp in opt.state_pieces()}
    assert all(tuple(t) == names[(k, lo)] for k, lo, _, t in saved)
    assert {n for ns in names.values() for n in ns} == (set(STATE_NAMES) if optimizer == "adam"
                                                        else set(STATE_NAMES) | {"momentum_buffer"})

    fresh_model, fresh_ddp, fresh = _build(groups, distributed, seed=7, optimizer=optimizer)  # other initial values
    by_key = {param_meta(p).init_key: p for p in fresh_model.parameters()}
    fresh.load_state_pieces(StatePiece(by_key[k], lo, hi, t) for k, lo, hi, t in saved)
    fresh.load_scalar_state(scalars)
    loaded, loaded_scalars = _snapshot(fresh)
    assert loaded_scalars == scalars
    for (k, lo, hi, want), (k2, lo2, hi2, got) in zip(saved, loaded, strict=True):
        assert (k, lo, hi) == (k2, lo2, hi2)
        for name in want:
            assert torch.equal(want[name], got[name]), (k, name)
    # the fp32 main value is the fp32 model's own storage: loading it set the parameters too
    for p in model.parameters():
        assert torch.equal(p, by_key[param_meta(p).init_key]), param_meta(p).init_key
    _train(model, ddp, opt, groups, 1, seed=3)
    _train(fresh_model, fresh_ddp, fresh, groups, 1, seed=3)
    for p in model.parameters():
        assert torch.equal(p, by_key[param_meta(p).init_key]), param_meta(p).init_key

    # a partial load (the parameter's value only) leaves the optimizer's state as it was
    sp = fresh.state_pieces()[0]
    state = fresh.state_names(sp.param)[0]
    before = sp.tensors[state].clone()
    fresh.load_state_pieces([StatePiece(sp.param, sp.start, sp.end, {"param": torch.zeros(sp.end - sp.start)})])
    assert torch.equal(sp.tensors[state], before) and not sp.tensors["param"].any()
    with pytest.raises(ValueError, match="no optimizer piece"):
        fresh.load_state_pieces([StatePiece(sp.param, sp.start, sp.end + 1, {})])
    with pytest.raises(ValueError, match="get_megatron_optimizer"):
        (MegatronOptimizer if distributed else DistributedOptimizer)(fresh_ddp, groups, 1e-2, 0.1)
    return True


def _both(groups):
    return [_round_trip(groups, distributed, optimizer) for optimizer in ("adam", "muon")
            for distributed in (False, True)]


def test_state_pieces_round_trip_plain_and_distributed():
    assert spawn(1, _both) == [[True] * 4]  # one process for all: spawning costs more than the test
