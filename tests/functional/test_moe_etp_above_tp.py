"""Expert tensor parallelism above TP (--expert-tensor-parallel-size > --tensor-model-parallel-size) through
the CLI: the folded grid's expert-TP groups span data-parallel ranks. Per-iteration losses (token loss, both
router losses) and grad norms equal one process, and checkpoints cross expert-TP sizes. fp32, dropout 0,
dropless.

Each run proves something the others do not:
  TP1 x DP2, ETP2 (2 ranks), saves at iteration 2: both DP ranks' tokens gathered over expert-TP, each
      rank's half of every expert run on them and the partial outputs reduce-scattered back; the expert
      shards initialised and written by expert-TP rank (param_meta.tensor_parallel_split)
  TP2 x DP2, ETP4 (4 ranks), alltoall, sequence parallel, distributed optimizer, loads it (3-4): the
      expert-TP group spans TP and DP; ETP2 shards read as ETP4 shards
  TP2 x DP2, ETP4 saves at iteration 2 and one process continues (3-4): its first two iterations from
      initialisation, its shards written once each
"""
import pytest

from .cli import run_metrics
from .test_moe_parity import FLAGS, MOE, TERMS
from .test_parity import assert_metrics_parity

pytestmark = pytest.mark.slow

ETP2 = ["--expert-tensor-parallel-size", "2"]
ETP4 = ["--tensor-model-parallel-size", "2", "--expert-tensor-parallel-size", "4", "--sequence-parallel",
        "--moe-token-dispatcher-type", "alltoall", "--use-distributed-optimizer"]
_ref = []


def _reference():
    if not _ref:
        _ref.append(run_metrics(FLAGS + MOE)[1])
    return _ref[0]


@pytest.mark.parametrize("saver,loader", [((ETP2, 2), (ETP4, 4)), ((ETP4, 4), ([], 1))],
                         ids=["tp1xdp2-etp2-then-tp2xdp2-etp4", "tp2xdp2-etp4-then-one-process"])
def test_expert_tp_above_tp_matches_one_process_across_checkpoints(tmp_path, saver, loader):
    d = str(tmp_path / "ck")
    first = run_metrics(FLAGS + MOE + saver[0] + ["--save", d, "--save-interval", "2", "--exit-interval", "2"],
                        nproc=saver[1])[1]
    second = run_metrics(FLAGS + MOE + loader[0] + ["--load", d], nproc=loader[1])[1]
    assert sorted(first["train"]) == [1, 2] and sorted(second["train"]) == [3, 4]
    assert_metrics_parity(_reference(), {"train": {**first["train"], **second["train"]}, "validation": {}}, TERMS)
