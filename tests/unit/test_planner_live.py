"""The planner's start-up line on a GPU (planner/live.py), here with a faked H100: every layout the
CLI parity suite runs gets its prediction (GPT, BERT, TP, SP, PP, VPP, DP, distributed optimizer,
ZeRO-2/3, CP p2p / all_gather / a2a, EP, folded EP, expert TP, zero-bubble schedules, MoE with and
without expert biases, multi-latent attention with MTP, FP8), and whatever goes wrong inside the
prediction gives one '> planner: no prediction (...)' line, never an exception: the prediction is
information and must not stop a run (issue 26: a2a CP killed rank 0). The layouts are read from the
parity tests themselves, so a layout added there is covered here."""
import types

import pytest
import torch

from megatron.training.config.arguments import parse_args
from megatron.training.config.resolve import resolve, validate
from megatron.training.config.training_config import BertOptions
from megatron.training.planner import live
from megatron.training.planner.predict import PLAN_DEFAULTS
from tests.functional import (
    test_bert_parity,
    test_context_parallel,
    test_fp8_parity,
    test_mla_parity,
    test_moe_bias_parity,
    test_moe_etp_above_tp,
    test_moe_folding,
    test_moe_parity,
    test_moe_zero_bubble_parity,
    test_parity,
    test_zero_bubble_parity,
    test_zero_cli,
)


def _parity_layouts():
    """{name: (script, world size, flags)} of the CLI parity suite's layouts."""
    gpt, moe = test_parity, test_moe_parity
    out = {f"gpt-{n}": ("gpt", w, gpt.BASE + m + f) for n, (w, f, m) in gpt.LAYOUTS.items()}
    out["gpt-llama-tp2-dp2-sp"] = ("gpt", 4, gpt.BASE + gpt.LLAMA + gpt.TP2 + ["--sequence-parallel"])
    out.update({f"bert-{n}": ("bert", w, test_bert_parity.BASE + m + f)
                for n, (w, f, m) in test_bert_parity.LAYOUTS.items()})
    cp = test_context_parallel
    out.update({f"cp-{n}": ("gpt", w, gpt.BASE + cp.MODEL + f) for n, (w, f) in cp.LAYOUTS.items()})
    zb = test_zero_bubble_parity
    out.update({f"zb-{n}": ("gpt", w, zb.FAST + gpt.DEEP + f) for n, (w, f) in zb.LAYOUTS.items()})
    out["zb-v-pp4"] = ("gpt", 4, zb.FAST + zb.V8 + gpt.PP4 + zb.ZB_V)
    out["zb-v-pp2-dp2-overlap"] = ("gpt", 4, zb.FAST + zb.V8 + gpt.PP2 + zb.ZB_V + ["--overlap-grad-reduce"])
    z = test_zero_cli
    out["zero3-tp2-sp-pp2-dp2"] = ("gpt", 8, z.FLAGS + z.Z3 + z.OVERLAP + gpt.TP2 + ["--sequence-parallel"] + gpt.PP2)
    out["zero3-pp2-vpp2-dp2-recompute"] = ("gpt", 4, z.FLAGS + z.Z3 + gpt.PP2 + [
        "--num-layers-per-virtual-pipeline-stage", "1", "--recompute-granularity", "full", "--recompute-method",
        "uniform", "--recompute-num-layers", "1"])
    out["zero2-pp2-dp2"] = ("gpt", 4, z.FLAGS + z.Z2 + gpt.PP2)
    out.update({f"moe-{n}": ("gpt", w, moe.FLAGS + moe.MOE + m + f) for n, (w, f, m) in moe.LAYOUTS.items()})
    out["moe-cp2-ep2-alltoall"] = ("gpt", 4, moe.FLAGS + moe.MOE + gpt.LLAMA + moe.EP2 + [
        "--context-parallel-size", "2", "--moe-token-dispatcher-type", "alltoall"])
    out["moe-zero2-ep2"] = ("gpt", 4, moe.FLAGS + moe.MOE + moe.EP2 + z.Z2 + [
        "--moe-token-dispatcher-type", "alltoall"])
    out["moe-zero3-ep2"] = ("gpt", 2, moe.FLAGS + moe.MOE + moe.EP2 + z.Z3)
    out.update({f"moe-folded-{n}": ("gpt", w, moe.FLAGS + moe.MOE + f)
                for n, (w, f) in test_moe_folding.LAYOUTS.items()})
    etp = test_moe_etp_above_tp
    out["moe-etp2"] = ("gpt", 2, moe.FLAGS + moe.MOE + etp.ETP2)
    out["moe-tp2-etp4"] = ("gpt", 4, moe.FLAGS + moe.MOE + etp.ETP4)
    bias = test_moe_bias_parity
    out.update({f"moe-bias-{n}": ("gpt", w, moe.FLAGS + bias.BIASED + m + f) for n, (w, f, m) in bias.LAYOUTS.items()})
    mzb = test_moe_zero_bubble_parity
    out.update({f"moe-zb-{n}": ("gpt", w, moe.FLAGS + moe.MOE + mzb.MODEL + f) for n, (w, f) in mzb.LAYOUTS.items()})
    mla = test_mla_parity  # multi-latent attention + MTP (planner/mla_cost.py, cost.mtp_costs)
    out.update({f"mla-{n}": ("gpt", w, mla.FLAGS + f) for n, (w, f) in mla.LAYOUTS.items()})
    out.update({f"mla-{n}": ("gpt", w, mla.FLAGS + mla.DEEP + f) for n, (w, f) in mla.CHUNKED.items()})
    fp8 = test_fp8_parity  # FP8 GEMMs and casts (planner/fp8_cost.py), experts under EP
    out.update({f"fp8-{r}-{n}": ("gpt", fp8.LAYOUTS[n][0], fp8.BASE + fp8._model(r) + fp8.LAYOUTS[n][1])
                for r, n in fp8.CASES})
    return out


LAYOUTS = _parity_layouts()


def _configs(script, world, flags):
    """(model config, training config) as training holds them at the prediction: parsed, resolved, validated."""
    extra = [("BERT", BertOptions)] if script == "bert" else []
    c, t = parse_args(PLAN_DEFAULTS + flags, extra=extra)[:2]
    resolve(c, t, world)
    validate(c, t, world)
    return c, t


@pytest.fixture
def h100(monkeypatch):
    """torch.cuda as on one node of 8 H100 SXM (the name the driver reports), without a GPU."""
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: types.SimpleNamespace(
        total_memory=85_000_000_000))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)


def test_the_layouts_cover_every_kind_of_parallelism():
    flags = " ".join(" ".join(f) for _, _, f in LAYOUTS.values())
    for flag in ("--tensor-model-parallel-size", "--sequence-parallel", "--pipeline-model-parallel-size",
                 "--num-layers-per-virtual-pipeline-stage", "--use-distributed-optimizer", "optim_grads ",
                 "optim_grads_params", "--cp-comm-type a2a", "--cp-comm-type all_gather", "--context-parallel-size 2",
                 "--expert-model-parallel-size", "--expert-tensor-parallel-size 1", "--expert-tensor-parallel-size 4",
                 "zb-h1", "zb-h2", "zb-v", "--num-experts"):
        assert flag in flags + " ", flag
    assert sum(script == "bert" for script, _, _ in LAYOUTS.values()) == len(test_bert_parity.LAYOUTS)


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_every_parity_layout_gets_a_prediction_on_an_h100(name, h100):
    script, world, flags = LAYOUTS[name]
    c, t = _configs(script, world, flags)
    line = live.predicted_step_line(c, t, world, "cuda:0")
    assert line is not None and line.startswith(f"> planner (docs/planner.md; {world} x H100-SXM"), line
    assert "s per iteration" in line and "no prediction" not in line


@pytest.mark.parametrize("error", [NotImplementedError("the planner does not model this"), ZeroDivisionError(),
                                   KeyError("H100-SXM"), OSError("tools/estimate_memory.py: no such file")])
def test_any_failure_of_the_prediction_is_one_line_not_an_exception(error, h100, monkeypatch):
    def broken(*args, **kwargs):
        raise error
    monkeypatch.setattr(live, "prediction_line", broken)
    c, t = _configs(*LAYOUTS["gpt-tp2"])
    line = live.predicted_step_line(c, t, 2, "cuda:0")
    assert line.startswith(f"> planner: no prediction ({type(error).__name__}") and "\n" not in line, line


def test_no_line_off_cuda_or_on_a_gpu_without_calibration(monkeypatch):
    c, t = _configs(*LAYOUTS["gpt-tp2"])
    assert live.predicted_step_line(c, t, 2, "cpu") is None
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA GeForce RTX 4090")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: types.SimpleNamespace(
        total_memory=24_000_000_000))
    assert live.predicted_step_line(c, t, 2, "cuda:0") is None
