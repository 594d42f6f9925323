"""The CPU calibration's arithmetic (training/planner/cpu_calibration.py): shared cores, the Cluster's figures
from a profile, and the cache that makes every rank of a node plan on the same profile."""
import json
import math
import os
import threading
import time

import pytest

from megatron.training.planner.cpu_calibration import MEMORY_FRACTION, cpu_cluster, load_or_measure, share, to_cluster
from megatron.training.planner.hardware import collective_time, gemm_fraction, gemm_time

PROFILE = {"threads": 1, "cores": 2, "gemm_dims": [64, 128, 256], "gemm_flops": [1e10, 2e10, 4e10],
           "copy_bw": 8e9, "allreduce_bus_bw": 1e9, "latency": 1e-4, "memory_bytes": 16e9}


@pytest.mark.parametrize("per_node,threads,expected", [(1, 1, 1.0), (2, 1, 1.0), (4, 1, 0.5), (2, 2, 0.5),
                                                        (8, 1, 0.25)])
def test_oversubscribed_cores_divide_the_compute(per_node, threads, expected):
    assert share({**PROFILE, "threads": threads}, per_node) == expected


def test_the_cluster_reproduces_the_measured_gemm_rates_shared_by_the_ranks():
    c = to_cluster(PROFILE, 4, 4)  # 4 one-thread ranks on 2 cores: half of each measured rate
    assert c.num_gpus == 4 and c.gpus_per_node == 4 and c.peak_flops == 2e10
    for n, flops in zip(PROFILE["gemm_dims"], PROFILE["gemm_flops"]):
        assert gemm_fraction(c, n, n, n) == pytest.approx(flops / 4e10, rel=1e-12)
        assert gemm_time(c, n, n, n) == pytest.approx(2 * n ** 3 / (flops / 2), rel=1e-12)
    # between measured sizes the curve is the calibration's usual log2 interpolation
    assert gemm_fraction(c, 90, 90, 90) == pytest.approx(0.25 + (0.5 - 0.25) * (math.log2(90) - 6))
    assert c.hbm_bw == 4e9 and c.memory_bytes == MEMORY_FRACTION * 16e9 / 4
    # the measured bus bandwidth is each link's: a 2-rank all-reduce of B bytes takes B / bw
    assert collective_time(c, "all_reduce", 1e6, 2, 1) == pytest.approx(1e6 / 1e9)
    assert c.peak_fp8_flops is None


def test_measured_once_then_read_by_everyone(tmp_path):
    calls = []

    def measure(threads):
        calls.append(threads)
        time.sleep(0.2)  # the other callers must wait on the lock, not measure too
        return {**PROFILE, "threads": threads}

    results = []
    workers = [threading.Thread(target=lambda: results.append(load_or_measure(str(tmp_path), 1, measure)))
               for _ in range(3)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert calls == [1]
    assert sorted(cached for _, cached in results) == [False, True, True]
    assert all(profile == results[0][0] for profile, _ in results)
    (path,) = [p for p in os.listdir(tmp_path) if p.endswith(".json")]
    assert json.load(open(tmp_path / path)) == results[0][0]


def test_cpu_cluster_says_where_its_figures_come_from(tmp_path):
    first = cpu_cluster(2, 2, str(tmp_path), measure=lambda t: {**PROFILE, "threads": t})[1]
    again = cpu_cluster(2, 2, str(tmp_path), measure=lambda t: pytest.fail("measured twice"))[1]
    assert "measured into" in first and "read from" in again and str(tmp_path) in again
