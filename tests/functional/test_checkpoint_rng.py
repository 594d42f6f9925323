"""RNG restore through the CLI (issue 26): a tiny MoE GPT with dropout saved at CP2 x EP2 (4 ranks)
continues bitwise when resumed at the same layout (every rank gets its own saved streams back), and
resumed at CP1 x EP2 (2 ranks: ranks 0 and 1 held CP ranks 0 and 1 of one sequence, now DP ranks of
two) it reseeds every rank from --seed and the iteration and says so in one line, instead of handing
rank 1 the stream of a position it no longer has. The per-rank rule: tests/distributed/test_checkpoint_rng.py."""
import math

import pytest

from .cli import run_metrics
from .test_moe_parity import EP2, FLAGS, MOE
from .test_zero_cli import _back_to_iteration_2

DROPOUT = ["--hidden-dropout", "0.1", "--attention-dropout", "0"]  # CP takes no attention dropout
CP2 = ["--context-parallel-size", "2", "--moe-token-dispatcher-type", "alltoall"]
LINE = "> RNG states reseeded on every rank"


@pytest.mark.slow
def test_cp2_ep2_checkpoint_resumes_bitwise_at_its_layout_and_reseeds_at_cp1(tmp_path):
    d = str(tmp_path / "ck")
    flags = FLAGS + MOE + EP2 + DROPOUT
    proc, straight = run_metrics(flags + CP2 + ["--save", d, "--save-interval", "2"], nproc=4)
    assert sorted(straight["train"]) == [1, 2, 3, 4] and LINE not in proc.stdout

    _back_to_iteration_2(d)
    proc, same = run_metrics(flags + CP2 + ["--load", d], nproc=4)
    assert sorted(same["train"]) == [3, 4] and LINE not in proc.stdout
    for it in (3, 4):  # bitwise: the dropout masks of iterations 3 and 4 are the uninterrupted run's
        assert same["train"][it]["losses"] == straight["train"][it]["losses"], it
        assert same["train"][it]["grad_norm"] == straight["train"][it]["grad_norm"], it

    proc, cp1 = run_metrics(flags + ["--moe-token-dispatcher-type", "alltoall", "--load", d], nproc=2)
    lines = [s for s in proc.stdout.splitlines() if s.startswith(LINE)]
    assert lines == [f"{LINE} from --seed 7 + iteration 2, not restored: saved at WORLD4 TP1 CP2 DP2 PP1 VPP1 "
                     "EP2 ETP1 EDP2, resumed at WORLD2 TP1 CP1 DP2 PP1 VPP1 EP2 ETP1 EDP1"], proc.stdout[-3000:]
    assert sorted(cp1["train"]) == [3, 4]
    assert all(math.isfinite(v) for it in (3, 4) for v in cp1["train"][it]["losses"].values())
