"""Pipeline parallelism: layer split, schedules as data, one executor, p2p, simulator."""
from .executor import as_chunks, forward_backward, global_counts, global_tokens
from .schedules import SCHEDULES, Action, Op, build_schedule, default_schedule, get_forward_backward_func
from .split import layer_split, stage_layers
