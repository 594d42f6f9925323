"""FP8 delayed scaling's state (amax histories, scales, update counts) in the layout-free checkpoint:
a run resumed from a checkpoint continues bitwise, and the checkpoint holds the state of every FP8 linear."""
import pytest
import torch

from .cli import losses, run_cli
from .test_checkpoint import BASE, ITERS, params

FP8 = ["--fp8-format", "hybrid", "--fp8-recipe", "delayed", "--fp8-amax-history-len", "3",
       "--fp8-amax-compute-algo", "max"]


@pytest.mark.slow
def test_fp8_delayed_resume_is_bitwise_identical(tmp_path):
    straight_dir, d = str(tmp_path / "straight"), str(tmp_path / "ck")
    straight = losses(run_cli(BASE + FP8 + ["--save", straight_dir]).stdout)
    first = losses(run_cli(BASE + FP8 + ["--save", d, "--save-interval", "2", "--exit-interval",
                                         str(ITERS // 2)]).stdout)
    second = losses(run_cli(BASE + FP8 + ["--save", d, "--load", d]).stdout)
    assert {**first, **second} == straight
    a, b = params(straight_dir), params(d)
    assert a.keys() == b.keys()
    for k in a:  # weights, Adam moments and the FP8 state, bit for bit
        assert torch.equal(a[k], b[k]), k
    fp8 = {k: v for k, v in a.items() if ".fp8." in k[0]}
    # 2 layers x 4 linears x 3 tensors (input, weight, grad) x 3 buffers
    assert len(fp8) == 72, sorted(fp8)
    histories = [v for (key, _), v in fp8.items() if key.endswith("amax_history")]
    assert all(h.shape == (3,) and (h > 0).all() for h in histories)  # ITERS >= 3 steps recorded
    assert all(v.item() == ITERS for (key, _), v in fp8.items() if key.endswith("updates"))
