"""bf16 and fp16 through the CLI, and the bytes each rank holds against formula and estimator."""
import re
import subprocess
import sys

import pytest

from .cli import REPO, losses, run_cli
from .test_parity import BASE

BYTES_RE = re.compile(r"rank +0 \(tp 0, dp 0, pp 0\): ([\d,]+)"
                      r" \| bytes: params ([\d,]+) grads ([\d,]+) optimizer ([\d,]+)")


def _bytes(stdout):
    m = BYTES_RE.search(stdout)
    assert m, stdout[-3000:]
    return [int(g.replace(",", "")) for g in m.groups()]


def _estimate(flags, world):
    proc = subprocess.run([sys.executable, "tools/estimate_memory.py", "--world-size", str(world)] + flags,
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    m = re.search(r"bytes: params ([\d,]+) grads ([\d,]+) optimizer ([\d,]+)", proc.stdout)
    return [int(g.replace(",", "")) for g in m.groups()]


@pytest.mark.slow
def test_bf16_on_cpu_tracks_fp32_and_holds_18_bytes_per_param():
    iters = ["--train-iters", "20"]
    fp32 = losses(run_cli(BASE + iters).stdout)
    proc = run_cli(BASE + iters + ["--bf16"], nproc=2)
    bf16 = losses(proc.stdout)
    assert abs(bf16[20] - fp32[20]) / fp32[20] < 0.03, (bf16[20], fp32[20])
    assert bf16[20] < bf16[1] - 0.1  # it trains
    n, params, grads, opt = _bytes(proc.stdout)
    assert (params, grads, opt) == (2 * n, 4 * n, 12 * n)  # 18 bytes / parameter
    assert _estimate(BASE + ["--bf16"], 2) == [params, grads, opt]


@pytest.mark.slow
def test_distributed_optimizer_holds_6_plus_12_over_d_bytes_per_param():
    flags = BASE + ["--train-iters", "3", "--bf16", "--use-distributed-optimizer"]
    n, params, grads, opt = _bytes(run_cli(flags, nproc=4).stdout)
    assert n % 4 == 0  # one bucket, no padding: the formula is exact
    assert (params, grads, opt) == (2 * n, 4 * n, 12 * n // 4)
    assert _estimate(flags, 4) == [params, grads, opt]


@pytest.mark.slow
def test_estimator_predicts_tp_sp_distributed_fp32_with_padded_buckets():
    flags = BASE + ["--train-iters", "2", "--tensor-model-parallel-size", "2", "--sequence-parallel",
                    "--use-distributed-optimizer", "--ddp-bucket-size", "7777"]
    n, params, grads, opt = _bytes(run_cli(flags, nproc=4).stdout)
    assert params == grads and params >= 4 * n  # padded to whole shards
    assert _estimate(flags, 4) == [params, grads, opt]


@pytest.mark.slow
def test_muon_holds_one_momentum_buffer_and_the_estimator_says_so():
    # bf16: Muon's hidden matrices (12 h^2 a layer) hold a main copy and a momentum buffer (8 bytes), the rest
    # AdamW's 12; fp32 TP2 x DP2 with padded buckets: the momentum in the distributed optimizer's slices
    flags = BASE + ["--train-iters", "2", "--bf16", "--optimizer", "muon"]
    n, params, grads, opt = _bytes(run_cli(flags).stdout)
    assert (params, grads, opt) == (2 * n, 4 * n, 12 * n - 4 * 2 * 12 * 64 ** 2)
    assert _estimate(flags, 1) == [params, grads, opt]
    flags = BASE + ["--train-iters", "2", "--optimizer", "muon", "--tensor-model-parallel-size", "2",
                    "--sequence-parallel", "--use-distributed-optimizer", "--ddp-bucket-size", "7777"]
    _, params, grads, opt = _bytes(run_cli(flags, nproc=4).stdout)
    assert _estimate(flags, 4) == [params, grads, opt]


def test_fp16_with_oversized_loss_scale_backs_off_and_trains():
    proc = run_cli(BASE + ["--fp16", "--initial-loss-scale", str(2.0 ** 40), "--hysteresis", "1",
                           "--train-iters", "30"])
    scales = [float(x) for x in re.findall(r"loss scale: ([\d.]+)", proc.stdout)]
    skipped = [int(x) for x in re.findall(r"number of skipped iterations: +(\d+)", proc.stdout)]
    assert scales[0] == 2.0 ** 39 and sum(skipped) > 0  # first iteration overflowed and halved the scale
    assert skipped[-1] == 0 and scales[-1] == scales[-2]  # then stable
    lm = losses(proc.stdout)  # a skipped step's loss is finite (only its grads overflowed) and printed
    assert all(v == v for v in lm.values()) and "number of nan iterations:   0" in proc.stdout, lm
    assert lm[30] < lm[1] - 0.05, lm  # resumed and learning


@pytest.mark.slow
def test_muon_in_bf16_and_fp16_tracks_fp32():
    # fp32 main values under bf16 and fp16 parameters, fp16's loss scale taken off before Muon's momentum (an
    # overflowed step is skipped before any optimizer's update: test_fp16_with_oversized_loss_scale_backs_off...)
    muon = BASE + ["--train-iters", "20", "--optimizer", "muon"]
    fp32 = losses(run_cli(muon).stdout)
    for flags in (["--bf16"], ["--fp16", "--loss-scale", "1024"]):
        low = losses(run_cli(muon + flags).stdout)
        assert abs(low[20] - fp32[20]) / fp32[20] < 0.03 and low[20] < low[1] - 0.1, (flags, low[20], fp32[20])
