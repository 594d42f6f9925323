"""Mixed-precision, optionally distributed AdamW, SGD or Muon; global-norm clipping; LR schedule; loss scaling."""
from .clip_grads import clip_grads_, get_grad_norm, global_norm
from .distributed_optimizer import DistributedOptimizer
from .grad_scaler import ConstantGradScaler, DynamicGradScaler
from .lr_scheduler import LRScheduler
from .megatron_optimizer import STATE_NAMES, MegatronOptimizer, StatePiece
from .muon import MuonConfig


def get_megatron_optimizer(ddp, groups, lr, weight_decay, betas=(0.9, 0.95), eps=1e-8, clip_grad=1.0,
                           grad_scaler=None, cpu_offload_fraction=0.0, optimizer="adam", sgd_momentum=0.9, muon=None,
                           file_offload=None):
    """The optimizer for `ddp`: DistributedOptimizer when its config shards the optimizer state.
    cpu_offload_fraction: share of the optimizer state kept and updated on the host (cpu_offload.py).
    optimizer: "adam", "sgd" or "muon" (Muon on the hidden matrices, AdamW on the rest; muon: a MuonConfig).
    file_offload: nvme_offload.FileOffload: the host share's state in a file (--optimizer-offload-path)."""
    cls = DistributedOptimizer if ddp.config.shards_optimizer else MegatronOptimizer
    return cls(ddp, groups, lr, weight_decay, betas, eps, clip_grad, grad_scaler, cpu_offload_fraction, optimizer,
               sgd_momentum, muon, file_offload)
