"""BERT loss parity through pretrain_bert.py: both losses (masked LM and sentence order) of
every layout equal one process's, iteration by iteration (fp32)."""
import pytest

from .cli import run_metrics
from .test_parity import BASE as GPT_BASE
from .test_parity import assert_metrics_parity, reference

BASE = GPT_BASE + ["--num-layers", "4"]  # enough layers for 2 stages x 2 chunks; the last flag wins
TP2, PP2 = ["--tensor-model-parallel-size", "2"], ["--pipeline-model-parallel-size", "2"]

# name: (processes, layout flags, model flags shared with the one-process reference)
LAYOUTS = {
    "tp2": (2, TP2, []),
    "pp2": (2, PP2, []),
    "tp2-pp2-dp2": (8, TP2 + PP2, []),
    "tp2-sp-pp2-vpp2-post-norm": (4, TP2 + PP2 + ["--sequence-parallel", "--num-layers-per-virtual-pipeline-stage",
                                                  "1"], ["--post-norm"]),
    "dp2-distopt-nsp": (2, ["--use-distributed-optimizer"], ["--binary-head-task", "nsp"]),
    "tp2-pp2-no-binary-head": (4, TP2 + PP2, ["--bert-no-binary-head"]),
}

def loss_names(model_flags):
    if "--bert-no-binary-head" in model_flags:
        return ["lm loss"]
    return ["lm loss", "nsp loss" if "nsp" in model_flags else "sop loss"]


@pytest.mark.slow
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_bert_layout_matches_one_process(name):
    nproc, flags, model = LAYOUTS[name]
    ref = reference(model, "pretrain_bert.py", BASE)
    proc, got = run_metrics(BASE + model + flags, nproc=nproc, script="pretrain_bert.py")
    assert sorted(ref["train"][1]["losses"]) == sorted(loss_names(model))
    assert_metrics_parity(ref, got, loss_names(model))
    if "--bert-no-binary-head" in model:
        assert "sop loss" not in proc.stdout and "nsp loss" not in proc.stdout
