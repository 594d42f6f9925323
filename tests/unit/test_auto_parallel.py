"""--auto-parallel's choice (training/planner/auto_parallel.py) on paper: pins kept, MoE gets EP, the same on
every rank's environment and twice in a row, BERT's own flags kept out of the planner's parser."""
import functools
import json
import os
import subprocess
import sys

import pytest

from megatron.training.config.arguments import parse_args
from megatron.training.config.no_effect_flags import accepted
from megatron.training.config.training_config import BertOptions
from megatron.training.planner.auto_parallel import choose_and_parse, model_argv, new_flags, pinned, without_auto

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = ["--auto-parallel", "--planner-gpu", "H100-SXM", "--mock-data", "--tokenizer-type", "NullTokenizer",
        "--vocab-size", "1000", "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
        "--seq-length", "64", "--global-batch-size", "8", "--train-iters", "10", "--lr", "2e-3"]
MOE = ["--auto-parallel", "--planner-gpu", "H100-SXM", "--mock-data", "--tokenizer-type", "NullTokenizer",
       "--vocab-size", "32000", "--num-layers", "2", "--hidden-size", "2048", "--num-attention-heads", "16",
       "--seq-length", "4096", "--global-batch-size", "16", "--lr", "2e-3", "--num-experts", "8",
       "--moe-router-topk", "2", "--ffn-hidden-size", "8192", "--swiglu", "--bf16", "--micro-batch-size", "1",
       "--recompute-granularity", "selective"]


@pytest.fixture
def world4(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")


def test_given_tensor_parallel_size_is_kept_and_the_rest_chosen(world4):
    (m, t), lines = choose_and_parse(TINY + ["--tensor-model-parallel-size", "2"], parse_args)
    assert m.tensor_model_parallel_size == 2
    assert m.sequence_parallel  # chosen: SP with TP (the default search's dominant choice)
    assert t.global_batch_size == 8 and t.micro_batch_size in (1, 2, 4)
    assert "pinned by the command line: tp=2" in lines[0]
    assert lines[2].count("--tensor-model-parallel-size") == 1 and "--auto-parallel" not in lines[2]


def test_without_auto_parallel_the_command_line_is_parsed_once_as_is(world4):
    (m, t), lines = choose_and_parse(TINY[1:] + ["--micro-batch-size", "2"], parse_args)
    assert lines == [] and m.tensor_model_parallel_size == 1 and t.micro_batch_size == 2


def test_a_moe_model_gets_an_expert_parallel_choice(world4):
    (m, t), lines = choose_and_parse(MOE, parse_args)
    assert m.expert_model_parallel_size > 1, lines
    assert m.recompute_granularity == "selective" and t.micro_batch_size == 1  # pinned


CHOICE = """
import json, sys
from megatron.training.config.arguments import parse_args
from megatron.training.config.no_effect_flags import accepted
from megatron.training.planner.auto_parallel import choose_and_parse
(m, t), lines = choose_and_parse(json.loads(sys.argv[1]), parse_args)
print(json.dumps(lines[2]))
"""


def test_same_choice_on_every_rank_environment_and_twice_in_a_row(world4, monkeypatch):
    argv = TINY + ["--micro-batch-size", "2"]
    here = []
    for rank in range(4):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("LOCAL_RANK", str(rank))
        here.append(choose_and_parse(argv, parse_args)[1][2])
    here.append(choose_and_parse(argv, parse_args)[1][2])
    assert len(set(here)) == 1, here
    # another process (another hash seed, another rank's variables) print the same command line
    procs = [subprocess.Popen([sys.executable, "-c", CHOICE, json.dumps(argv)], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "RANK": str(r), "LOCAL_RANK": str(r), "PYTHONHASHSEED": str(r + 1),
                                   "PYTHONPATH": REPO}) for r in (3,)]
    outs = [json.loads(p.communicate(timeout=120)[0]) for p in procs]
    assert outs == here[:1], outs


def test_bert_flags_stay_out_of_the_planner_and_in_the_run(world4):
    extra = [("BERT", BertOptions)]
    argv = TINY + ["--bert-no-binary-head", "--mask-prob", "0.2"]
    assert model_argv(argv, extra) == TINY
    parse = functools.partial(parse_args, description="Pretrain a BERT model.", extra=extra)
    (m, t, bert), lines = choose_and_parse(argv, parse, extra, "pretrain_bert.py")
    assert not bert.bert_binary_head and bert.mask_prob == 0.2
    assert "pretrain_bert.py" in lines[2] and "--mask-prob 0.2" in lines[2]


def test_pins_read_from_the_configs():
    argv = TINY + ["--use-distributed-optimizer", "--pipeline-model-parallel-size", "2",
                   "--num-layers-per-virtual-pipeline-stage", "1", "--recompute-granularity=full"]
    m, t = parse_args(argv)[:2]
    assert pinned(argv, m, t) == {"pp": 2, "dist_opt": True, "zero": "optim", "recompute": "full", "vpp": 1}
    argv = TINY + ["--data-parallel-sharding-strategy", "no_shard"]
    assert pinned(argv, *parse_args(argv)[:2]) == {"dist_opt": False, "zero": "no_shard"}


def test_printed_flags_once_and_without_the_planner_flags():
    assert new_flags(["--tensor-model-parallel-size", "2", "--sequence-parallel", "--micro-batch-size", "4"],
                     {"--tensor-model-parallel-size"}) == ["--sequence-parallel", "--micro-batch-size", "4"]
    assert without_auto(["--auto-parallel", "--planner-gpu", "H200", "--lr", "1", "--planner-gpu=H200"]) == \
        ["--lr", "1"]


def test_planner_gpu_without_auto_parallel_is_accepted_without_effect():
    m, t = parse_args(TINY[1:])[:2]
    assert ("--planner-gpu", "without --auto-parallel nothing is planned") in accepted(m, t)
    assert not accepted(*parse_args(TINY)[:2])
