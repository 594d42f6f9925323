"""--auto-parallel through the CLI: the planner's choice trains, prints itself, and is one process's function."""
import re

from megatron.core.checkpointing import find_checkpoint, read_metadata

from .cli import run_cli, run_metrics
from .test_parity import BASE, assert_metrics_parity, reference


def _without(flags, name):
    i = flags.index(name)
    return flags[:i] + flags[i + 2:]


# the micro batch is left to the planner too; the reference keeps BASE's (parity holds across micro batches)
AUTO = _without(BASE, "--micro-batch-size") + ["--auto-parallel", "--planner-gpu", "H100-SXM"]
SIZE = re.compile(r"\b(TP|PP|DP)(\d+)\b")


def test_auto_parallel_on_4_ranks_matches_one_process(tmp_path):
    proc, got = run_metrics(AUTO + ["--save", str(tmp_path / "ckpt")], nproc=4)
    chosen = re.search(r"> auto-parallel: chosen (.+?): predicted", proc.stdout)
    assert chosen, proc.stdout[-3000:]
    assert "> auto-parallel: the same run without it: torchrun --nnodes 1 --nproc-per-node 4 pretrain_gpt.py" \
        in proc.stdout
    assert proc.stdout.count("> auto-parallel: #") == 2  # the next two candidates, printed once
    assert_metrics_parity(reference([]), got)
    # the checkpoint records the layout the planner chose
    meta = read_metadata(find_checkpoint(str(tmp_path / "ckpt")))
    sizes = {k.lower(): int(v) for k, v in SIZE.findall(chosen.group(1))}
    assert {k: meta["layout"][k] for k in sizes} == sizes, (meta["layout"], chosen.group(1))
    assert meta["args"]["training"]["auto_parallel"] is True


def test_resume_at_another_world_size_picks_again_and_loads(tmp_path):
    ckpt = str(tmp_path / "ckpt")
    flags = _without(AUTO, "--eval-interval") + ["--save", ckpt, "--load", ckpt]
    run_cli(flags + ["--train-iters", "4"], nproc=4)
    proc = run_cli(flags + ["--train-iters", "6"], nproc=2)
    assert "> auto-parallel: the same run without it: torchrun --nnodes 1 --nproc-per-node 2" in proc.stdout
    assert re.search(r"> loaded checkpoint .* at iteration 4", proc.stdout), proc.stdout[-3000:]
    assert re.search(r"iteration\s+6/\s*6", proc.stdout)
