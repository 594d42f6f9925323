"""AdamW with Megatron's parameter groups, global-norm clipping, and the LR schedule."""
from .optimizer import build_optimizer
from .clip_grads import get_grad_norm, clip_grads_
from .lr_scheduler import LRScheduler
