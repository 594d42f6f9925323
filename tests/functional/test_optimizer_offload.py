"""Optimizer state in files (--optimizer-offload-path, ours) through the CLI.

Parity with the in-memory state of the same layout (distributed optimizer DP2, ZeRO-3 DP2): losses and grad
norms within 2e-6 at iteration 1 and 1e-5 over 10 iterations (the file's step runs torch's fused AdamW kernel
on pre-clipped gradients, the device's folds the clip into the kernel: rounding apart). A 10 KiB buffer makes
every piece many chunks. Host memory: the run's peak resident memory with the state in files stays below the
in-memory host offload's (--optimizer-cpu-offload) by most of the state's bytes, and the buffer's high-water
mark is the buffer. A run that saves with the path resumes without it and the other way round, the same run
as without any. A disk without room (a file-size limit) or an unwritable folder: one line, exit 2, the
checkpoint already saved untouched.
"""
import hashlib
import os
import re
import resource
import subprocess
import sys

import pytest

from megatron.core.errors import ConfigError
from megatron.training.config.arguments import parse_args
from megatron.training.config.resolve import resolve, validate

from .cli import REPO, run_cli, run_environment, run_metrics
from .test_parity import BASE, assert_metrics_parity, max_relative_differences

FLAGS = BASE + ["--train-iters", "10", "--eval-iters", "0"]
SMALL_BUCKETS = ["--ddp-bucket-size", "20000"]
LAYOUTS = {
    "distopt-dp2": ["--use-distributed-optimizer"] + SMALL_BUCKETS,
    "zero3-dp2": ["--data-parallel-sharding-strategy", "optim_grads_params"] + SMALL_BUCKETS,
    "distopt-dp2-half-on-device": ["--use-distributed-optimizer", "--optimizer-cpu-offload",
                                   "--optimizer-offload-fraction", "0.5"] + SMALL_BUCKETS,
}


def offload(tmp_path):
    return ["--optimizer-offload-path", str(tmp_path / "nvme"), "--optimizer-offload-buffer-mb", "0.01"]


@pytest.mark.slow
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_state_in_files_matches_the_state_in_memory(name, tmp_path):
    ref = run_metrics(FLAGS + LAYOUTS[name], nproc=2)[1]
    proc, got = run_metrics(FLAGS + LAYOUTS[name] + offload(tmp_path), nproc=2)
    assert "updated through a 10,480-byte host buffer" in proc.stdout
    assert sorted(os.listdir(tmp_path / "nvme")) == ["optimizer_state_rank00000.bin", "optimizer_state_rank00001.bin"]
    assert_metrics_parity(ref, got)


def _peak_rss_kib(args):
    """(the run's peak resident memory in KiB, from os.wait4's rusage of that one child; its stdout)."""
    proc = subprocess.Popen([sys.executable, "pretrain_gpt.py"] + args, cwd=REPO, env=run_environment(),
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    assert proc.returncode == 0, out[-3000:]
    return usage.ru_maxrss, out


@pytest.mark.slow
def test_host_memory_is_the_buffer_not_the_state(tmp_path):
    # a 6.4M-element embedding: 77 MB of fp32 main values and moments, far above the 1 MiB buffer
    big = BASE + ["--vocab-size", "50000", "--train-iters", "2", "--eval-iters", "0"]
    in_memory, _ = _peak_rss_kib(big + ["--optimizer-cpu-offload"])
    in_file, out = _peak_rss_kib(big + ["--optimizer-offload-path", str(tmp_path / "nvme"),
                                        "--optimizer-offload-buffer-mb", "1"])
    state = os.path.getsize(tmp_path / "nvme" / "optimizer_state_rank00000.bin")
    print(f"peak RSS: host offload {in_memory} KiB, state in a file {in_file} KiB; state {state:,} bytes")
    assert "updated through a 1,048,576-byte host buffer" in out
    assert (in_memory - in_file) * 1024 >= 0.8 * state, "the state in a file still costs host memory"


@pytest.mark.slow
def test_resume_with_and_without_the_path_is_the_same_run(tmp_path):
    short = BASE + ["--train-iters", "6", "--eval-iters", "0"]
    ckpt, path = ["--save", str(tmp_path / "ck"), "--save-interval", "2"], offload(tmp_path)
    ref = run_metrics(short)[1]["train"]
    got = run_metrics(short + ckpt + path + ["--exit-interval", "2"])[1]["train"]  # saved from the file
    got.update(run_metrics(short + ckpt + ["--load", str(tmp_path / "ck"), "--exit-interval", "4"])[1]["train"])
    got.update(run_metrics(short + ckpt + path + ["--load", str(tmp_path / "ck")])[1]["train"])  # into the file
    diff = max_relative_differences({"train": ref, "validation": {}}, {"train": got, "validation": {}})
    print(f"max relative differences: {diff}")
    assert diff["train"] <= 1e-5, diff


def _digest(folder):
    h = hashlib.sha256()
    for root, _, files in sorted(os.walk(folder)):
        for f in sorted(files):
            with open(os.path.join(root, f), "rb") as fh:
                h.update(f.encode() + fh.read())
    return h.hexdigest()


def _one_error_line(proc, needle):
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [x for x in proc.stderr.splitlines() if x.strip()]
    assert len(errors) == 1 and errors[0].startswith("error: ") and needle in errors[0], proc.stderr[-3000:]


@pytest.mark.slow
def test_disk_full_is_one_line_and_loses_no_checkpoint(tmp_path):
    short = BASE + ["--train-iters", "4", "--eval-iters", "0"]
    ck = str(tmp_path / "ck")
    run_cli(short + ["--save", ck, "--exit-interval", "2", "--save-interval", "2"])
    before = _digest(ck)

    def small_files():  # the state file (about 2 MB) cannot be allocated; logs and probes still can
        resource.setrlimit(resource.RLIMIT_FSIZE, (500_000, 500_000))
    args = short + offload(tmp_path) + ["--save", ck, "--load", ck]
    proc = subprocess.run([sys.executable, "pretrain_gpt.py"] + args, cwd=REPO, env=run_environment(),
                          capture_output=True, text=True, timeout=600, preexec_fn=small_files)
    _one_error_line(proc, "--optimizer-offload-path")
    assert "cannot hold this rank's" in proc.stderr and " iteration " not in proc.stdout
    assert _digest(ck) == before, "the saved checkpoint changed"
    run_cli(short + ["--load", ck])  # and it still loads


def test_unwritable_folder_is_one_line():
    proc = run_cli(FLAGS + ["--optimizer-offload-path", "/proc/i47-offload"], check=False)
    _one_error_line(proc, "--optimizer-offload-path /proc/i47-offload: cannot write in /proc")


@pytest.mark.parametrize("flags,line", [
    (["--optimizer", "sgd"], "--optimizer-offload-path is built for --optimizer adam only, not sgd"),
    (["--optimizer-offload-buffer-mb", "0"], "--optimizer-offload-buffer-mb must be positive, got 0.0"),
])
def test_values_that_do_not_fit_are_one_line(flags, line, tmp_path):
    m, t = parse_args(FLAGS + ["--optimizer-offload-path", str(tmp_path)] + flags)[:2]
    resolve(m, t, 1)
    with pytest.raises(ConfigError, match="^" + re.escape(line)):
        validate(m, t, 1)


def test_a_buffer_size_without_the_path_is_one_line():
    m, t = parse_args(FLAGS + ["--optimizer-offload-buffer-mb", "8"])[:2]
    resolve(m, t, 1)
    with pytest.raises(ConfigError, match="goes with --optimizer-offload-path"):
        validate(m, t, 1)
