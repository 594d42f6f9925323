"""The pretrain loop: build, then per iteration microbatches -> grads -> reduce -> clip -> step."""
import torch
import torch.distributed as dist

from ..core.distributed import finalize_model_grads
from ..core.optimizer import LRScheduler, build_optimizer, clip_grads_, get_grad_norm
from ..core.tensor_parallel.initialization import initialize_parameters
from .data import microbatches
from .flops import num_floating_point_operations, peak_tflops_per_gpu
from .log import TrainingLogger, print_rank_0, startup_summary


def _global_tokens(batches, groups):
    """Loss-mask tokens in the whole global batch (summed over DP): the loss denominator."""
    n = torch.stack([b["loss_mask"].sum() for b in batches]).sum()
    if groups.dp_size > 1:
        dist.all_reduce(n, group=groups.dp)
    return n


def forward_backward(model, batches, forward_step, groups):
    """Run every microbatch forward and backward; gradients accumulate in .grad.

    Each microbatch contributes sum(loss x mask) / tokens(global batch), so the summed
    gradient over microbatches and DP ranks is that of the mean per-token loss of the
    global batch, whatever the layout. Returns that mean loss (fp32 tensor, DP-reduced).
    """
    num_tokens = _global_tokens(batches, groups)
    total = torch.zeros((), device=num_tokens.device)
    for batch in batches:
        loss, mask = forward_step(model, batch)
        loss_sum = (loss.float() * mask).sum()
        (loss_sum / num_tokens).backward()
        total += loss_sum.detach()
    if groups.dp_size > 1:
        dist.all_reduce(total, group=groups.dp)
    return total / num_tokens


def train_step(model, optimizer, scheduler, batches, forward_step, groups, iteration, clip_grad, params):
    """One iteration over `params` (the model's, listed once). Returns (loss, grad_norm)
    as tensors and the LR used (no host sync)."""
    optimizer.zero_grad(set_to_none=True)
    loss = forward_backward(model, batches, forward_step, groups)
    finalize_model_grads(model, groups)
    grad_norm = get_grad_norm(params, groups)
    clip_grads_(params, clip_grad, grad_norm)
    lr = scheduler.step(iteration)
    optimizer.step()
    return loss, grad_norm, lr


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


def pretrain(model_cfg, train_cfg, groups, device, model_provider, forward_step, datasets, tokenizer_name):
    """Train model_provider(config, groups, device) on datasets = (train, valid).

    forward_step(model, batch) -> (per-token loss [b, s], loss mask [b, s]).
    Returns the list of per-iteration losses (floats) seen by this rank.
    """
    t = train_cfg
    model = model_provider(model_cfg, groups, device)
    initialize_parameters(model, t.seed, groups.tp_rank, groups.tp_size)
    optimizer = build_optimizer(model, t.lr, t.weight_decay, (t.adam_beta1, t.adam_beta2), t.adam_eps)
    scheduler = build_scheduler(optimizer, t)
    startup_summary(model, model_cfg, t, groups, device, tokenizer_name)
    train_ds, valid_ds = datasets
    peak = peak_tflops_per_gpu(device, model_cfg.params_dtype)
    logger = TrainingLogger(t.train_iters, t.tensorboard_dir, peak[1] if peak else None)
    flops = num_floating_point_operations(model_cfg, t.global_batch_size)
    print_rank_0(f"> training for {t.train_iters} iterations ({len(train_ds)} samples per epoch)")
    consumed, history = 0, []
    params = list(model.parameters())
    model.train()
    for iteration in range(1, t.train_iters + 1):
        batches = microbatches(train_ds, consumed, t.global_batch_size, t.micro_batch_size,
                               groups.dp_rank, groups.dp_size, device)
        loss, grad_norm, lr = train_step(model, optimizer, scheduler, batches, forward_step,
                                         groups, iteration, t.clip_grad, params)
        consumed += t.global_batch_size
        logger.add_loss(loss)
        if iteration % t.log_interval == 0 or iteration == t.train_iters:
            if device.type == "cuda":
                torch.cuda.synchronize()
            history.append(logger.log(iteration, consumed, lr, t.global_batch_size, grad_norm,
                                      flops, groups.world_size))
        if t.eval_iters > 0 and (iteration % t.eval_interval == 0 or iteration == t.train_iters):
            logger.log_validation(iteration, evaluate(model, valid_ds, forward_step, groups, t, device))
            logger.reset_timer()  # evaluation time is not training time
        if t.exit_interval and iteration % t.exit_interval == 0:
            print_rank_0(f"> exiting at iteration {iteration} (--exit-interval {t.exit_interval})")
            break
    logger.close()
    return model, history
