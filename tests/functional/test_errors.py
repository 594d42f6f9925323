"""Bad configuration: one line on stderr naming the problem, a non-zero exit, no traceback."""
import pytest

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
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_config_is_one_clear_line(case):
    args, expected, *env = CASES[case]
    proc = run_cli(args, check=False, timeout=120, env=env[0] if env else None)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ") and expected in lines[0], lines[0]
    assert "iteration" not in proc.stdout
