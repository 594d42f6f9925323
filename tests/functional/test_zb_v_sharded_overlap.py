"""ZB-V with the distributed optimizer and overlapped gradient reduction, tied embeddings (GPT's
default), through the CLI, fp32: the per-iteration losses and grad norms of one process (4
iterations, test_parity.py's tiny model with 8 layers). Rank 0 holds both copies of the tied table
(chunk 0's input, chunk 1's output); each copy's optimizer shard is a different slice, so the
copies' gradients are summed on rank 0 before the DP reduce-scatter, and DDP holds the buckets
with a copy back until then (ddp.tied_reduced_last). Refused before; a bucket started early was
off by a few percent. Default buckets (ZeRO-1, one bucket holds both copies and the rest), and
ZeRO-3 (optim_grads_params: sharded gradients, one bucket per unit, so the copies are in different
buckets, and parameters gathered per unit while W runs late; ZeRO-2 shares its gradient path). The
first runs 4 microbatches per rank, so it also fails if the gradients leave their own group
(groups.pp_grad)."""
import pytest

from .cli import run_metrics
from .test_parity import PP2, assert_metrics_parity
from .test_zero_bubble_parity import FAST, V8, ZB_V, _reference

LAYOUTS = {
    # micro batch 1: 4 microbatches per DP rank, where ZB-V's order at PP2 needs its two channels (2 do not)
    "pp2-dp2-distopt-overlap": ["--use-distributed-optimizer", "--overlap-grad-reduce", "--micro-batch-size", "1"],
    "pp2-dp2-zero3-overlap": ["--data-parallel-sharding-strategy", "optim_grads_params", "--overlap-grad-reduce"],
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_zb_v_distributed_optimizer_overlapped_tied_matches_one_process(name):
    got = run_metrics(FAST + V8 + PP2 + ZB_V + LAYOUTS[name], nproc=4)[1]
    assert_metrics_parity(_reference(tuple(V8)), got)
