"""The planner's bytes per collective equal what a real gloo run sends, over one training step of
the same tiny layout: TP2 x DP2 plain, with SP + the distributed optimizer and with ZeRO-3 (its
parameters gathered twice per microbatch), multi-latent attention with and without SP, query compression,
latent norms, up-projection recompute and multi-token prediction, ZeRO-1 and ZeRO-3 at EP2 x DP4 (experts over
expert-DP 2), and TP2 x PP2 with SP and the interleaved schedule:
- DP: megatron/training/planner/cost.dp_traffic against debug.count_traffic (comm.py's tags);
- TP: planner/traffic.iteration_tp_traffic against a counter wrapped here around the torch
  collectives every TP call goes through (all_reduce, and comm.py's all-gather / reduce-scatter),
  counting only calls on the TP group, each with the ring figure comm.py uses;
- PP: planner/traffic.iteration_p2p_sent against the bytes of the sends posted to batch_isend_irecv."""
import collections

import pytest
import torch
import torch.distributed as dist

from megatron.core import comm, debug, parallel_state
from megatron.core.models.gpt import GPTModel
from megatron.core.pipeline_parallel import get_forward_backward_func
from megatron.core.pipeline_parallel.losses import TOKEN_LOSS
from megatron.core.tensor_parallel.random import model_parallel_seed
from megatron.core.transformer import mtp
from megatron.training.config.resolve import parallel_layout
from megatron.training.loop.training import setup_model_and_optimizer, train_step
from megatron.training.planner.cost import dp_traffic
from megatron.training.planner.hardware import ring_bytes
from megatron.training.planner.memory import estimate, stage_params
from megatron.training.planner.predict import configs
from megatron.training.planner.traffic import iteration_p2p_sent, iteration_tp_traffic
from pretrain_gpt import forward_step
from tests.distributed.test_data_parallel import _batches, _step
from tests.distributed.test_pipeline_parallel import _forward_step
from tests.harness import spawn

# _batches gives 2 microbatches of 2 x 16 tokens per DP rank
TINY = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
        "--max-position-embeddings", "16", "--vocab-size", "256", "--micro-batch-size", "2",
        "--global-batch-size", "8", "--tensor-model-parallel-size", "2", "--ddp-bucket-size", "5000",
        "--hidden-dropout", "0", "--attention-dropout", "0"]
MLA = ["--multi-latent-attention", "--kv-lora-rank", "12", "--qk-head-dim", "8", "--qk-pos-emb-head-dim", "4",
       "--v-head-dim", "6", "--position-embedding-type", "rope"]
VARIANTS = ([], ["--use-distributed-optimizer", "--sequence-parallel"],
            ["--use-distributed-optimizer", "--data-parallel-sharding-strategy", "optim_grads_params"],
            # multi-latent attention (planner/mla_cost.py) and multi-token prediction (traffic.mtp_collectives)
            MLA + ["--q-lora-rank", "10"], MLA + ["--sequence-parallel"],
            MLA + ["--q-lora-rank", "10", "--qk-layernorm", "--sequence-parallel", "--mtp-num-layers", "2",
                   "--recompute-granularity", "selective", "--recompute-modules", "mla_up_proj", "core_attn"],
            MLA + ["--mtp-num-layers", "1", "--recompute-granularity", "full", "--recompute-method", "uniform",
                   "--recompute-num-layers", "1"])


def _mtp_batches(groups, depth):
    return [mtp.add_mtp_inputs(batch, depth) for batch in _batches(groups)] if depth else _batches(groups)


def _count_tp(groups, counted):
    """Wrap the collectives in this process: calls on groups.tp add their ring bytes to `counted`."""
    def wrap(fn, kind, full_arg):
        def counting(*args, group=None, **kw):
            if group is groups.tp:
                full = args[full_arg]
                counted[kind] += ring_bytes(kind, full.numel() * full.element_size(), groups.tp_size)
            return fn(*args, group=group, **kw)
        return counting
    comm._all_gather = wrap(comm._all_gather, "all_gather", 0)              # (gathered out, shard in)
    comm._reduce_scatter = wrap(comm._reduce_scatter, "reduce_scatter", 1)  # (shard out, full in)
    dist.all_reduce = wrap(dist.all_reduce, "all_reduce", 0)


def _run(groups):
    tp_counted = collections.Counter()
    _count_tp(groups, tp_counted)
    out = []
    for extra in VARIANTS:  # one spawn for both: process start-up is the cost here
        c, t = configs(TINY + extra, 4)
        model_parallel_seed(5, groups.tp_rank, groups.pp_rank, "cpu")
        model, ddp, opt, sched = setup_model_and_optimizer(
            c, t, groups, torch.device("cpu"), lambda c_, g, d, **kw: GPTModel(c_, g, device=d, **kw))
        tp_counted.clear()
        with debug.count_traffic() as sent:
            train_step(model, ddp, opt, sched, _mtp_batches(groups, c.mtp_num_layers), forward_step, groups, 1,
                       loss_terms={**TOKEN_LOSS, **mtp.loss_declaration(c)})
        mem = estimate(c, t, 4, groups.pp_rank)
        params, layers = stage_params(c, t, 4, groups.pp_rank)
        micro = t.global_batch_size // (t.micro_batch_size * groups.dp_size)
        dp = dp_traffic(mem, groups.dp_size, t.data_parallel_sharding_strategy, micro)
        out.append((extra, dict(sent), dp,
                    dict(tp_counted), iteration_tp_traffic(c, t, groups.tp_size, groups.dp_size, params, layers)))
    return out


def test_bytes_per_collective_equal_the_counted_traffic():
    for per_rank in spawn(4, _run, tp=2):
        for extra, dp_counted, dp_predicted, tp_counted, tp_predicted in per_rank:
            assert dp_counted == dp_predicted, (extra, dp_counted, dp_predicted)
            assert tp_counted.keys() == tp_predicted.keys(), (extra, tp_counted, tp_predicted)
            for kind in tp_counted:
                assert tp_counted[kind] == pytest.approx(tp_predicted[kind], rel=1e-12), (extra, tp_counted,
                                                                                        tp_predicted)


FP8_GATHER = ["--fp8-format", "hybrid", "--fp8-recipe", "tensorwise", "--fp8-param-gather"]


def _run_moe(groups):
    """ZeRO-1 and ZeRO-3 at EP2 x DP4: dense buffers over d = 4 ranks, experts over expert-DP e = 2; and both
    with --fp8-param-gather (the FP8 weights' buckets, dense and experts', gathered as one byte an element;
    the second step counted: ZeRO-1's first also gathers the cast of the initial weights)."""
    groups = parallel_state.initialize_model_parallel(1, 1, expert_model_parallel_size=2)
    out = []
    for strategy, fp8 in [(s, f) for f in ([], FP8_GATHER) for s in ("optim", "optim_grads_params")]:
        flags = TINY + ["--tensor-model-parallel-size", "1", "--global-batch-size", "16", "--num-experts", "4",
                        "--moe-ffn-hidden-size", "24", "--expert-model-parallel-size", "2",
                        "--moe-token-dispatcher-type", "alltoall", "--use-distributed-optimizer",
                        "--data-parallel-sharding-strategy", strategy] + fp8
        c, t = configs(flags, 4)
        model_parallel_seed(5, groups.tp_rank, groups.pp_rank, "cpu")
        model, ddp, opt, sched = setup_model_and_optimizer(
            c, t, groups, torch.device("cpu"), lambda c_, g, d, **kw: GPTModel(c_, g, device=d, **kw))
        for step in range(1, 3 if fp8 else 2):
            with debug.count_traffic() as sent:
                train_step(model, ddp, opt, sched, _batches(groups), _step, groups, step)
        mem = estimate(c, t, 4)
        out.append((strategy + (" fp8" if fp8 else ""), dict(sent), dp_traffic(mem, groups.dp_size, strategy, 2),
                    mem["expert_dp"][0]))
    return out


def test_expert_dp_bytes_equal_the_counted_traffic():
    for per_rank in spawn(4, _run_moe):
        for strategy, sent, predicted, e in per_rank:
            assert e == 2
            assert sent == predicted, (strategy, sent, predicted)


def _run_pipeline(groups):
    tp_counted, p2p_sent = collections.Counter(), [0]
    _count_tp(groups, tp_counted)
    batched = dist.batch_isend_irecv

    def counting(ops):
        p2p_sent[0] += sum(op.tensor.numel() * op.tensor.element_size() for op in ops if op.op is dist.isend)
        return batched(ops)
    dist.batch_isend_irecv = counting
    flags = TINY + ["--num-layers", "4", "--pipeline-model-parallel-size", "2", "--sequence-parallel",
                    "--num-layers-per-virtual-pipeline-stage", "1"]
    c, t = configs(flags, 4)
    layout = parallel_layout(c, t, 4)
    groups = groups.with_pipeline(layout.vpp, layout.schedule)  # the harness built the groups: 2 chunks per rank
    model_parallel_seed(5, groups.tp_rank, groups.pp_rank, "cpu")
    model, ddp, opt, sched = setup_model_and_optimizer(
        c, t, groups, torch.device("cpu"), lambda c_, g, d, **kw: GPTModel(c_, g, device=d, **kw))
    tp_counted.clear()
    train_step(model, ddp, opt, sched, _batches(groups, n=4), _forward_step, groups, 1, get_forward_backward_func())
    params, layers = stage_params(c, t, 4, groups.pp_rank)
    first, last = groups.pp_rank == 0, groups.pp_rank == groups.pp_size - 1
    return (p2p_sent[0], iteration_p2p_sent(c, t, groups.layout, groups.pp_rank),
            dict(tp_counted), iteration_tp_traffic(c, t, groups.tp_size, groups.dp_size, params, layers, first, last))


def test_pipeline_sends_and_tp_bytes_equal_the_counted_traffic():
    for p2p_counted, p2p_predicted, tp_counted, tp_predicted in spawn(4, _run_pipeline, tp=2, pp=2):
        assert p2p_counted == p2p_predicted > 0
        assert tp_counted.keys() == tp_predicted.keys(), (tp_counted, tp_predicted)
        for kind in tp_counted:
            assert tp_counted[kind] == pytest.approx(tp_predicted[kind], rel=1e-12), (tp_counted, tp_predicted)
