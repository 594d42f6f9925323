"""MoE experts with biases split over expert TP, through the CLI, fp32: each layout gives the
per-iteration losses (token loss, both router losses) and grad norms of one process, and a checkpoint
saved at TP2 x EP2 holds the bias shards with their global shapes and continues at one process.

SwiGLU experts (fc1's bias in [gate; up] blocks split over TP separately, as its weight), lr 1e-2 so
that the biases, zero at start, matter from iteration 2 on (fc2's added twice would show there).
  TP2 x EP2, alltoall, grouped GEMM, capacity 1.0 with padding to capacity: fc2's bias added by TP
      rank 0 before the all-reduce, to the computed rows only (dropped pairs never reach an expert,
      the padding rows are cut off after); its gradient on both TP ranks from the whole output's
  TP2 x EP2, allgather, sequence parallel, sequential experts: the same through the loop of experts
  TP2 x ETP1 x EP2 (folded, 2 ranks): whole experts, their biases inside (as one process)
  TP4 x ETP2 x EP2 (folded, 4 ranks), sequence parallel: rows gathered over expert TP, fc2's bias added
      by expert-TP rank 0 before the reduce-scatter, its gradient over every gathered row
  TP1 x DP2 x ETP2 (expert TP above TP, 2 ranks): the same over an expert-TP group of two DP ranks
"""
import pytest

from megatron.core.checkpointing import CheckpointReader, find_checkpoint

from .cli import run_metrics
from .test_moe_parity import EP2, FLAGS, MOE, TERMS
from .test_parity import assert_metrics_parity

pytestmark = pytest.mark.slow

BIASED = [f for f in MOE if f != "--disable-bias-linear"] + ["--swiglu", "--lr", "1e-2"]
TP2 = ["--tensor-model-parallel-size", "2"]
PADDED = ["--moe-expert-capacity-factor", "1.0", "--moe-token-drop-policy", "position",
          "--moe-pad-expert-input-to-capacity"]
_ref = {}


def reference(extra=()):
    key = tuple(extra)
    if key not in _ref:
        _ref[key] = run_metrics(FLAGS + BIASED + list(extra))[1]
    return _ref[key]


LAYOUTS = {  # name: (ranks, layout flags, model flags the reference shares)
    "tp2xep2-alltoall-grouped-padded": (4, TP2 + EP2 + ["--moe-token-dispatcher-type", "alltoall",
                                                        "--moe-grouped-gemm"], PADDED),
    "tp2xep2-allgather-sp": (4, TP2 + EP2 + ["--sequence-parallel"], []),
    "tp2-etp1-ep2-folded": (2, TP2 + EP2 + ["--expert-tensor-parallel-size", "1",
                                            "--moe-token-dispatcher-type", "alltoall"], []),
    "tp4-etp2-ep2-folded-sp": (4, ["--tensor-model-parallel-size", "4", "--expert-tensor-parallel-size", "2",
                                   "--sequence-parallel", "--moe-token-dispatcher-type", "alltoall"] + EP2, []),
    "tp1xdp2-etp2": (2, ["--expert-tensor-parallel-size", "2"], []),
}


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_expert_biases_split_over_tp_match_one_process(name):
    nproc, flags, model = LAYOUTS[name]
    got = run_metrics(FLAGS + BIASED + model + flags, nproc=nproc)[1]
    assert_metrics_parity(reference(model), got, TERMS)


def test_checkpoint_saved_at_tp2_ep2_holds_global_bias_shapes_and_continues_at_one_process(tmp_path):
    d = str(tmp_path / "ck")
    first = run_metrics(FLAGS + BIASED + TP2 + EP2 + ["--save", d, "--save-interval", "2", "--exit-interval", "2"],
                        nproc=4)[1]
    reader = CheckpointReader(find_checkpoint(d))
    fc1 = [k for k in reader if k.endswith("fc1_bias")]
    fc2 = [k for k in reader if k.endswith("fc2_bias")]
    assert len(fc1) == len(fc2) == 2 * 4  # 2 layers x 4 experts
    for key in fc1:  # [gate; up] x 96: two TP shards, each written once, with the global shape
        pieces = reader.index[(key, "param")]
        assert reader.shape(key) == [2 * 96] and len(pieces) == 2, (key, pieces)
        assert reader.global_tensor(key).abs().max() > 0, key  # moved from zero
    for key in fc2:  # replicated over TP: written once
        assert reader.shape(key) == [64] and len(reader.index[(key, "param")]) == 1, key
    second = run_metrics(FLAGS + BIASED + ["--load", d])[1]
    assert sorted(first["train"]) == [1, 2] and sorted(second["train"]) == [3, 4]
    assert_metrics_parity(reference(), {"train": {**first["train"], **second["train"]}, "validation": {}}, TERMS)
