"""The start-up line naming FP8 (issue 41, item 7): formats, recipe and its settings, the FP8 layers, the
output layer and the GEMM kernel with its reason; nothing without --fp8-format."""
import types

import pytest

from megatron.core.fp8.describe import describe
from megatron.training.config.arguments import parse_args
from megatron.training.config.resolve import resolve, validate

MOCK = ["--mock-data", "--vocab-size", "100", "--num-layers", "4", "--hidden-size", "128", "--num-attention-heads", "4",
        "--seq-length", "16", "--micro-batch-size", "2", "--train-iters", "2", "--lr", "1e-3"]


def _cfg(args):
    m, t = parse_args(MOCK + args)
    resolve(m, t, 1, lambda c: types.SimpleNamespace(vocab_size=c.null_vocab_size + 1))
    validate(m, t, 1)
    return m


@pytest.mark.parametrize("args,parts", [
    (["--fp8-format", "e4m3", "--fp8-amax-history-len", "4", "--fp8-amax-compute-algo", "max", "--fp8-margin", "1"],
     ["--fp8-format e4m3 (e4m3fn forward, e4m3fn gradients), delayed scaling (amax history 4, max), margin 1",
      "layers 1-4 of 4:", "output layer in the model precision", "GEMMs: the fp32 GEMM of the FP8 values"]),
    (["--fp8-format", "hybrid", "--fp8-recipe", "blockwise", "--first-last-layers-bf16", "--fp8-output-layer"],
     ["blockwise scaling (1x128 activation tiles, 128x128 weight blocks)", "layers 2-3 of 4 (--first-last-layers-bf16",
      "output layer FP8 (--fp8-output-layer)", "one per 128-wide slice of K"]),
    (["--fp8-format", "e4m3", "--fp8-recipe", "tensorwise", "--num-experts", "2"],
     ["(the experts and shared experts too)"]),
])
def test_fp8_is_named_with_its_settings(args, parts):
    line = describe(_cfg(args), "cpu")
    assert line.startswith("> FP8: ") and "\n" not in line
    for part in parts:
        assert part in line, (part, line)
    assert "torch._scaled_mm (CUDA)" in describe(_cfg(args), "cuda")


def test_no_line_without_fp8():
    assert describe(_cfg([]), "cpu") is None
