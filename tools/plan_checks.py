"""tools/plan.py's checks around the layout search: the model validated as pretrain_gpt.py validates it before
any layout is tried (so a bad size names its flag and rule, not "no valid layout"), the reason a search that
found nothing refused its layouts, a progress line while a long search runs, and the line that ends a plan
where nothing fits in memory (no "best" command is printed then)."""
import sys
import time

from megatron.core.errors import MegatronUserError
from megatron.training.config.arguments import parse_args
from megatron.training.planner.layouts import describe, enumerate_layouts, layout_flags
from megatron.training.planner.predict import PLAN_DEFAULTS, configs, predict, space_of


def check_model(argv) -> None:
    """MegatronUserError (the training CLI's one line) for model or training flags that no layout could fix:
    validated as training validates them at the smallest layout the flags allow (data parallel 1, micro batch
    1 unless given), which the search only ever divides further."""
    c, _ = parse_args(PLAN_DEFAULTS + list(argv))[:2]
    world = c.tensor_model_parallel_size * c.pipeline_model_parallel_size * c.context_parallel_size
    given = "--micro-batch-size" in argv
    configs(list(argv) + ([] if given else ["--micro-batch-size", "1"]), max(world, 1))


def first_refusal(argv, cluster, fixed, full, fp8) -> str | None:
    """'layout: why' of the first layout the configuration checks refuse (None when there is none)."""
    for lay in enumerate_layouts(space_of(argv, cluster, full, fp8), fixed):
        try:
            predict(list(argv) + layout_flags(lay), cluster)
        except MegatronUserError as e:
            return f"{describe(lay)}: {e}"
    return None


def nothing_fits(preds, cluster) -> str:
    """The error line of a plan where no layout fits in memory."""
    least = min(preds, key=lambda p: p.memory_bytes)
    return (f"no layout fits in {cluster.memory_bytes / 1e9:.3g} GB per GPU (the least memory, "
            f"{least.memory_bytes / 1e9:.3g} GB, is {least.label}); add GPUs, use GPUs with more memory, or "
            "shrink the model, the sequence or the global batch")


class Progress:
    """plan()'s progress callback: one line when the search starts (how many layouts), then one every
    `every` seconds with the layouts done and the time left, on stderr (stdout holds the table)."""

    def __init__(self, num_gpus, every=10.0, clock=time.monotonic, out=None):
        self.num_gpus, self.every, self.clock, self.out = num_gpus, every, clock, out or sys.stderr
        self.start = self.last = None

    def __call__(self, done, total):
        now = self.clock()
        if self.start is None:
            self.start = self.last = now
            print(f"> planning: {total} layouts on {self.num_gpus} GPUs", file=self.out, flush=True)
            return
        if now - self.last < self.every or done >= total:
            return
        self.last = now
        left = (now - self.start) / done * (total - done)
        print(f"> planned {done} of {total} layouts ({now - self.start:.0f} s, about {left:.0f} s left; "
              "--fix pins a dimension to search fewer)", file=self.out, flush=True)
