"""MoE under the zero-bubble schedules through the CLI, fp32: the per-iteration losses (token loss and
both router losses) and grad norms of one process (test_moe_parity.py's tiny MoE model with SwiGLU
experts and a shared expert, 4 iterations, no evaluation). With a ZB schedule the experts', the
router's and the shared expert's weight gradients come from W actions (tests/unit/test_moe_weight_grad.py
shows B leaves them alone). Each layout proves something the other does not:
  PP2, zb-h1, grouped GEMM: the grouped matmul's weight loop in W (backward_needs) and ZB-H1's delayed W's
  PP2 x EP2, zb-h2, alltoall, overlapped reduction in small buckets: the token exchange stays in B
      while the expert weights wait up to 2r actions for W; the dense and the expert-DP buckets
      see one gradient per microbatch from W
  PP2 x EP2, zb-v, alltoall: two model chunks per rank in a V (each with its experts), the loss and
      the router-loss report on rank 0
4 layers (2 per stage, one per ZB-V chunk), so one reference serves all three.
"""
import pytest

from .cli import run_metrics
from .test_moe_parity import EP2, FLAGS, MOE, TERMS
from .test_parity import PP2, SMALL_BUCKETS, assert_metrics_parity

MODEL = ["--num-layers", "4", "--lr", "1e-3", "--swiglu", "--moe-shared-expert-intermediate-size", "48"]
LAYOUTS = {
    "pp2-zb-h1-grouped": (2, PP2 + ["--pipeline-schedule", "zb-h1", "--moe-grouped-gemm"]),
    "pp2xep2-zb-h2-alltoall-overlap": (4, PP2 + EP2 + ["--pipeline-schedule", "zb-h2", "--moe-token-dispatcher-type",
                                                       "alltoall", "--overlap-grad-reduce"] + SMALL_BUCKETS),
    "pp2xep2-zb-v-alltoall": (4, PP2 + EP2 + ["--pipeline-schedule", "zb-v", "--moe-token-dispatcher-type",
                                              "alltoall"]),
}
_ref = []


@pytest.mark.slow
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_moe_zero_bubble_schedule_matches_one_process(name):
    if not _ref:
        _ref.append(run_metrics(FLAGS + MOE + MODEL)[1])
    nproc, flags = LAYOUTS[name]
    assert_metrics_parity(_ref[0], run_metrics(FLAGS + MOE + MODEL + flags, nproc=nproc)[1], TERMS)
