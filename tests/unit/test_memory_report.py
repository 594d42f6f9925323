"""The measured-memory line of the training log (megatron/training/observability/memory_report.py) with a fake
stats source on CPU: Megatron-LM's format, the estimator's figure for the rank's stage, printed
once per model-parallel rank (data-parallel rank 0), and nothing without CUDA."""
import types

import pytest

from megatron.training.observability import memory_report
from megatron.training.planner import memory as est
from megatron.training.planner.predict import configs

MB = 2 ** 20
ARGV = ["--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
        "--vocab-size", "128", "--micro-batch-size", "2", "--global-batch-size", "8",
        "--pipeline-model-parallel-size", "2"]


def fake_stats(device):
    return (100 * MB, 250.5 * MB, 300 * MB, 512 * MB)


def test_line_format():
    line = memory_report.memory_line(3, 10, fake_stats("cpu"), 1234 * MB)
    assert line == ("[Rank 3] (after 10 iterations) memory (MB) | allocated: 100.0 | max allocated: 250.5 | "
                    "reserved: 300.0 | max reserved: 512.0 | estimated peak: 1234.0 (tools/estimate_memory.py)")
    assert memory_report.memory_line(0, 1, fake_stats("cpu"), "OSError: no estimator").endswith(
        "| estimated peak: n/a (OSError: no estimator)")


def test_an_estimate_that_fails_never_stops_the_run(capsys):
    model_cfg, train_cfg = configs(ARGV, 4)
    groups = types.SimpleNamespace(rank=0, dp_rank=0, pp_rank=0, world_size=3)  # no layout of 3 ranks
    line = memory_report.report_memory(5, groups, model_cfg, train_cfg, "cpu", stats_source=fake_stats)
    assert "| estimated peak: n/a (" in line and capsys.readouterr().out == line + "\n"


@pytest.mark.parametrize("pp_rank", [0, 1])
def test_report_carries_the_estimate_of_the_ranks_stage(pp_rank, capsys):
    model_cfg, train_cfg = configs(ARGV, 4)   # world 4 = PP 2 x DP 2
    groups = types.SimpleNamespace(rank=2 * pp_rank, dp_rank=0, pp_rank=pp_rank, world_size=4)
    line = memory_report.report_memory(5, groups, model_cfg, train_cfg, "cpu", stats_source=fake_stats)
    expected = est.total_bytes(est.estimate(model_cfg, train_cfg, 4, pp_rank))
    assert line.startswith(f"[Rank {2 * pp_rank}] (after 5 iterations) memory (MB) | allocated: 100.0 |")
    assert line.endswith(f"| estimated peak: {expected / MB:.1f} (tools/estimate_memory.py)")
    assert capsys.readouterr().out == line + "\n"
    # the two stages hold different layers, embedding and output layer: different estimates
    other = est.total_bytes(est.estimate(model_cfg, train_cfg, 4, 1 - pp_rank))
    assert other != expected


def test_only_data_parallel_rank_0_prints(capsys):
    model_cfg, train_cfg = configs(ARGV, 4)
    groups = types.SimpleNamespace(rank=1, dp_rank=1, pp_rank=0, world_size=4)
    assert memory_report.report_memory(5, groups, model_cfg, train_cfg, "cpu", stats_source=fake_stats) is None
    assert capsys.readouterr().out == ""


def test_nothing_without_cuda(capsys):
    model_cfg, train_cfg = configs(ARGV, 4)
    groups = types.SimpleNamespace(rank=0, dp_rank=0, pp_rank=0, world_size=4)
    assert memory_report.cuda_memory_stats("cpu") is None
    assert memory_report.report_memory(5, groups, model_cfg, train_cfg, "cpu") is None
    assert capsys.readouterr().out == ""
