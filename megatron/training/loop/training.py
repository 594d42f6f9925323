"""The pretrain loop: build, then per iteration microbatches -> grads -> reduce -> clip -> step."""
import functools
import time

import torch
import torch.distributed as dist
from torch import nn

from ...core.debug import fault_point
from ...core.distributed import DistributedDataParallel, finalize_model_grads
from ...core.fp8 import step as fp8_step
from ...core.optimizer import get_megatron_optimizer
from ...core.pipeline_parallel import TOKEN_LOSS, get_forward_backward_func
from ...core.pipeline_parallel.split import chunk_roles
from ...core.tensor_parallel.initialization import initialize_parameters
from ...core.timers import phase
from ...core.transformer import compiled_layers
from ...core.transformer.context_parallel import cp_slice
from ...core.transformer.moe import step_hooks as moe_hooks
from ..checkpointing.save_load import Checkpointer
from ..config.offload_flags import (
    attach_activation_offload,
    host_state_fraction,
    optimizer_file_offload,
    optimizer_offload_line,
)
from ..config.optimizer_flags import optimizer_line
from ..config.precision_optimizer_flags import precision_optimizer_line
from ..data.loader import end_of_training_sets, microbatches, validation_window
from ..observability.flops import num_floating_point_operations
from ..observability.flops_profiler import FlopsProfiler
from ..observability.log import EvalProgress, print_rank_0, print_rank_last, startup_summary
from ..observability.memory_report import estimated_peak, report_memory
from ..observability.metrics_jsonl import MetricsLog
from ..observability.observers import open_observability
from ..observability.pipeline_trace import write_pipeline_trace
from ..observability.step_stats import step_stats
from ..planner.live import predicted_step_line
from . import batch_schedule
from .memory_errors import building, running
from .model_spec import ModelSpec
from .nan_check import check_finite
from .optimizer_setup import build_grad_scaler, build_scheduler
from .rerun import RerunCheck, run_checked
from .runtime_switches import ManualGC, empty_unused_memory, set_matmul_precision
from .straggler import StragglerReport

# --exit-duration-in-mins counts from here, the trainer's import near start-up, as Megatron-LM's _TRAIN_START_TIME
# does: a number written once at import and only read after (taking it later would shorten what the flag allows)
_START_TIME = time.time()


def exit_duration_reached(train_cfg, device):
    """True on every rank once any rank's wall time since start-up exceeds --exit-duration-in-mins
    (a MAX all-reduce over the default group, so all stop at the same iteration); False without the flag."""
    if not train_cfg.exit_duration_in_mins:
        return False
    late = torch.tensor([float((time.time() - _START_TIME) / 60.0 > train_cfg.exit_duration_in_mins)], device=device)
    dist.all_reduce(late, op=dist.ReduceOp.MAX)
    return late.item() > 0


def build_model(model_provider, model_cfg, groups, device):
    """This rank's part of the model: one chunk per virtual pipeline stage, a module when
    there is one chunk, else an nn.ModuleList (chunk v is virtual stage v * P + pp_rank).

    model_provider(config, groups, device, pre_process, post_process, vp_stage) builds one
    chunk; the embedding goes on the first stage's first chunk, the loss on the last's last.
    """
    V = groups.layout.chunks
    roles = [chunk_roles(groups.layout, groups.pp_rank, v) for v in range(V)]
    chunks = [model_provider(model_cfg, groups, device, pre_process=pre, post_process=post, vp_stage=v)
              for v, (pre, post) in enumerate(roles)]
    return chunks[0] if V == 1 else nn.ModuleList(chunks)


def train_step(model, ddp, optimizer, scheduler, batches, forward_step, groups, iteration,
               forward_backward_func=None, loss_terms=TOKEN_LOSS, model_cfg=None, timers=None, lr_increment=None,
               empty_cache_level=0, router_losses=None, rerun=None):
    """One iteration. Returns (losses, grad_norm tensor or None, lr, updated): losses is
    forward_backward's {term: (sum, count)} over the global batch (pipeline_parallel.loss_means
    divides); lr is the rate this iteration ran at; updated is False when fp16 gradients overflowed
    and the step was skipped (the schedule then does not advance, as Megatron-LM). `iteration` is
    not used: the schedule keeps its own position. No host sync but fp16's. model_cfg: the model's
    config, for the MoE hooks (step_hooks.finish_step). timers: core.timers.Timers (level 1:
    forward-backward, the gradient sums, optimizer and its parts), or None. lr_increment: the samples
    this iteration consumed (the global batch; default the scheduler's step size). empty_cache_level:
    --empty-unused-memory-level. router_losses: what the model's MoE layers record into
    (step_hooks.bind; default: bound here, for this step).

    The microbatches run through forward_backward_func (default: the schedule for this
    layout, pipeline_parallel.get_forward_backward_func()). The gradient summed over
    microbatches and DP ranks is that of each term's mean over the global batch (the terms
    of loss_terms added), whatever the layout.
    """
    ddp.start_step(len(batches))
    router_losses = router_losses if router_losses is not None else moe_hooks.bind(model)
    moe_hooks.start_step(router_losses, len(batches), groups, optimizer.loss_scale)
    forward_backward_func = forward_backward_func or get_forward_backward_func()
    gather = {"before_weight": ddp.before_weight_grads} if ddp.config.shards_params else {}  # ZeRO-3 under a W
    with phase(timers, "forward-backward", 1):  # twice where --rerun-mode re-runs it (rerun.py)
        losses = run_checked(rerun, iteration, lambda: forward_backward_func(
            model, batches, forward_step, groups, loss_terms, loss_scale=optimizer.loss_scale, **gather), lambda: (
            ddp.start_step(len(batches)), moe_hooks.start_step(router_losses, len(batches), groups,
                                                               optimizer.loss_scale)))
    if empty_cache_level:
        empty_unused_memory(empty_cache_level, 1, optimizer.device)
    finalize_model_grads(model, groups, ddp, timers)
    lr = scheduler.lr
    # delayed scaling's histories take this step's amaxes (a no-op without them) before the optimizer step,
    # whose parameter gather casts the FP8 weights with the new scales under --fp8-param-gather
    fp8_step.after_step(model, groups)
    with phase(timers, "optimizer", 1):
        updated, grad_norm = optimizer.step(timers)
    if updated:
        scheduler.step(lr_increment)
    else:  # no update, no gather: the FP8 weights' copies take the new scales all the same
        ddp.refresh_fp8_weights()
    if empty_cache_level:
        empty_unused_memory(empty_cache_level, 2, optimizer.device)
    losses = moe_hooks.finish_step(model, groups, len(batches), losses, updated, model_cfg, router_losses)
    return losses, grad_norm, lr, updated


@torch.no_grad()
def evaluate(model, dataset, spec: ModelSpec, groups, train_cfg, device):
    """{term: mean loss} over eval_iters global batches from the start of `dataset`, each term
    averaged over its own count (forward-only schedule; valid on the last pipeline stage, 0 elsewhere)."""
    model.eval()
    names = list(spec.loss_terms)
    sums, counts = torch.zeros(len(names), device=device), torch.zeros(len(names), device=device)
    global_batch, micro = train_cfg.global_batch_size, train_cfg.micro_batch_size
    forward_backward_func = get_forward_backward_func()
    progress = EvalProgress(train_cfg.eval_iters)
    for k in range(train_cfg.eval_iters):
        batches = microbatches(dataset, k * global_batch, global_batch, micro, groups.dp_rank, groups.dp_size,
                               device, spec.collate, cp_slice(groups))
        losses = forward_backward_func(model, batches, spec.forward_step, groups, spec.loss_terms, forward_only=True)
        empty_unused_memory(train_cfg.empty_unused_memory_level, 1, device)
        sums += torch.stack([losses[name][0] for name in names])
        counts += torch.stack([losses[name][1] for name in names])
        line = progress.after(k + 1)
        if line:
            print_rank_last(line)
    model.train()
    return dict(zip(names, (sums / counts).tolist()))


def setup_model_and_optimizer(model_cfg, train_cfg, groups, device, model_provider):
    """Model chunks (initialised layout-free), their DDP buffers, the optimizer and LR schedule. Running out
    of memory building them is one line saying what and how much (memory_errors.py)."""
    def count():  # this rank's parameters, from the same chunks built on the meta device
        return sum(p.numel() for p in build_model(model_provider, model_cfg, groups, torch.device("meta")).parameters())

    with building("the model", count, model_cfg.params_dtype, groups.rank):
        model = build_model(model_provider, model_cfg, groups, device)
        initialize_parameters(model, train_cfg.seed, groups.tp_rank, groups.tp_size,
                              (groups.etp_rank, groups.etp_size))
    with building("the gradient buffers and optimizer state", count, model_cfg.params_dtype, groups.rank):
        ddp = DistributedDataParallel(model, groups, train_cfg.ddp_config(model_cfg.fp8_param_gather),
                                      gradient_accumulation_fusion=model_cfg.gradient_accumulation_fusion)
        optimizer = get_megatron_optimizer(ddp, groups, train_cfg.lr, train_cfg.weight_decay,
                                           (train_cfg.adam_beta1, train_cfg.adam_beta2), train_cfg.adam_eps,
                                           train_cfg.clip_grad, build_grad_scaler(train_cfg),
                                           host_state_fraction(train_cfg), train_cfg.optimizer, train_cfg.sgd_momentum,
                                           train_cfg.muon_config() if train_cfg.optimizer == "muon" else None,
                                           optimizer_file_offload(train_cfg, groups.rank),
                                           train_cfg.optimizer_dtypes())
    return model, ddp, optimizer, build_scheduler(optimizer, train_cfg)


def pretrain(model_cfg, train_cfg, groups, device, spec: ModelSpec, datasets, tokenizer_name):
    """Train spec's model on datasets = (train, valid, test); every pipeline stage loads the same
    batches. Progress, losses and validation go to the log (log.TrainingLogger)."""
    model, ddp, optimizer, scheduler = setup_model_and_optimizer(model_cfg, train_cfg, groups, device,
                                                                 spec.model_provider)
    startup_summary(model, model_cfg, train_cfg, groups, device, tokenizer_name,
                    ddp.memory_bytes() + (optimizer.memory_bytes(),))
    print_rank_0(ddp.describe())
    for line in (optimizer_line(train_cfg), precision_optimizer_line(train_cfg, device),
                 attach_activation_offload(model, train_cfg, device), optimizer_offload_line(train_cfg, optimizer)):
        if line is not None:
            print_rank_0(line)
    if train_cfg.optimizer_cpu_offload:
        print_rank_0(f"> optimizer CPU offload: {train_cfg.optimizer_offload_fraction:.0%} of the optimizer state and"
                     f" its update on the host: {optimizer.memory_bytes(on_host=True):,} bytes on rank 0's host")
    compiled = compiled_layers.compile_layers(model) if train_cfg.compile_layers else 0
    ckpt = Checkpointer(model_cfg, train_cfg, model, optimizer, groups, device, scheduler)
    iteration, consumed = ckpt.load()
    train_ds, valid_ds, _ = datasets
    logger, timers, profiler = open_observability(model_cfg, train_cfg, groups, device, iteration)
    sizes = batch_schedule.build(train_cfg, model_cfg.seq_length)  # the global batch by consumed samples
    metrics = MetricsLog(train_cfg.log_metrics_jsonl, groups, iteration > 0, device)
    flops_profiler = FlopsProfiler(train_cfg, model, groups, device)  # --flops-profiler-step
    print_rank_0(f"> training for {train_cfg.train_iters} iterations ({len(train_ds)} samples per epoch)")
    predicted = predicted_step_line(model_cfg, train_cfg, groups.world_size, device) if groups.rank == 0 else None
    if predicted:  # on a known GPU: the planner's step time, to read beside the measured ones
        print_rank_0(predicted)
    schedule = groups.layout.schedule  # --pipeline-schedule's (resolve.parallel_layout)
    forward_backward_func = functools.partial(get_forward_backward_func(schedule, model_cfg.calculate_per_token_loss),
                                              timers=timers)
    router_losses = moe_hooks.bind(model)  # what the MoE layers record into, step after step
    rerun = RerunCheck.of(train_cfg, model_cfg, groups, ddp, device)  # None: --rerun-mode has nothing to do
    stragglers = StragglerReport.of(train_cfg, groups)  # None without --log-straggler
    model.train()
    set_matmul_precision(model_cfg, train_cfg)
    collector = ManualGC(train_cfg)
    collector.start()
    # +2: past first-call costs
    trace_iter = min(iteration + 2, train_cfg.train_iters) if train_cfg.pipeline_trace else None
    start, memory_reported = iteration, False
    # activations that do not fit: one line with the estimator's figure and the flags that help (memory_errors.py)
    out_of_memory = functools.partial(running, rank=groups.rank, estimate=lambda: estimated_peak(
        model_cfg, train_cfg, groups.world_size, groups.pp_rank))
    for iteration in range(start + 1, (start if train_cfg.skip_train else train_cfg.train_iters) + 1):
        fault_point("train.iteration", iteration, groups.rank)
        profiler.before(iteration)
        global_batch = sizes.batch_size(consumed)
        with timers("batch-generator", 2):
            batches = microbatches(train_ds, consumed, global_batch, train_cfg.micro_batch_size,
                                   groups.dp_rank, groups.dp_size, device, spec.collate, cp_slice(groups))
        trace = [] if iteration == trace_iter else None
        fb = forward_backward_func if trace is None else functools.partial(forward_backward_func, trace=trace)
        fb = stragglers.timed(fb, iteration) if stragglers else fb
        with out_of_memory(f"iteration {iteration}"), flops_profiler.step(iteration):
            losses, grad_norm, lr, updated = train_step(model, ddp, optimizer, scheduler, batches, spec.forward_step,
                                                        groups, iteration, fb, spec.loss_terms, model_cfg,
                                                        timers=timers, lr_increment=global_batch,
                                                        empty_cache_level=train_cfg.empty_unused_memory_level,
                                                        router_losses=router_losses, rerun=rerun)
        stats = step_stats(optimizer, train_cfg, updated, timers)
        flops_profiler.report(iteration, num_floating_point_operations(model_cfg, global_batch), logger.writers,
                              metrics)
        if compiled and iteration == start + 1:  # the layers compiled in this iteration's first forward
            print_rank_0(compiled_layers.compile_report(compiled, device))
        if trace is not None:
            write_pipeline_trace(train_cfg.pipeline_trace, trace, groups, model_cfg, len(batches), iteration,
                                 schedule)
        consumed += global_batch
        logger.add_iteration(losses, grad_norm, updated, iteration, consumed, lr, global_batch,
                             optimizer.loss_scale, stats, device)
        metrics.iteration(iteration, consumed, losses, grad_norm, lr, updated,
                          optimizer.loss_scale if train_cfg.fp16 else None, stats)
        if train_cfg.check_for_nan_in_loss_and_grad:  # before this iteration can be saved
            check_finite(iteration, losses, grad_norm, groups, device)
        if iteration % train_cfg.log_interval == 0 or iteration == train_cfg.train_iters:
            if device.type == "cuda":
                torch.cuda.synchronize()
            logger.log(iteration, consumed, lr, global_batch, num_floating_point_operations(model_cfg, global_batch),
                       groups.world_size, optimizer.loss_scale if train_cfg.fp16 else None)
            if stragglers:
                stragglers.report(iteration)
            if not memory_reported:  # as Megatron-LM, once: the peaks after the first logged iterations
                report_memory(iteration, groups, model_cfg, train_cfg, device)
                memory_reported = True
            balance = moe_hooks.balance_line(model_cfg, groups, device, router_losses)
            if balance:
                print_rank_last(f" iteration {iteration:8d} |{balance}")
        if train_cfg.eval_iters > 0 and train_cfg.eval_interval and iteration % train_cfg.eval_interval == 0:
            collector.before_evaluation()
            with out_of_memory(f"the evaluation at iteration {iteration}"):
                valid = evaluate(model, validation_window(valid_ds, iteration, train_cfg), spec, groups, train_cfg,
                                 device)
            collector.after_evaluation()
            logger.log_validation(iteration, valid, consumed=consumed)
            metrics.validation(iteration, valid)
            logger.reset_timer()  # evaluation time is not training time
        profiler.after(iteration)
        collector.after_iteration(iteration)
        if ckpt.after_iteration(iteration, consumed):
            break
        if train_cfg.exit_interval and iteration % train_cfg.exit_interval == 0:
            print_rank_0(f"> exiting at iteration {iteration} (--exit-interval {train_cfg.exit_interval})")
            break
        if exit_duration_reached(train_cfg, device):
            print_rank_0(f"> exiting at iteration {iteration}: --exit-duration-in-mins "
                         f"{train_cfg.exit_duration_in_mins} passed")
            break
    profiler.close()
    if rerun is not None and (line := rerun.summary()):
        print(line, flush=True)
    ddp.finish_param_sync()
    ckpt.finish(iteration, consumed)
    for split, ds in end_of_training_sets(datasets, iteration, train_cfg):
        with out_of_memory(f"the {split} evaluation after iteration {iteration}"):
            losses = evaluate(model, ds, spec, groups, train_cfg, device)
        logger.log_validation(iteration, losses, split, consumed)
        metrics.validation(iteration, losses, split)
    logger.close()
    metrics.close()
    collector.finish()
