"""The MoE step's host synchronisations, held to a budget (bench/host_syncs.py counts, on the CPU, what
would make the host wait for a CUDA device: values read on the host, value-sized outputs, Python data
copied to the device). At small shapes each one drains the GPU's queue, so the step becomes the host's.

Per MoE layer and pass (forward; backward):
- one process, dropless, grouped experts (either dispatcher, any router): 0; 0. Under the zero-bubble
  split: 0 in B and in W.
- the experts as a loop (no --moe-grouped-gemm, or a torch without torch._grouped_mm): 1; 0 (the
  split sizes; the backward reuses them).
- a capacity factor (with or without padding): 1; 0 (the kept pairs' count).
- EP2, alltoall or allgather: 1; 0 (the all-to-all's splits, or the local pairs' bounds, read in one
  .tolist()).
- folded with expert TP 2 (TP1 x DP2 x ETP2): 1; 0 (the expert-TP ranks' counts: the rows to pad).
A whole training step of a GPT MoE model (world of one, dropless, grouped: examples/moe/train_moe_seed004.sh's
flags) makes none; the tokens-per-expert log line reads once per log interval.
"""
import pytest
import torch

from bench.host_syncs import HostSyncs
from megatron.core import parallel_state
from megatron.core.config import TransformerConfig
from megatron.core.pipeline_parallel.backward_split import backward_input
from megatron.core.tensor_parallel.initialization import initialize_parameters
from megatron.core.tensor_parallel.param_meta import set_init_key
from megatron.core.transformer.moe import grouped_gemm, step_hooks
from megatron.core.transformer.moe.moe_layer import build_mlp
from tests.harness import spawn
from tests.unit.test_moe import cfg, layer

MOE = dict(num_experts=8, moe_router_topk=2, moe_aux_loss_coeff=1e-2, moe_z_loss_coeff=1e-3, moe_grouped_gemm=True,
           moe_token_dispatcher_type="alltoall")
CAPACITY = dict(moe_expert_capacity_factor=0.5)

CASES = {  # name: (config, forward budget, backward budget)
    "alltoall-grouped": ({}, 0, 0),
    "allgather-grouped": (dict(moe_token_dispatcher_type="allgather"), 0, 0),
    "grouped-swiglu-biases-shared-gate": (dict(swiglu=True, add_bias_linear=True, moe_shared_expert_gate=True,
                                               moe_shared_expert_intermediate_size=24), 0, 0),
    "seq-aux-sigmoid-expert-bias": (dict(moe_router_load_balancing_type="seq_aux_loss",
                                         moe_router_score_function="sigmoid",
                                         moe_router_enable_expert_bias=True), 0, 0),
    "pre-softmax": (dict(moe_router_pre_softmax=True), 0, 0),
    "loop": (dict(moe_grouped_gemm=False), 1, 0),
    "allgather-loop-biases": (dict(moe_grouped_gemm=False, moe_token_dispatcher_type="allgather",
                                   add_bias_linear=True), 1, 0),
    "grouped-fallback": (dict(fallback=True), 1, 0),
    "capacity-alltoall": (CAPACITY, 1, 0),
    "capacity-allgather-padded": (dict(CAPACITY, moe_token_dispatcher_type="allgather",
                                       moe_pad_expert_input_to_capacity=True), 1, 0),
    "capacity-position-padded-loop": (dict(CAPACITY, moe_token_drop_policy="position", moe_grouped_gemm=False,
                                           moe_pad_expert_input_to_capacity=True), 1, 0),
}


def _passes(m, x, split=False):
    """HostSyncs of the forward and the backward of one micro-batch through m (split: the zero-bubble B,
    then W: pipeline_parallel/backward_split.py)."""
    step_hooks.bind(m).start_iteration(1.0, 1)  # the layer records into a RouterLosses, as in training
    with HostSyncs() as fwd:
        y = m(x)
    with HostSyncs() as bwd:
        if split:
            work = backward_input(y, torch.ones_like(y), x, {id(p): i for i, p in enumerate(m.parameters())})
        else:
            y.backward(torch.ones_like(y))
    counts = [fwd, bwd]
    if split:
        with HostSyncs() as w:
            work.run()
        counts.append(w)
    return counts


@pytest.mark.parametrize("name", list(CASES))
def test_one_process_layer_within_budget(name, monkeypatch):
    kw, fwd_budget, bwd_budget = CASES[name]
    kw = dict(MOE, **kw)
    if kw.pop("fallback", False):
        monkeypatch.setattr(grouped_gemm, "_HAS_GROUPED", False)
    m = layer(cfg(hidden_size=32, moe_ffn_hidden_size=48, **kw))
    x = torch.randn(16, 4, 32, generator=torch.Generator().manual_seed(0), requires_grad=True)
    fwd, bwd = _passes(m, x)
    assert fwd.total_syncs == fwd_budget, fwd.report()
    assert bwd.total_syncs == bwd_budget, bwd.report()
    assert fwd.total_ops > 0 and bwd.total_ops > 0  # the counter saw both passes


def test_zero_bubble_split_reads_nothing():
    m = layer(cfg(hidden_size=32, moe_ffn_hidden_size=48, swiglu=True, add_bias_linear=True, **MOE))
    x = torch.randn(16, 4, 32, generator=torch.Generator().manual_seed(0), requires_grad=True)
    for counted in _passes(m, x, split=True):  # forward, B, W
        assert counted.total_syncs == 0, counted.report()


def test_the_counter_sees_what_the_old_dispatch_read():
    # the counter itself: what the MoE code used to do, one of each kind
    ids = torch.tensor([3, 1, 1, 0])
    with HostSyncs() as c:
        torch.bincount(ids, minlength=4)
        int(ids.sum())
        ids.tolist()
        torch.tensor([1, 2])
        torch.nonzero(ids)
        ids[ids > 0]
        torch.repeat_interleave(ids, ids)
        torch.repeat_interleave(ids, ids, output_size=5)  # given its size: no sync
    assert c.total_syncs == 7, c.report()


def _gpt_step(groups):
    from bench.moe_step import Runner, Shape, model_config
    s = Shape(hidden=32, heads=4, ffn=48, seq=16, vocab=128, layers=2, micro_batch=2, microbatches=2)
    runner = Runner(model_config(s), s, groups, torch.device("cpu"), torch.float32)
    runner.step()  # the first step allocates the optimizer's state
    with HostSyncs() as c:
        runner.step()
    with HostSyncs() as log:
        line = step_hooks.balance_line(runner.model.config, groups, torch.device("cpu"), runner.router_losses)
    return c.total_syncs, c.report(), log.total_syncs, line


def test_a_training_step_of_the_gpt_moe_model_reads_nothing():
    syncs, report, log_syncs, line = spawn(1, _gpt_step)[0]
    assert syncs == 0, report
    assert log_syncs == 1 and "tokens per expert min/max" in line


def _layer_on_grid(groups, config, ep, etp=None):
    groups = parallel_state.initialize_model_parallel(1, 1, expert_model_parallel_size=ep,
                                                      expert_tensor_parallel_size=etp)
    c = TransformerConfig(num_layers=2, hidden_size=32, num_attention_heads=4, moe_ffn_hidden_size=48,
                          add_bias_linear=False, hidden_dropout=0.0, attention_dropout=0.0,
                          expert_model_parallel_size=ep, expert_tensor_parallel_size=etp, **dict(MOE, **config))
    m = build_mlp(c, groups, 1, "cpu")
    for name, p in m.named_parameters():
        set_init_key(p, name)
    initialize_parameters(m, 3, 0, 1, (groups.etp_rank, groups.etp_size))
    gen = torch.Generator().manual_seed(groups.rank)  # each rank its own tokens
    x = torch.randn(16, 4, 32, generator=gen, requires_grad=True)
    return [(c.total_syncs, c.report()) for c in _passes(m, x)]


def _ep2_layers(groups):
    return {kind: _layer_on_grid(groups, dict(moe_token_dispatcher_type=kind), ep=2)
            for kind in ("alltoall", "allgather")} | {"etp2": _layer_on_grid(groups, {}, ep=1, etp=2)}


def test_expert_parallel_layers_read_once_per_forward():
    for rank in spawn(2, _ep2_layers):
        for kind, ((fwd, fwd_report), (bwd, bwd_report)) in rank.items():
            assert fwd == 1, (kind, fwd_report)
            assert bwd == 0, (kind, bwd_report)
