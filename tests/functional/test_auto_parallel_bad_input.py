"""--auto-parallel's bad input through pretrain_gpt.py's main: one line, exit code 2, no process group."""
import pytest
import torch.distributed as dist

import pretrain_gpt

TINY = ["--auto-parallel", "--planner-gpu", "H100-SXM", "--mock-data", "--tokenizer-type", "NullTokenizer",
        "--vocab-size", "1000", "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
        "--seq-length", "64", "--global-batch-size", "8", "--train-iters", "2", "--lr", "2e-3"]
# 8 x 8192-wide layers in bf16 with Adam: about 124 GB on one GPU whatever the layout, 77 GB on two (ZeRO-2)
BIG = TINY[:6] + ["--vocab-size", "32000", "--num-layers", "8", "--hidden-size", "8192", "--num-attention-heads",
                  "64", "--seq-length", "4096", "--global-batch-size", "8", "--lr", "1e-4", "--bf16"]


def _error(capsys, monkeypatch, argv, world="1"):
    monkeypatch.setenv("WORLD_SIZE", world)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", world)
    monkeypatch.delenv("RANK", raising=False)
    code = pretrain_gpt.main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert not dist.is_initialized()  # found before any process group exists
    assert code == 2 and len(err) == 1, (code, err)
    return err[0]


def test_a_world_no_layout_fits_names_the_peak_the_memory_and_what_fits(capsys, monkeypatch):
    line = _error(capsys, monkeypatch, BIG)
    assert line.startswith("error: --auto-parallel: no layout fits on 1 x H100-SXM: the smallest predicted peak is ")
    assert "rec=full) > 80.00 GB per GPU" in line and "it fits on 2 GPUs as TP1 PP1 DP2" in line, line


def test_pinned_flags_that_do_not_fit_are_named(capsys, monkeypatch):
    pins = ["--tensor-model-parallel-size", "1", "--pipeline-model-parallel-size", "1",
            "--data-parallel-sharding-strategy", "no_shard"]
    line = _error(capsys, monkeypatch, BIG + pins, world="2")
    assert "without the pinned tp=1, pp=1, dist_opt=False, zero=no_shard it fits as TP" in line, line
    assert line.endswith("drop those flags")


def test_unknown_planner_gpu(capsys, monkeypatch):
    line = _error(capsys, monkeypatch, TINY[:1] + ["--planner-gpu", "V100"] + TINY[3:])
    assert line.startswith("error: --planner-gpu V100: unknown to the planner's calibration; one of A100-40GB"), line


@pytest.mark.parametrize("flags,named", [
    (["--decoder-first-pipeline-num-layers", "1"], "--decoder-first-pipeline-num-layers (the planner prices even"),
    (["--num-virtual-stages-per-pipeline-rank", "2"], "--num-virtual-stages-per-pipeline-rank (give"),
    (["--optimizer-cpu-offload"], "--optimizer-cpu-offload (the planner's memory and time models do not price"),
    (["--num-layers-per-virtual-pipeline-stage", "1"], "needs --pipeline-model-parallel-size too"),
])
def test_flags_the_planner_cannot_search(capsys, monkeypatch, flags, named):
    line = _error(capsys, monkeypatch, TINY + flags)
    assert line.startswith("error: --auto-parallel ") and named in line, line


def test_no_global_batch_size(capsys, monkeypatch):
    argv = [a for a in TINY if a not in ("--global-batch-size", "8")]
    assert "--auto-parallel needs --global-batch-size" in _error(capsys, monkeypatch, argv)
