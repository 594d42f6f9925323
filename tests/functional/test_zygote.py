"""The suite's launcher (zygote.py) runs a command line as torchrun and fresh interpreters do."""
import subprocess

import pytest

from . import cli
from .test_parity import BASE

TP2 = BASE + ["--tensor-model-parallel-size", "2", "--train-iters", "3", "--eval-interval", "3"]


@pytest.mark.slow
def test_a_forked_world_logs_what_torchrun_logs(monkeypatch):
    fork_proc, forked = cli.run_metrics(TP2, nproc=2)
    monkeypatch.setenv("MEGATRON_TEST_LAUNCHER", "torchrun")
    torchrun_proc, launched = cli.run_metrics(TP2, nproc=2)
    assert forked == launched  # every loss, grad norm and validation loss, bit for bit
    assert "zygote" not in fork_proc.stdout + fork_proc.stderr
    assert cli.losses(fork_proc.stdout) == cli.losses(torchrun_proc.stdout) and len(cli.losses(fork_proc.stdout)) == 3


def test_a_failing_rank_ends_the_world_with_its_error():
    bad = TP2 + ["--num-attention-heads", "3"]
    with pytest.raises(AssertionError, match="not divisible by --num-attention-heads"):
        cli.run_cli(bad, nproc=2)


def test_a_run_past_its_limit_is_killed_and_the_next_runs():
    long = BASE + ["--train-iters", "100000"]
    with pytest.raises(subprocess.TimeoutExpired) as raised:
        cli.run_cli(long, timeout=6)
    assert isinstance(raised.value.output, str) and "iteration" in raised.value.output  # the zygote's, not subprocess's
    assert cli.run_cli(BASE + ["--train-iters", "1"]).returncode == 0


def test_import_time_variables_send_a_run_to_a_fresh_interpreter(monkeypatch):
    assert cli._ZYGOTE.accepts(cli.run_environment())
    assert cli._ZYGOTE.accepts(cli.run_environment({"XDG_CACHE_HOME": "/tmp/elsewhere"}))
    assert not cli._ZYGOTE.accepts(cli.run_environment({"OMP_NUM_THREADS": "2"}))
    assert not cli._ZYGOTE.accepts(cli.run_environment({"TORCH_SHOW_CPP_STACKTRACES": "1"}))
    started = cli._ZYGOTE.proc
    monkeypatch.setenv("TORCH_SHOW_CPP_STACKTRACES", "1")  # this process's own: the zygote is started again
    assert cli._ZYGOTE.accepts(cli.run_environment()) and cli._ZYGOTE.proc is not started
    assert started.poll() is not None


def test_a_world_whose_port_was_taken_runs_again(monkeypatch):
    calls = []

    def once(*a):
        calls.append(a)
        if len(calls) == 1:  # what rank 0 prints when its TCPStore cannot bind the port it was given
            return subprocess.CompletedProcess(a[0], 1, "", "RuntimeError: ... EADDRINUSE: address already in use")
        return subprocess.CompletedProcess(a[0], 0, "done", "")
    monkeypatch.setattr(cli._ZYGOTE, "_run_once", once)
    assert cli._ZYGOTE.run(["cmd"], "pretrain_gpt.py", [], 2, {}, 60).stdout == "done" and len(calls) == 2
    calls.clear()
    monkeypatch.setattr(cli._ZYGOTE, "_run_once", lambda *a: calls.append(a) or subprocess.CompletedProcess(
        a[0], 1, "", "error: --hidden-size (64) is not divisible"))
    assert cli._ZYGOTE.run(["cmd"], "pretrain_gpt.py", [], 2, {}, 60).returncode == 1 and len(calls) == 1
