"""The activation-memory formula and its meter, in one process (tests/activation_memory.py).

`ours()` with the paper's parameters (1-byte masks, no statistics, unfused core) is exactly
Korthikanti et al.'s formula; the measured bytes are checked against it in
tests/distributed/test_activation_memory.py.
"""
import itertools

import pytest
import torch

from tests.activation_memory import korthikanti, measure, ours

S, B, H, A = 64, 2, 64, 4  # as in tests/distributed/test_activation_memory.py
RECOMPUTE = [None, "selective", "full"]


def test_itemised_formula_is_the_papers():
    for t, sp, rec in itertools.product((1, 2, 4, 8), (False, True), RECOMPUTE):
        if t == 1 and sp:
            continue
        assert ours(S, B, H, A, t, sp, rec, "unfused") == pytest.approx(korthikanti(S, B, H, A, t, sp, rec))


def test_measure_counts_storages_once_and_skips_parameters():
    w = torch.nn.Parameter(torch.ones(4, 4))
    x = torch.ones(8, 4, requires_grad=True)
    base = x * 2  # 128 bytes, saved by both matmuls below through views
    _, n = measure(lambda: (base[:4] @ w).sum() + (base[4:] @ w).sum(), [w])
    assert n == base.untyped_storage().nbytes() == 128
