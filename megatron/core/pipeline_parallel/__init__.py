"""Pipeline parallelism: layer split, schedules as data, one executor, p2p, simulator, the loss contract."""
from .executor import as_chunks, forward_backward, get_forward_backward_func
from .losses import TOKEN_LOSS, LossDeclaration, LossTerms, ReducedLosses, loss_means
from .schedules import SCHEDULES, Action, Op, build_schedule, default_schedule
from .split import layer_split, stage_layers
