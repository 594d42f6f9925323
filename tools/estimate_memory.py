"""Predict the memory each rank holds, without running (megatron/training/planner/memory.py):
parameters, gradients, optimizer state (exact: the same model code on the meta device and DDP's own
buffer layout) and activations (Korthikanti et al. 2022).

    python tools/estimate_memory.py --world-size 8 --tensor-model-parallel-size 2 \
        --num-layers 24 --hidden-size 2048 --num-attention-heads 16 --seq-length 2048 \
        --micro-batch-size 4 --bf16 --use-distributed-optimizer --vocab-size 50257

Takes pretrain_gpt.py's flags plus --world-size; the flags training needs that change no byte (data,
--lr, --train-iters) default to the planner's (--mock-data unless data flags are given).
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from megatron.core.errors import MegatronUserError  # noqa: E402
from megatron.training.config.arguments import parse_args
from megatron.training.config.resolve import resolve, validate
from megatron.training.planner.memory import estimate, total_bytes  # noqa: E402
from megatron.training.planner.predict import PLAN_DEFAULTS  # noqa: E402


def _defaults(data, length):
    """PLAN_DEFAULTS without --mock-data when data flags are given, or --train-iters with a length."""
    out, it = [], iter(PLAN_DEFAULTS)
    for flag in it:
        value = [] if flag == "--mock-data" else [next(it)]
        if not ((data and flag == "--mock-data") or (length and flag == "--train-iters")):
            out += [flag] + value
    return out


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--world-size", type=int, default=1)
    known, rest = pre.parse_known_args(argv)
    given = {a.split("=")[0] for a in rest}
    data, length = given & {"--data-path", "--train-data-path"}, given & {"--train-iters", "--train-samples"}
    rest = _defaults(data, length) + rest  # the user's own flags come after and win
    try:
        if known.world_size < 1:
            raise MegatronUserError(f"--world-size must be at least 1, got {known.world_size}")
        model_cfg, t = parse_args(rest)
        resolve(model_cfg, t, known.world_size)
        layout = validate(model_cfg, t, known.world_size)
        stages = [estimate(model_cfg, t, known.world_size, r) for r in range(layout.pp)]
    except MegatronUserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for r, est in enumerate(stages):
        total = total_bytes(est)
        print(f"stage {r} ({est['layers']} layers), per rank (world {known.world_size}): "
              f"bytes: params {est['params']:,}"
              f" grads {est['grads']:,} optimizer {est['optimizer']:,}"
              + (f" (+ gathered parameters up to {est['gathered']:,})" if est["gathered"] else "")
              + f" | activations {est['activations']:,} per"
              f" microbatch x {est['in_flight']} in flight | total {total / 2**30:.2f} GiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
