"""Predict one layout (memory, step time, throughput) and rank all of them.

    cluster = make_cluster("A100-80GB", num_gpus=64)
    best = plan(["--num-layers", "24", ..., "--global-batch-size", "512"], cluster)[0]

Memory is memory.py's (tools/estimate_memory.py's), called as is (so the two never disagree); time is cost.py's.
predict_resolved() takes the resolved configs training already holds, so a training log can print
the predicted step time beside the measured one.
"""
import dataclasses

from ...core.errors import MegatronUserError
from ..config.arguments import parse_args
from ..config.resolve import parallel_layout, resolve, validate
from ..observability.flops import (
    core_attention_flops_per_token,
    decoder_forward_flops_per_token,
    num_floating_point_operations,
)
from .cost import StepTime, step_time
from .hardware import Cluster
from .layouts import Space, describe, enumerate_layouts, layout_flags
from .memory import estimate, stage_params, total_bytes
from .traffic import sequence_parallel_grad_bytes

# flags training requires that do not change the plan; the user's own come after them and win
PLAN_DEFAULTS = ["--mock-data", "--lr", "1e-4", "--train-iters", "1"]
@dataclasses.dataclass
class Prediction:
    label: str
    flags: list
    step: StepTime
    memory_bytes: int            # the most loaded pipeline stage, = memory.total_bytes of that stage
    fits: bool
    tokens_per_s: float
    tflops_per_gpu: float        # hardware FLOPs (activation recompute counted, as Narayanan et al. count)
    model_tflops_per_gpu: float  # megatron/training/observability/flops.py's model FLOPs (recompute not counted)
    mfu: float                   # model FLOPs / (time x GPUs x peak)


def hardware_flops(c, batch):
    """Model FLOPs plus what recompute adds: one more forward of every decoder layer (full: the logits and
    multi-token prediction's modules are not recomputed) or of every layer's attention scores and weighted
    sum (selective: multi-token prediction's layers too)."""
    model = num_floating_point_operations(c, batch)
    tokens = batch * c.seq_length
    if c.recompute_granularity == "full":
        return model + tokens * decoder_forward_flops_per_token(c)
    if c.recompute_granularity == "selective":
        return model + tokens * (c.num_layers + (c.mtp_num_layers or 0)) * core_attention_flops_per_token(c)
    return model


def predict_resolved(c, t, world_size, cluster: Cluster, label="", flags=()) -> Prediction:
    """Prediction for resolved and validated configs (resolve() + validate() done) on `cluster`."""
    layout = parallel_layout(c, t, world_size)
    tp, pp = layout.tp, layout.pp
    mems = [estimate(c, t, world_size, r) for r in range(pp)]
    memory = max(total_bytes(m) for m in mems)
    sp_bytes = max(sequence_parallel_grad_bytes(stage_params(c, t, world_size, r)[0], tp) for r in range(pp))
    step = step_time(c, t, cluster, layout, mems, sp_bytes)
    gbs, secs = t.global_batch_size, step.total
    model = num_floating_point_operations(c, gbs) / secs / world_size
    return Prediction(label, list(flags), step, memory, memory <= cluster.memory_bytes,
                      gbs * c.seq_length / secs, hardware_flops(c, gbs) / secs / world_size / 1e12,
                      model / 1e12, model / cluster.peak_flops)


def configs(argv, world_size):
    """(model config, training config) parsed, resolved and validated as training does. Raises
    MegatronUserError (ConfigError) for a layout training would refuse."""
    c, t = parse_args(PLAN_DEFAULTS + list(argv))[:2]
    resolve(c, t, world_size)
    validate(c, t, world_size)
    return c, t


def predict(argv, cluster: Cluster, label="") -> Prediction:
    """Prediction for pretrain_gpt.py flags `argv` (layout included) on all of cluster's GPUs."""
    c, t = configs(argv, cluster.num_gpus)
    return predict_resolved(c, t, cluster.num_gpus, cluster, label, argv)


def space_of(argv, cluster: Cluster, full=False, fp8=False) -> Space:
    """fp8: also try FP8 (layouts.FP8) where the flags do not choose it and the GPU has FP8 tensor cores;
    a GPU without them is a one-line error."""
    c, t = parse_args(PLAN_DEFAULTS + list(argv))[:2]
    if t.global_batch_size is None:
        raise MegatronUserError("--global-batch-size is required to plan (the batch the cluster must run)")
    if fp8 and cluster.peak_fp8_flops is None:
        raise MegatronUserError(f"--search-fp8: {cluster.gpu} has no FP8 tensor cores (no peak_fp8_tflops in "
                                "calibration.toml); drop --search-fp8")
    return Space(cluster.num_gpus, cluster.gpus_per_node, c.num_layers, c.num_attention_heads,
                 c.num_query_groups or c.num_attention_heads, t.global_batch_size, full, c.seq_length,
                 c.num_experts or 0, fp8 and c.fp8_format is None)


def plan(argv, cluster: Cluster, fixed: dict | None = None, full=False, fp8=False,
         progress=None) -> tuple[list, int]:
    """(predictions of every valid layout, best first: fitting ones by step time, then the ones that
    do not fit by step time; number of layouts training would refuse). fp8: search FP8 on and off.
    progress(done, total): called before each layout (a long search says how far it is)."""
    out, refused = [], 0
    layouts = list(enumerate_layouts(space_of(argv, cluster, full, fp8), fixed))
    for i, lay in enumerate(layouts):
        if progress is not None:
            progress(i, len(layouts))
        flags = layout_flags(lay)
        try:
            out.append(predict(list(argv) + flags, cluster, describe(lay)))
        except MegatronUserError:
            refused += 1
    out.sort(key=lambda p: (not p.fits, p.step.total, p.memory_bytes))  # ties (ZeRO-1 vs 2): less memory
    return out, refused
