"""The learning-rate schedule and the fp16 loss scaler the trainer builds from the training flags."""
from ...core.optimizer import LRScheduler
from ...core.optimizer.grad_scaler import ConstantGradScaler, DynamicGradScaler


def build_scheduler(optimizer, train_cfg):
    """The LR schedule in samples, as Megatron-LM's get_optimizer_param_scheduler: iteration flags
    times the global batch, or the sample flags as given; the warm-up fraction is not rounded. A
    warm-up longer than the decay is cut to it (Megatron-LM refuses it). With a batch-size schedule the
    iteration flags count its last batch size, and each step adds the samples its iteration took
    (batch_schedule.py). --decoupled-lr / --decoupled-min-lr: the embedding and output layer's bounds."""
    t, gbs = train_cfg, train_cfg.global_batch_size
    if t.train_samples is not None:
        decay, warmup, wsd = t.lr_decay_samples or t.train_samples, t.lr_warmup_samples, t.lr_wsd_decay_samples
    else:
        decay, warmup = (t.lr_decay_iters or t.train_iters) * gbs, t.lr_warmup_iters * gbs
        wsd = t.lr_wsd_decay_iters * gbs if t.lr_wsd_decay_iters is not None else None
    if t.lr_warmup_fraction is not None:
        warmup = t.lr_warmup_fraction * decay
    decoupled = None if t.decoupled_lr is None else (t.decoupled_lr, t.min_lr if t.decoupled_min_lr is None
                                                     else t.decoupled_min_lr)
    return LRScheduler(optimizer, t.lr, t.min_lr, decay, min(warmup, decay), t.lr_decay_style, wsd,
                       t.lr_wsd_decay_style, t.lr_warmup_init, step_size=gbs, decoupled=decoupled)


def build_grad_scaler(train_cfg):
    """None for fp32/bf16; a constant or dynamic loss scaler for fp16."""
    if not train_cfg.fp16:
        return None
    if train_cfg.loss_scale is not None:
        return ConstantGradScaler(train_cfg.loss_scale)
    return DynamicGradScaler(train_cfg.initial_loss_scale, train_cfg.min_loss_scale,
                             growth_interval=train_cfg.loss_scale_window, hysteresis=train_cfg.hysteresis)
