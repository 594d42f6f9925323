"""Rank every parallel layout of a model on a GPU cluster by predicted step time (docs/planner.md).

    python tools/plan.py --gpu A100-80GB --num-gpus 64 --gpus-per-node 8 \
        --num-layers 24 --hidden-size 2304 --num-attention-heads 24 --seq-length 2048 \
        --max-position-embeddings 2048 --vocab-size 51200 --global-batch-size 512 --bf16

Takes pretrain_gpt.py's model and training flags; the layout flags (TP, PP, VPP, micro batch, SP,
distributed optimizer or ZeRO stage, recompute, CP, EP for MoE) are what it searches. --fix tp=8
--fix recompute=full pins a dimension. `python tools/plan.py --validate` prints the validation table of docs/planner.md.
Memory is megatron/training/planner/memory.py's (tools/estimate_memory.py); time is
megatron/training/planner/cost.py's model with the calibration in megatron/training/planner/calibration.toml.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from megatron.core.errors import MegatronUserError
from megatron.core.ranges import POSITIVE, check_ranges
from megatron.training.planner import gpu_names, make_cluster, plan
from megatron.training.planner.layouts import DIMENSIONS
from megatron.training.planner.validate import markdown, validate_table
from tools.plan_checks import Progress, check_model, first_refusal, nothing_fits


def _fixed(items):
    out = {}
    names = {d.name for d in DIMENSIONS}
    for item in items:
        name, _, value = item.partition("=")
        if name not in names or not value:
            raise MegatronUserError(f"--fix {item!r}: give name=value with name one of {', '.join(sorted(names))}")
        out[name] = {"true": True, "false": False, "none": None}.get(value.lower(), value)
        if name in ("tp", "pp", "vpp", "mb", "cp", "ep"):
            if not value.isdigit() or int(value) < 1:
                raise MegatronUserError(f"--fix {item!r}: {name} takes a positive integer, e.g. --fix {name}=2")
            out[name] = int(value)
    return out


# cluster overrides: not given (None) keeps the calibration's value; given, a positive finite number
CLUSTER_RULES = {"gpu_memory_gb": POSITIVE, "nvlink_gbps": POSITIVE, "network_gbps": POSITIVE}


def _check_counts(known):
    if known.num_gpus < 1 or known.gpus_per_node < 1:
        raise MegatronUserError("--num-gpus and --gpus-per-node must be positive")
    if known.top < 1:
        raise MegatronUserError(f"--top must be at least 1 (rows to print), got {known.top}")
    check_ranges(known, CLUSTER_RULES, lambda name: "--" + name.replace("_", "-"))


def table(preds, cluster, top):
    head = (f"{'#':>3} {'layout':<40} {'s/iter':>8} {'tokens/s':>10} {'TFLOP/s':>8} {'MFU':>6} "
            f"{'bubble':>7} {'mem GB':>7} fits")
    lines = [head]
    for i, p in enumerate(preds[:top]):
        lines.append(f"{i + 1:>3} {p.label:<40} {p.step.total:>8.3f} {p.tokens_per_s:>10,.0f} "
                     f"{p.tflops_per_gpu:>8.1f} {100 * p.mfu:>5.1f}% {100 * p.step.bubble:>6.1f}% "
                     f"{p.memory_bytes / 1e9:>7.1f} {'yes' if p.fits else 'NO'}")
    return "\n".join(lines)


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--gpu", default="A100-80GB")
    pre.add_argument("--num-gpus", type=int, default=8)
    pre.add_argument("--gpus-per-node", type=int, default=8)
    pre.add_argument("--nvlink-gbps", type=float, help="NVLink GB/s per GPU and direction (default: calibration)")
    pre.add_argument("--network-gbps", type=float, help="network GB/s per GPU and direction (default: calibration)")
    pre.add_argument("--gpu-memory-gb", type=float, help="usable memory per GPU in GB (default: calibration)")
    pre.add_argument("--fix", action="append", default=[], help="pin a dimension: name=value (repeatable)")
    pre.add_argument("--search", choices=["default", "full"], default="default",
                     help="full also tries SP off with TP and no distributed optimizer with DP")
    pre.add_argument("--search-fp8", action="store_true",
                     help="also try each layout with --fp8-format hybrid --fp8-recipe tensorwise (GPUs with FP8)")
    pre.add_argument("--top", type=int, default=20, help="rows to print")
    pre.add_argument("--validate", action="store_true",
                     help="print the planner against Narayanan et al. 2021 Table 1 (docs/planner.md) and exit")
    known, rest = pre.parse_known_args(argv)
    if known.validate:
        print(markdown(validate_table()))
        return 0
    try:
        if known.gpu not in gpu_names():
            raise MegatronUserError(f"--gpu {known.gpu}: unknown; one of {', '.join(gpu_names())}")
        _check_counts(known)
        cluster = make_cluster(known.gpu, known.num_gpus, known.gpus_per_node, known.nvlink_gbps,
                               known.network_gbps, known.gpu_memory_gb)
        fixed, full = _fixed(known.fix), known.search == "full"
        check_model(rest)  # a bad model size names its flag, before any layout is tried
        preds, refused = plan(rest, cluster, fixed, full, known.search_fp8, Progress(known.num_gpus))
        if not preds:
            why = first_refusal(rest, cluster, fixed, full, known.search_fp8) if refused else None
            raise MegatronUserError(f"no valid layout of this model on {known.num_gpus} GPUs ({refused} refused by "
                                    "the configuration checks" + (f", e.g. {why}" if why else "") +
                                    "); change --num-gpus or --global-batch-size")
    except MegatronUserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"{len(preds)} layouts on {known.num_gpus} x {known.gpu} ({known.gpus_per_node} per node), "
          f"{sum(p.fits for p in preds)} fit in {cluster.memory_bytes / 1e9:.0f} GB; {refused} refused by the checks")
    print(table(preds, cluster, known.top))
    best = preds[0]
    if not best.fits:
        print(f"error: {nothing_fits(preds, cluster)}", file=sys.stderr)
        return 2
    print("\nbest layout:\n  torchrun --nnodes {} --nproc-per-node {} pretrain_gpt.py {}".format(
        max(1, known.num_gpus // known.gpus_per_node), min(known.num_gpus, known.gpus_per_node),
        " ".join(rest + best.flags[len(rest):])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
