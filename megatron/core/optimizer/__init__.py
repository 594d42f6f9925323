"""Mixed-precision, optionally distributed AdamW; global-norm clipping; LR schedule; loss scaling."""
from .clip_grads import clip_grads_, get_grad_norm, global_norm
from .grad_scaler import ConstantGradScaler, DynamicGradScaler
from .lr_scheduler import LRScheduler
from .megatron_optimizer import MegatronOptimizer
