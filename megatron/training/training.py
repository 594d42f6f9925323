"""The pretrain loop: build, then per iteration microbatches -> grads -> reduce -> clip -> step."""
import functools
import json

import torch
import torch.distributed as dist
from torch import nn

from ..core.distributed import DistributedDataParallel, finalize_model_grads
from ..core.optimizer import LRScheduler, get_megatron_optimizer
from ..core.optimizer.grad_scaler import ConstantGradScaler, DynamicGradScaler
from ..core.pipeline_parallel import default_schedule, get_forward_backward_func, global_counts
from ..core.pipeline_parallel.executor import DEFAULT_TERMS
from ..core.tensor_parallel.initialization import initialize_parameters
from .checkpointing import Checkpointer
from .data import microbatches
from .flops import num_floating_point_operations, peak_tflops_per_gpu
from .log import TrainingLogger, print_rank_0, startup_summary


def build_model(model_provider, model_cfg, groups, device):
    """This rank's part of the model: one chunk per virtual pipeline stage, a module when
    there is one chunk, else an nn.ModuleList (chunk v is virtual stage v * P + pp_rank).

    model_provider(config, groups, device, pre_process, post_process, vp_stage) builds one
    chunk; the embedding goes on the first stage's first chunk, the loss on the last's last.
    """
    V = model_cfg.virtual_pipeline_model_parallel_size or 1
    chunks = [model_provider(model_cfg, groups, device, pre_process=groups.is_first_stage and v == 0,
                             post_process=groups.is_last_stage and v == V - 1, vp_stage=v)
              for v in range(V)]
    return chunks[0] if V == 1 else nn.ModuleList(chunks)


def train_step(model, ddp, optimizer, scheduler, batches, forward_step, groups, iteration,
               forward_backward_func=None, loss_terms=None):
    """One iteration. Returns (loss tensor, grad_norm tensor or None, lr, updated); updated
    is False when fp16 gradients overflowed and the step was skipped. No host sync but fp16's.

    The microbatches run through forward_backward_func (default: the schedule for this
    layout, pipeline_parallel.get_forward_backward_func()). Each contributes
    sum(loss x mask) / tokens(global batch), so the summed gradient over microbatches and
    DP ranks is that of the mean per-token loss of the global batch, whatever the layout.
    The loss returned is that mean (DP-reduced) on the last pipeline stage, 0 elsewhere;
    with loss_terms ({name: mask key}, see forward_backward) a dict of such means.
    """
    ddp.start_step(len(batches))
    forward_backward_func = forward_backward_func or get_forward_backward_func()
    kwargs = {"loss_terms": loss_terms} if loss_terms else {}
    loss = forward_backward_func(model, batches, forward_step, groups, loss_scale=optimizer.loss_scale, **kwargs)
    finalize_model_grads(model, groups, ddp)
    lr = scheduler.step(iteration)
    updated, grad_norm = optimizer.step()
    return loss, grad_norm, lr, updated


@torch.no_grad()
def evaluate(model, dataset, forward_step, groups, train_cfg, device, loss_terms=None, collate=None):
    """Mean per-token loss over eval_iters global batches from the start of `dataset`
    (forward-only schedule; the figure is valid on the last pipeline stage, 0 elsewhere).
    With loss_terms: {name: mean} instead, each term averaged over its own count."""
    model.eval()
    terms = loss_terms or DEFAULT_TERMS
    total = torch.zeros(len(terms), device=device)
    counts = torch.zeros(len(terms), device=device)
    g, mb = train_cfg.global_batch_size, train_cfg.micro_batch_size
    forward_backward_func = get_forward_backward_func()
    kwargs = {"loss_terms": loss_terms} if loss_terms else {}
    for k in range(train_cfg.eval_iters):
        batches = microbatches(dataset, k * g, g, mb, groups.dp_rank, groups.dp_size, device, collate)
        loss = forward_backward_func(model, batches, forward_step, groups, forward_only=True, **kwargs)
        if groups.is_last_stage:
            n = global_counts(batches, groups, terms)
            total += torch.stack(list(loss.values())) * n if loss_terms else loss * n
            counts += n
    model.train()
    means = (total / counts).tolist() if groups.is_last_stage else [0.0] * len(terms)
    return dict(zip(terms, means)) if loss_terms else means[0]


def write_pipeline_trace(path, trace, groups, model_cfg, num_micro, iteration):
    """Gather one iteration's (kind, chunk, mb, start, end) per action over groups.pp;
    global rank 0 writes them as JSON for tools/pipeline_timeline.py --trace."""
    spans = [None] * groups.pp_size
    dist.all_gather_object(spans, trace, group=groups.pp)
    if groups.rank == 0:
        V = model_cfg.virtual_pipeline_model_parallel_size or 1
        with open(path, "w") as f:
            json.dump({"schedule": default_schedule(groups.pp_size, V), "P": groups.pp_size, "M": num_micro,
                       "V": V, "iteration": iteration, "ranks": dict(enumerate(spans))}, f)
        print(f"> wrote the pipeline schedule timeline of iteration {iteration} to {path}", flush=True)


def build_scheduler(optimizer, train_cfg):
    t = train_cfg
    decay = t.lr_decay_iters or t.train_iters
    warmup = int(t.lr_warmup_fraction * decay) if t.lr_warmup_fraction is not None else t.lr_warmup_iters
    return LRScheduler(optimizer, t.lr, t.min_lr, decay, min(warmup, decay), t.lr_decay_style,
                       t.lr_wsd_decay_iters, t.lr_wsd_decay_style)


def build_grad_scaler(t):
    """None for fp32/bf16; a constant or dynamic loss scaler for fp16."""
    if not t.fp16:
        return None
    if t.loss_scale is not None:
        return ConstantGradScaler(t.loss_scale)
    return DynamicGradScaler(t.initial_loss_scale, t.min_loss_scale, growth_interval=t.loss_scale_window,
                             hysteresis=t.hysteresis)


def setup_model_and_optimizer(model_cfg, t, groups, device, model_provider):
    """Model chunks (initialised layout-free), their DDP buffers, the optimizer and LR schedule."""
    model = build_model(model_provider, model_cfg, groups, device)
    initialize_parameters(model, t.seed, groups.tp_rank, groups.tp_size)
    ddp = DistributedDataParallel(model, groups.dp, t.ddp_bucket_size, t.overlap_grad_reduce,
                                  t.use_distributed_optimizer, t.overlap_param_gather, t.grad_reduce_in_bf16)
    optimizer = get_megatron_optimizer(ddp, groups, t.lr, t.weight_decay, (t.adam_beta1, t.adam_beta2),
                                       t.adam_eps, t.clip_grad, build_grad_scaler(t))
    return model, ddp, optimizer, build_scheduler(optimizer, t)


def pretrain(model_cfg, train_cfg, groups, device, model_provider, forward_step, datasets, tokenizer_name,
             loss_terms=None, collate=None):
    """Train model_provider(config, groups, device, pre_process, post_process, vp_stage)
    on datasets = (train, valid); every pipeline stage loads the same batches.

    forward_step(model, batch) -> (per-token loss [b, s], loss mask [b, s]) on the last
    pipeline stage, (hidden states, loss mask) on the others. With loss_terms ({name: batch
    key of its mask}, see pipeline_parallel.forward_backward) the last stage returns
    ({name: loss}, {name: mask}) and each term is logged. collate(samples, device) -> batch
    dict (default: GPT's tokens / labels / loss_mask, training/data.py).
    Returns the list of per-iteration losses (floats) seen by this rank.
    """
    t = train_cfg
    model, ddp, optimizer, scheduler = setup_model_and_optimizer(model_cfg, t, groups, device, model_provider)
    startup_summary(model, model_cfg, t, groups, device, tokenizer_name,
                    ddp.memory_bytes() + (optimizer.memory_bytes(),))
    ckpt = Checkpointer(model_cfg, t, model, optimizer, groups, device)
    iteration, consumed = ckpt.load()
    train_ds, valid_ds = datasets
    peak = peak_tflops_per_gpu(device, model_cfg.params_dtype)
    logger = TrainingLogger(t.train_iters, t.tensorboard_dir, peak[1] if peak else None)
    flops = num_floating_point_operations(model_cfg, t.global_batch_size)
    print_rank_0(f"> training for {t.train_iters} iterations ({len(train_ds)} samples per epoch)")
    history = []
    forward_backward_func = get_forward_backward_func()
    model.train()
    trace_iter = min(iteration + 2, t.train_iters) if t.pipeline_trace else None  # +2: past first-call costs
    start = iteration
    for iteration in range(start + 1, t.train_iters + 1):
        batches = microbatches(train_ds, consumed, t.global_batch_size, t.micro_batch_size,
                               groups.dp_rank, groups.dp_size, device, collate)
        trace = [] if iteration == trace_iter else None
        fb = forward_backward_func if trace is None else functools.partial(forward_backward_func, trace=trace)
        loss, grad_norm, lr, updated = train_step(model, ddp, optimizer, scheduler, batches, forward_step,
                                                  groups, iteration, fb, loss_terms)
        if trace is not None:
            write_pipeline_trace(t.pipeline_trace, trace, groups, model_cfg, len(batches), iteration)
        consumed += t.global_batch_size
        logger.add_iteration(loss, grad_norm, updated)
        if iteration % t.log_interval == 0 or iteration == t.train_iters:
            if device.type == "cuda":
                torch.cuda.synchronize()
            history.append(logger.log(iteration, consumed, lr, t.global_batch_size, flops, groups.world_size,
                                      optimizer.loss_scale if t.fp16 else None))
        if t.eval_iters > 0 and (iteration % t.eval_interval == 0 or iteration == t.train_iters):
            logger.log_validation(iteration, evaluate(model, valid_ds, forward_step, groups, t, device,
                                                      loss_terms, collate))
            logger.reset_timer()  # evaluation time is not training time
        if ckpt.after_iteration(iteration, consumed):
            break
        if t.exit_interval and iteration % t.exit_interval == 0:
            print_rank_0(f"> exiting at iteration {iteration} (--exit-interval {t.exit_interval})")
            break
    ddp.finish_param_sync()
    ckpt.finish(iteration, consumed)
    logger.close()
    return model, history
