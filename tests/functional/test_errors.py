"""Bad configuration or data: one line on stderr naming the problem, a non-zero exit, no traceback."""
import os
import struct

import pytest

from tests.data_utils import preprocess, run_tool, write_jsonl

from .cli import run_cli

CASES = {
    "heads not divisible by TP": (
        ["--tensor-model-parallel-size", "2", "--num-attention-heads", "3", "--hidden-size", "96"],
        "--num-attention-heads (3) is not divisible by --tensor-model-parallel-size (2)"),
    "query groups not divisible by TP": (
        ["--tensor-model-parallel-size", "2", "--group-query-attention", "--num-query-groups", "1"],
        "--num-query-groups (1) is not divisible by --tensor-model-parallel-size (2)"),
    "hidden not divisible by heads": (
        ["--hidden-size", "100", "--num-attention-heads", "3"],
        "--hidden-size (100) is not divisible by --num-attention-heads (3)"),
    "world size not divisible by TP x PP": (
        ["--tensor-model-parallel-size", "2"],
        "world size 1 is not divisible by --tensor-model-parallel-size 2"),
    "global batch not divisible by micro x DP": (
        ["--micro-batch-size", "4", "--global-batch-size", "6"],
        "--global-batch-size (6) is not divisible by --micro-batch-size (4)"),
    "sequence longer than positions": (
        ["--seq-length", "512", "--max-position-embeddings", "256"],
        "--seq-length (512) is larger than --max-position-embeddings (256)"),
    "unknown choice": (["--normalization", "BatchNorm"], "argument --normalization: invalid choice: 'BatchNorm'"),
    "unknown decay style": (["--lr-decay-style", "steps"], "argument --lr-decay-style: invalid choice"),
    "bad integer": (["--num-layers", "two"], "argument --num-layers: invalid int value: 'two'"),
    "unknown flag": (["--num-layer", "2"], "unrecognized arguments: --num-layer"),
    "null tokenizer without vocab": (["--mock-data"], "--tokenizer-type NullTokenizer needs --vocab-size"),
    "layers not divisible by PP": (
        ["--num-layers", "3", "--pipeline-model-parallel-size", "2"],
        "--num-layers (3) is not divisible by --pipeline-model-parallel-size (2)"),
    "layers per stage not divisible into chunks": (
        ["--num-layers", "4", "--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "3"],
        "2 layers per stage is not divisible by --num-layers-per-virtual-pipeline-stage (3)"),
    # WORLD_SIZE=2 is what torchrun gives each of 2 ranks; the check runs before any process
    # group exists, so one process prints exactly what every rank would (without torchrun's
    # own failure report)
    "interleaving with microbatches not a multiple of PP": (
        ["--num-layers", "4", "--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "1",
         "--micro-batch-size", "2", "--global-batch-size", "6"],
        "= 3, to be a multiple of --pipeline-model-parallel-size (2)", {"WORLD_SIZE": "2"}),
    "flash attention not installed": (["--attention-backend", "flash"],
                                      "--attention-backend flash: the flash-attn package is not installed"),
    "recompute method without full": (["--recompute-method", "block"],
                                      "--recompute-method and --recompute-num-layers go with "
                                      "--recompute-granularity full"),
    "too many recomputed layers": (["--recompute-granularity", "full", "--recompute-num-layers", "9"],
                                   "--recompute-num-layers (9) must be between 1 and --num-layers (4)"),
    "unwritable cache": (["--data-cache-path", "/proc/megatron-3d-cache"], "cannot write the embedded corpus under"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_config_is_one_clear_line(case):
    args, expected, *env = CASES[case]
    proc = run_cli(args, check=False, timeout=120, env=env[0] if env else None)
    assert_one_line_error(proc, expected)
    assert "iteration" not in proc.stdout


def assert_one_line_error(proc, expected):
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout
    # a missing C++ extension adds one "warning:" line; anything else is one error line
    lines = [line for line in proc.stderr.splitlines() if line.strip() and not line.startswith("warning:")]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ") and expected in lines[0], lines[0]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """A small byte-tokenized dataset, and damaged copies of it."""
    d = tmp_path_factory.mktemp("data")
    texts = [f"document {i}: " + "some text to learn from. " * (i % 7 + 1) for i in range(60)]
    good = preprocess(write_jsonl(d / "in.jsonl", texts), d / "good", ["--tokenizer-type", "ByteTokenizer"])
    for name in ("badmagic", "truncated"):
        for ext in (".bin", ".idx"):
            with open(good + ext, "rb") as src, open(str(d / name) + ext, "wb") as dst:
                dst.write(src.read())
    with open(str(d / "badmagic") + ".idx", "r+b") as fh:
        fh.write(b"NOTANIDX")
    os.truncate(str(d / "truncated") + ".bin", os.path.getsize(good + ".bin") - 10)
    with open(d / "bad.jsonl", "w") as fh:
        fh.write('{"text": "fine"}\n{"text": "also fine"}\n{"text": broken}\n')
    assert struct.unpack("<B", open(good + ".idx", "rb").read()[17:18])[0] == 8  # uint16
    return d, good


BYTE = ["--tokenizer-type", "ByteTokenizer", "--num-layers", "1", "--hidden-size", "32",
        "--num-attention-heads", "2", "--seq-length", "32", "--train-iters", "2"]
DATA_CASES = {
    "missing data": (lambda d, g: BYTE + ["--data-path", str(d / "nothere")], "nothere.idx not found"),
    "corrupt index": (lambda d, g: BYTE + ["--data-path", str(d / "badmagic")], "bad header"),
    "truncated bin": (lambda d, g: BYTE + ["--data-path", str(d / "truncated")], "the file is truncated"),
    "empty split for eval": (lambda d, g: BYTE + ["--data-path", g, "--split", "100,0,0", "--eval-iters", "2"],
                             "gives the valid split of"),
    "no tokenizer": (lambda d, g: ["--data-path", g], "--data-path needs --tokenizer-type"),
    "tokenizer mismatch": (lambda d, g: ["--data-path", g, "--tokenizer-type", "NullTokenizer", "--vocab-size", "50",
                                         "--eval-iters", "0", "--seq-length", "32", "--num-layers", "1"],
                           "outside the tokenizer's vocabulary (size 51)"),
    "bad split": (lambda d, g: BYTE + ["--data-path", g, "--split", "a,b"], "--split 'a,b' must be"),
    "bad blend weight": (lambda d, g: BYTE + ["--data-path", "0", g, "1", g], "weights must be positive"),
    "missing tokenizer model": (lambda d, g: ["--data-path", g, "--tokenizer-type", "SentencePieceTokenizer",
                                              "--tokenizer-model", str(d / "none.model")], "none.model: no such file"),
}


@pytest.mark.parametrize("case", list(DATA_CASES))
def test_bad_data_is_one_clear_line(data, case):
    make_args, expected = DATA_CASES[case]
    # index caches go to the test's folder, not the user's ~/.cache
    proc = run_cli(make_args(*data), check=False, timeout=120, env={"XDG_CACHE_HOME": str(data[0] / "cache")})
    assert_one_line_error(proc, expected)
    assert "iteration" not in proc.stdout


def test_malformed_jsonl_is_reported_with_its_line_number(data, tmp_path):
    d, _ = data
    args = ["--input", d / "bad.jsonl", "--output-prefix", tmp_path / "out", "--tokenizer-type", "ByteTokenizer"]
    proc = run_tool("preprocess_data.py", args)
    assert_one_line_error(proc, "bad.jsonl line 3: not valid JSON")
    assert not list(tmp_path.iterdir())  # nothing half-written is left
    proc = run_tool("preprocess_data.py", args + ["--skip-malformed"])
    assert proc.returncode == 0 and "skipped 1 malformed lines" in proc.stderr
    assert "warning: " in proc.stderr and "line 3" in proc.stderr
    proc = run_tool("preprocess_data.py", ["--input", d / "nothere.jsonl"] + args[2:])
    assert_one_line_error(proc, "nothere.jsonl: no such file")
