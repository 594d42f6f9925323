"""A capacity factor where several ranks route parts of one micro-batch, through the CLI: the per-iteration
losses (token loss, both router losses) and grad norms of one process. fp32, dropout 0.

Factor 0.5: the experts' capacities add up to half the (token, choice) pairs, so at least half of them
are dropped in every micro-batch (tests/unit/test_moe_capacity_sharded.py counts them); a rank that
applied the rule to its own tokens would keep other pairs (by hand: notes/capfold.md).

Each layout proves something the others do not:
  CP2 x DP2 x EP4 (4 ranks), alltoall, drop by position, padded to capacity: each CP rank holds two
      chunks of every sequence; the routing all-gathered over CP and the positions put back in sequence
      order; an expert's padded input is the capacity of the two micro-batches (DP ranks) that reach it
  TP2 x ETP1 x EP2 (2 ranks, folded), allgather, drop by probs, padded to capacity: each TP rank routes
      its slice of the sequence; the routing all-gathered over TP, ties broken in micro-batch order; one
      micro-batch reaches each expert (the EP group is the TP group)
"""
import pytest

from .cli import run_metrics
from .test_moe_parity import FLAGS, MOE, TERMS
from .test_parity import assert_metrics_parity

pytestmark = pytest.mark.slow

CAPACITY = ["--moe-expert-capacity-factor", "0.5", "--moe-pad-expert-input-to-capacity"]
LAYOUTS = {  # name: (ranks, layout flags, drop policy)
    "cp2xdp2-ep4-alltoall-position-pad": (4, ["--context-parallel-size", "2", "--expert-model-parallel-size", "4",
                                              "--moe-token-dispatcher-type", "alltoall"], "position"),
    "tp2-etp1-ep2-allgather-probs-pad": (2, ["--tensor-model-parallel-size", "2", "--expert-tensor-parallel-size",
                                             "1", "--expert-model-parallel-size", "2"], "probs"),
}


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_capacity_with_sharded_tokens_matches_one_process(name):
    nproc, flags, policy = LAYOUTS[name]
    model = MOE + CAPACITY + ["--moe-token-drop-policy", policy]
    ref = run_metrics(FLAGS + model)[1]
    got = run_metrics(FLAGS + model + flags, nproc=nproc)[1]
    assert_metrics_parity(ref, got, TERMS)
