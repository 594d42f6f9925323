"""tools/plan.py's checks (issue 41, item 7): a bad model size names its flag and rule before any layout is
searched (every size pretrain_gpt.py checks, walked), a weight too large to allocate is one line, a search that
finds nothing says why, a long search says how far it is, and nothing that fits prints no "best" command."""
import io

import pytest

from megatron.core.config import TransformerConfig
from megatron.core.config_fields import flag_of
from tools import plan as plan_cli
from tools.plan_checks import Progress

TOY = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "2", "--seq-length", "16",
       "--vocab-size", "64", "--global-batch-size", "4"]
ONE_GPU = ["--num-gpus", "1", "--gpus-per-node", "1"]
# the model's sizes (every one pretrain_gpt.py checks positive) and the training counts a plan reads
SIZES = [flag_of(TransformerConfig, n) if n != "vocab_size" else "--vocab-size" for n in TransformerConfig.SIZES] + \
        ["--global-batch-size", "--micro-batch-size"]
NEEDS = {"--num-layers-per-virtual-pipeline-stage": ["--pipeline-model-parallel-size", "2"],
         "--num-query-groups": ["--group-query-attention"],
         "--moe-ffn-hidden-size": ["--num-experts", "2"],
         "--moe-shared-expert-intermediate-size": ["--num-experts", "2"]}


def _run(capsys, args):
    code = plan_cli.main(ONE_GPU + TOY + args)
    out, err = capsys.readouterr()
    return code, out, [line for line in err.splitlines() if line.startswith("error:")]


@pytest.mark.parametrize("flag", SIZES)
def test_every_size_at_zero_names_its_flag_not_no_valid_layout(capsys, flag):
    code, out, errors = _run(capsys, NEEDS.get(flag, []) + [flag, "0"])
    assert code == 2 and len(errors) == 1 and flag in errors[0] and "no valid layout" not in errors[0], errors
    assert "best layout" not in out


@pytest.mark.parametrize("args,expected", [
    (["--num-experts", "8", "--moe-router-num-groups", "3", "--moe-router-group-topk", "1"],
     "--moe-router-num-groups (3) must divide --num-experts (8)"),
    (["--hidden-size", "4000000000", "--num-attention-heads", "1"],
     "no device can allocate a weight that large (its storage size overflows 64 bits)"),
    (["--num-attention-heads", "3"], "--hidden-size (32) is not divisible by --num-attention-heads (3)"),
])
def test_model_rules_are_named_before_the_search(capsys, args, expected):
    code, _, errors = _run(capsys, args)
    assert code == 2 and len(errors) == 1 and expected in errors[0], errors


def test_a_search_that_finds_nothing_says_why(capsys):
    code, _, errors = _run(capsys, ["--num-gpus", "2", "--fix", "tp=2", "--num-attention-heads", "1"])
    assert code == 2 and len(errors) == 1
    assert "no valid layout" in errors[0] and "e.g. TP2" in errors[0] and "is not divisible by" in errors[0]


def test_nothing_fits_prints_no_best_command(capsys):
    code, out, errors = _run(capsys, ["--gpu-memory-gb", "1e-6", "--top", "1"])
    assert code == 2 and "best layout" not in out and "torchrun" not in out
    assert len(errors) == 1 and errors[0].startswith("error: no layout fits in 1e-06 GB per GPU (the least memory")


def test_progress_says_how_many_and_how_far():
    now, out = [0.0], io.StringIO()
    progress = Progress(4096, every=10.0, clock=lambda: now[0], out=out)
    for done in range(100):
        now[0] = done * 1.0
        progress(done, 100)
    lines = out.getvalue().splitlines()
    assert lines[0] == "> planning: 100 layouts on 4096 GPUs"
    assert lines[1].startswith("> planned 10 of 100 layouts (10 s, about 90 s left")
    assert len(lines) == 10  # one every 10 s, none at the end
