"""FP8 in the planner (training/planner/fp8_cost.py, layouts.py, tools/plan.py --search-fp8): the FP8 linears'
GEMMs at the FP8 peak less the recipe's casts, written out here for one layer; only the layers in FP8 count;
a GPU without FP8 gains nothing and cannot be searched with FP8; the search lists FP8 and bf16 layouts."""
import importlib.util
import os

import pytest
import torch

from megatron.core.config import TransformerConfig
from megatron.core.parallel_layout import ParallelLayout
from megatron.training.planner import cost
from megatron.training.planner.hardware import gemm_time, make_cluster, memory_time
from megatron.training.planner.predict import plan

ONE = ParallelLayout(1)  # one rank: the cost functions' layout for a single GPU

S, B, H, A, F = 2048, 1, 4096, 32, 16384  # a Llama-3 8B-wide layer: where FP8 pays (not at tiny sizes)
H100 = make_cluster("H100-SXM", 8)


def _config(**kw):
    return TransformerConfig(num_layers=4, hidden_size=H, num_attention_heads=A, seq_length=S, ffn_hidden_size=F,
                             vocab_size=1000, params_dtype=torch.bfloat16, **kw).resolve()


def test_one_layer_written_out_tensorwise_and_delayed():
    m = S * B
    shapes = [(m, 3 * H, H), (m, H, H), (m, F, H), (m, H, F)]  # QKV, projection, fc1, fc2 at TP 1
    gemms = sum(gemm_time(H100, M, N, K) for M, N, K in shapes)
    faster = gemms * (1 - 989 / 1979)
    plain = cost.layer_costs(_config(), B, H100, ONE)
    for recipe, amax in (("tensorwise", 2), ("delayed", 0)):
        fwd_bytes = sum((2 + amax + 1) * (M * K + N * K) for M, N, K in shapes)
        bwd_bytes = sum((2 + amax + 1) * M * N + 3 * N * K + 2 * (M * K + M * N) for M, N, K in shapes)
        got = cost.layer_costs(_config(fp8_format="hybrid", fp8_recipe=recipe), B, H100, ONE)
        assert plain.forward - got.forward == pytest.approx(faster - memory_time(H100, fwd_bytes), rel=1e-9)
        assert plain.backward - got.backward == pytest.approx(2 * faster - memory_time(H100, bwd_bytes), rel=1e-9)
        assert got.forward < plain.forward


def test_only_the_fp8_layers_and_only_fp8_gpus():
    plain = cost.layer_costs(_config(), B, H100, ONE).forward
    every = plain - cost.layer_costs(_config(fp8_format="hybrid"), B, H100, ONE).forward
    half = plain - cost.layer_costs(_config(fp8_format="hybrid", first_last_layers_bf16=True,
                                            num_layers_at_start_in_bf16=1, num_layers_at_end_in_bf16=1),
                                    B, H100, ONE).forward
    assert half == pytest.approx(every / 2, rel=1e-12)
    a100 = make_cluster("A100-80GB", 8)
    assert cost.layer_costs(_config(fp8_format="hybrid"), B, a100, ONE) == cost.layer_costs(_config(), B, a100, ONE)


def test_fp8_output_layer_written_out():
    """--fp8-output-layer: the head's GEMM [S B, h] x [v, h]^T at the FP8 peak less its casts; without the flag,
    or on a GPU without FP8, the head costs what it costs in bf16."""
    def head(**kw):
        c = TransformerConfig(num_layers=4, hidden_size=H, num_attention_heads=A, seq_length=S, ffn_hidden_size=F,
                              vocab_size=32000, params_dtype=torch.bfloat16, **kw).resolve()
        return cost.head_costs(c, B, H100, ONE), c
    plain, c = head()
    m, v = S * B, c.padded_vocab_size
    faster = gemm_time(H100, m, v, H) * (1 - 989 / 1979)
    for recipe, amax in (("tensorwise", 2), ("delayed", 0)):
        fwd_bytes = (2 + amax + 1) * (m * H + v * H)
        bwd_bytes = (2 + amax + 1) * m * v + 3 * v * H + 2 * (m * H + m * v)
        got, _ = head(fp8_format="hybrid", fp8_recipe=recipe, fp8_output_layer=True)
        assert plain.forward - got.forward == pytest.approx(faster - memory_time(H100, fwd_bytes), rel=1e-9)
        assert plain.backward - got.backward == pytest.approx(2 * faster - memory_time(H100, bwd_bytes), rel=1e-9)
        assert plain.weight - got.weight == pytest.approx(plain.forward - got.forward, rel=1e-12)
        assert got.forward < plain.forward
    assert head(fp8_format="hybrid")[0] == plain  # the output layer in bf16 (Megatron-LM's default)
    a100 = make_cluster("A100-80GB", 8)
    c8 = head(fp8_format="hybrid", fp8_output_layer=True)[1]
    assert cost.head_costs(c8, B, a100, ONE) == cost.head_costs(c, B, a100, ONE)


ARGV = ["--num-layers", "4", "--hidden-size", "4096", "--num-attention-heads", "32", "--seq-length", "2048",
        "--max-position-embeddings", "2048", "--vocab-size", "32000", "--global-batch-size", "16", "--bf16"]


def test_search_lists_fp8_and_bf16_layouts_and_fp8_is_faster():
    fixed = {"tp": 1, "pp": 1, "mb": 1, "zero": "optim_grads", "recompute": None}
    preds, _ = plan(ARGV, H100, fixed, fp8=True)
    assert sorted(p.label.endswith("FP8") for p in preds) == [False, True]
    fp8 = next(p for p in preds if p.label.endswith("FP8"))
    bf16 = next(p for p in preds if not p.label.endswith("FP8"))
    assert fp8.step.total < bf16.step.total and "--fp8-format" in fp8.flags
    assert len(plan(ARGV, H100, fixed)[0]) == 1  # not asked: not searched


def test_plan_cli_refuses_fp8_search_on_a_gpu_without_fp8(capsys):
    path = os.path.join(os.path.dirname(__file__), "..", "..", "tools", "plan.py")
    spec = importlib.util.spec_from_file_location("plan_cli", path)
    cli = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cli)
    assert cli.main(["--gpu", "A100-80GB", "--search-fp8"] + ARGV) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no FP8 tensor cores" in err
