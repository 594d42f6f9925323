"""The pretrain loop: build, then per iteration microbatches -> grads -> reduce -> clip -> step."""
import torch
import torch.distributed as dist

from ..core.distributed import DistributedDataParallel, finalize_model_grads
from ..core.optimizer import LRScheduler
from ..core.optimizer.grad_scaler import ConstantGradScaler, DynamicGradScaler
from ..core.optimizer.megatron_optimizer import MegatronOptimizer
from ..core.tensor_parallel.initialization import initialize_parameters
from .checkpointing import Checkpointer
from .data import microbatches
from .flops import num_floating_point_operations
from .log import TrainingLogger, print_rank_0, startup_summary


def _global_tokens(batches, groups):
    """Loss-mask tokens in the whole global batch (summed over DP): the loss denominator."""
    n = torch.stack([b["loss_mask"].sum() for b in batches]).sum()
    if groups.dp_size > 1:
        dist.all_reduce(n, group=groups.dp)
    return n


def forward_backward(model, batches, forward_step, groups, loss_scale=1.0):
    """Run every microbatch forward and backward; gradients accumulate (DDP buffer or .grad).

    Each microbatch contributes sum(loss x mask) / tokens(global batch), so the summed
    gradient over microbatches and DP ranks is that of the mean per-token loss of the
    global batch, whatever the layout. loss_scale multiplies what is backpropagated (fp16).
    Returns the mean loss (fp32 tensor, DP-reduced, unscaled).
    """
    num_tokens = _global_tokens(batches, groups)
    total = torch.zeros((), device=num_tokens.device)
    for batch in batches:
        loss, mask = forward_step(model, batch)
        loss_sum = (loss.float() * mask).sum()
        (loss_sum * (loss_scale / num_tokens)).backward()
        total += loss_sum.detach()
    if groups.dp_size > 1:
        dist.all_reduce(total, group=groups.dp)
    return total / num_tokens


def train_step(model, ddp, optimizer, scheduler, batches, forward_step, groups, iteration):
    """One iteration. Returns (loss tensor, grad_norm tensor or None, lr, updated);
    updated is False when fp16 gradients overflowed and the step was skipped."""
    ddp.start_step(len(batches))
    loss = forward_backward(model, batches, forward_step, groups, optimizer.loss_scale)
    finalize_model_grads(model, groups, ddp)
    lr = scheduler.step(iteration)
    updated, grad_norm = optimizer.step()
    return loss, grad_norm, lr, updated


@torch.no_grad()
def evaluate(model, dataset, forward_step, groups, train_cfg, device):
    """Mean per-token loss over eval_iters global batches from the start of `dataset`."""
    model.eval()
    total = torch.zeros((), device=device)
    tokens = torch.zeros((), device=device)
    g, mb = train_cfg.global_batch_size, train_cfg.micro_batch_size
    for k in range(train_cfg.eval_iters):
        for batch in microbatches(dataset, k * g, g, mb, groups.dp_rank, groups.dp_size, device):
            loss, mask = forward_step(model, batch)
            total += (loss.float() * mask).sum()
            tokens += mask.sum()
    both = torch.stack([total, tokens])
    if groups.dp_size > 1:
        dist.all_reduce(both, group=groups.dp)
    model.train()
    return (both[0] / both[1]).item()


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
    """Model (initialised layout-free), its DDP buffers, the optimizer and LR schedule."""
    model = model_provider(model_cfg, groups, device)
    initialize_parameters(model, t.seed, groups.tp_rank, groups.tp_size)
    ddp = DistributedDataParallel(model, groups.dp, t.ddp_bucket_size, t.overlap_grad_reduce,
                                  t.use_distributed_optimizer, t.overlap_param_gather, t.grad_reduce_in_bf16)
    optimizer = MegatronOptimizer(ddp, groups, t.lr, t.weight_decay, (t.adam_beta1, t.adam_beta2), t.adam_eps,
                                  t.clip_grad, build_grad_scaler(t))
    return model, ddp, optimizer, build_scheduler(optimizer, t)


def pretrain(model_cfg, train_cfg, groups, device, model_provider, forward_step, datasets, tokenizer_name):
    """Train model_provider(config, groups, device) on datasets = (train, valid).

    forward_step(model, batch) -> (per-token loss [b, s], loss mask [b, s]).
    Returns the list of per-iteration losses (floats) seen by this rank.
    """
    t = train_cfg
    model, ddp, optimizer, scheduler = setup_model_and_optimizer(model_cfg, t, groups, device, model_provider)
    startup_summary(model, model_cfg, t, groups, device, tokenizer_name,
                    ddp.memory_bytes() + (optimizer.memory_bytes(),))
    ckpt = Checkpointer(model_cfg, t, model, optimizer, groups, device)
    iteration, consumed = ckpt.load()
    train_ds, valid_ds = datasets
    logger = TrainingLogger(t.train_iters, t.tensorboard_dir)
    flops = num_floating_point_operations(model_cfg, t.global_batch_size)
    print_rank_0(f"> training for {t.train_iters} iterations ({len(train_ds)} samples per epoch)")
    history = []
    model.train()
    for iteration in range(iteration + 1, t.train_iters + 1):
        batches = microbatches(train_ds, consumed, t.global_batch_size, t.micro_batch_size,
                               groups.dp_rank, groups.dp_size, device)
        loss, grad_norm, lr, updated = train_step(model, ddp, optimizer, scheduler, batches, forward_step,
                                                  groups, iteration)
        consumed += t.global_batch_size
        logger.add_iteration(loss, grad_norm, updated)
        if iteration % t.log_interval == 0 or iteration == t.train_iters:
            if device.type == "cuda":
                torch.cuda.synchronize()
            history.append(logger.log(iteration, consumed, lr, t.global_batch_size, flops, groups.world_size,
                                      optimizer.loss_scale if t.fp16 else None))
        if t.eval_iters > 0 and (iteration % t.eval_interval == 0 or iteration == t.train_iters):
            logger.log_validation(iteration, evaluate(model, valid_ds, forward_step, groups, t, device))
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
