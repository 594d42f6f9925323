"""Muon's momentum in checkpoints, layout-free as Adam's moments: a resume at the same layout is bitwise
the uninterrupted run, a checkpoint of TP2 x PP2 x DP2 (distributed optimizer: momentum in DP slices)
resumes at one process and the reverse with one process's losses, and loading another optimizer's state
is one line, exit 2, unless --no-load-optim."""
import pytest
import torch

from .cli import run_cli, run_metrics
from .test_checkpoint import params
from .test_muon_parity import FLAGS
from .test_parity import DEEP, FIRST_TOL, RUN_TOL

ITERS, HALF = 6, 3
RUN = FLAGS + DEEP + ["--train-iters", str(ITERS), "--eval-iters", "0"]
WIDE = (8, ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
            "--use-distributed-optimizer", "--ddp-bucket-size", "20000"])
_runs = {}


def _metrics(name, flags, nproc=1):
    if name not in _runs:
        _runs[name] = run_metrics(RUN + flags, nproc=nproc)[1]["train"]
    return _runs[name]


def _first_half(name, d, nproc=1, flags=()):
    """A run stopped (and saved) at iteration HALF into d."""
    got = _metrics(name, list(flags) + ["--save", str(d), "--save-interval", str(HALF), "--exit-interval", str(HALF)],
                   nproc)
    assert sorted(got) == list(range(1, HALF + 1))
    return got


def _close(got, want, first):
    for it, g in got.items():
        w = want[it]
        for a, b in ((g["losses"]["lm loss"], w["losses"]["lm loss"]), (g["grad_norm"], w["grad_norm"])):
            assert abs(a - b) <= (FIRST_TOL if it == first else RUN_TOL) * abs(b), (it, a, b)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    return tmp_path_factory.mktemp("muon-ckpt")


@pytest.mark.slow
def test_muon_resumes_bitwise_and_from_tp2_pp2_dp2_at_one_process(dirs):
    tmp_path = dirs
    straight = _metrics("straight", ["--save", str(tmp_path / "straight")])
    one, wide = tmp_path / "one", tmp_path / "wide"
    first = _first_half("one-first", one)
    resumed = _metrics("one-resumed", ["--load", str(one), "--save", str(tmp_path / "one-end")])
    assert sorted(resumed) == list(range(HALF + 1, ITERS + 1))
    for it, rec in {**first, **resumed}.items():  # the same layout: the same numbers, bit for bit
        assert rec["losses"] == straight[it]["losses"] and rec["grad_norm"] == straight[it]["grad_norm"], it
    a, b = params(str(tmp_path / "straight")), params(str(tmp_path / "one-end"))
    assert any(state == "momentum_buffer" for _, state in a) and a.keys() == b.keys()
    for k in a:  # and the final weights, momentum buffers and Adam moments
        assert torch.equal(a[k], b[k]), k

    _first_half("wide-first", wide, *WIDE)
    _close(_metrics("wide-to-one", ["--load", str(wide)]), straight, HALF + 1)


@pytest.mark.slow
def test_muon_checkpoint_of_one_process_resumes_at_tp2_pp2_dp2(dirs):
    one, nproc, flags = dirs / "one", *WIDE
    if "one-first" not in _runs:
        _first_half("one-first", one)
    _close(_metrics("one-to-wide", flags + ["--load", str(one)], nproc), _metrics("straight", []), HALF + 1)


def _refused(flags, d, here, saved):
    proc = run_cli(flags, check=False)
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert err[-1] == (f"error: --optimizer {here} here but the checkpoint {d}/iter_0000003 holds {saved}'s "
                       f"optimizer state: give --optimizer {saved}, or --no-load-optim to start the {here} state "
                       "afresh from its weights"), err[-1]


@pytest.mark.slow
def test_loading_another_optimizers_state_is_one_line(tmp_path):
    muon, adam = tmp_path / "muon", tmp_path / "adam"
    adam_run = [a for a in RUN if a not in ("--optimizer", "muon")]
    _first_half("switch-first", muon)
    _refused(adam_run + ["--load", str(muon)], muon, "adam", "muon")
    proc = run_cli(adam_run + ["--load", str(muon), "--no-load-optim", "--exit-interval", str(HALF + 1)])
    assert "optimizer state NOT loaded" in proc.stdout
    run_cli(adam_run + ["--save", str(adam), "--save-interval", str(HALF), "--exit-interval", str(HALF)])
    _refused(RUN + ["--load", str(adam)], adam, "muon", "adam")
