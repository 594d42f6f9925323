"""Checkpoints through the CLI: exact resume, resharding to other layouts, atomic saves,
and clear errors for missing, truncated or foreign checkpoints."""
import os

import pytest
import torch

from .cli import losses, run_cli

ITERS = 8
BASE = ["--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "1000",
        "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
        "--seq-length", "32", "--micro-batch-size", "2", "--global-batch-size", "8",
        "--train-iters", str(ITERS), "--log-interval", "1", "--eval-iters", "0",
        "--lr", "2e-3", "--lr-warmup-iters", "2", "--seed", "7"]  # dropout on: RNG must resume too

_straight = {}


def straight(tmp_path_factory):
    """The uninterrupted single-process run (its losses and its final checkpoint)."""
    if not _straight:
        d = str(tmp_path_factory.mktemp("straight"))
        _straight["losses"] = losses(run_cli(BASE + ["--save", d]).stdout)
        _straight["dir"] = d
    return _straight


def params(root):
    """{key: param piece data} of the tracker's checkpoint (single-rank saves)."""
    it = int(open(os.path.join(root, "latest_checkpointed_iteration.txt")).read())
    payload = torch.load(os.path.join(root, f"iter_{it:07d}", "rank_00000.pt"), weights_only=True)
    return {(p["key"], p["state"]): p["data"] for p in payload["pieces"]}


@pytest.mark.slow
def test_resume_is_bitwise_identical(tmp_path, tmp_path_factory):
    ref = straight(tmp_path_factory)
    d = str(tmp_path / "ck")
    first = losses(run_cli(BASE + ["--save", d, "--save-interval", "2", "--exit-interval", str(ITERS // 2)]).stdout)
    assert sorted(first) == list(range(1, ITERS // 2 + 1))
    second = losses(run_cli(BASE + ["--save", d, "--load", d]).stdout)
    assert sorted(second) == list(range(ITERS // 2 + 1, ITERS + 1))
    assert {**first, **second} == ref["losses"]  # the logged 7 digits, every iteration
    a, b = params(ref["dir"]), params(d)
    assert a.keys() == b.keys()
    for k in a:  # and the final weights and Adam moments bit for bit
        assert torch.equal(a[k], b[k]), k
