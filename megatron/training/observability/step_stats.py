"""--log-num-zeros-in-grad and --log-params-norm: what Megatron-LM computes after each step.

Both are the whole model's, each element once, whatever the layout (the optimizer reduces them as it
reduces the grad norm: TP and PP shards, DP shards of the distributed optimizer and ZeRO-2/3, expert
shards), so one process and any layout report the same numbers. They stay device tensors: the
iteration line and the scalar writers read them at the next log line's host sync.
"""
from ...core.timers import phase


def step_stats(optimizer, options, updated, timers=None):
    """{"num-zeros": int64 tensor, "params-norm": fp32 tensor} as the flags in `options` ask (Megatron-LM's
    TensorBoard names); no zeros for a skipped fp16 step, as Megatron-LM. Collective over the world."""
    out = {}
    if options.log_num_zeros_in_grad and updated:
        with phase(timers, "optimizer-count-zeros", 1):
            out["num-zeros"] = optimizer.count_zeros()
    if options.log_params_norm:
        out["params-norm"] = optimizer.params_norm()
    return out
