"""FP8 parity through the CLI: every layout running FP8 GEMMs against one process running them.

Each tensor split over ranks takes the MAX of its pieces' amaxes over the groups holding them (TP shards
and sequence-parallel pieces, CP chunks), so given the same fp32 values every element is cast to the
FP8 value one process gives it (tests/unit/test_fp8_layout.py shows it per linear); delayed scaling's
step amaxes are also reduced over DP x CP. Blockwise tiles never cross a rank boundary.

What this cannot give is the fp32 parity of the whole run. The layouts sum in other orders (TP partial
sums, the DP gradient reduction), so their fp32 values differ in the last bits, and an element that lies
within those bits of an FP8 rounding boundary is cast one FP8 step apart (2^-4 relative for e4m3, up to
2^-2 for e5m2): a few such flips per step, already in iteration 1's backward (its grad norm: up to 2.3e-6
at TP2+SP), which the following steps amplify (12 iterations: up to 1e-3, docs/fp8.md has the table). So
the test holds iteration 1's loss (same parameters, a forward whose sums differ least) to the parity
tolerance, 2e-6, and prints the run's maxima. With the amax reduction removed (each piece cast with its own
scale) tensorwise TP2+SP missed it at 2.1e-5 and CP2 at 9.0e-6 (grad norms 1.7e-3 and 6.7e-4 apart).
"""
import pytest

from .cli import run_metrics
from .test_parity import BASE, FIRST_TOL, max_relative_differences

RECIPES = {
    "tensorwise": ["--fp8-format", "hybrid", "--fp8-recipe", "tensorwise"],
    "delayed": ["--fp8-format", "hybrid", "--fp8-recipe", "delayed", "--fp8-amax-history-len", "4",
                "--fp8-amax-compute-algo", "max"],
    "blockwise": ["--fp8-format", "hybrid", "--fp8-recipe", "blockwise"],
}
# --fp8-output-layer: the tied table's GEMM (a view of it where the embedding shares the rank) or the output layer's
RECIPES["tensorwise-output"] = RECIPES["tensorwise"] + ["--fp8-output-layer"]
RECIPES["delayed-output-untied"] = RECIPES["delayed"] + ["--fp8-output-layer", "--untie-embeddings-and-output-weights"]
# blockwise at TP2: every TP-split dimension a multiple of 128 (QKV 384, projection input 128, fc1/fc2 512)
BLOCK_SHAPE = ["--hidden-size", "256", "--seq-length", "32", "--micro-batch-size", "1", "--lr", "5e-4"]
TP2_SP = ["--tensor-model-parallel-size", "2", "--sequence-parallel"]
LAYOUTS = {  # name: (processes, flags)
    "tp2-sp": (2, TP2_SP),
    "pp2": (2, ["--pipeline-model-parallel-size", "2"]),
    # zero-bubble: the FP8 weight gradients in W, into DDP's buffer (gradient-accumulation fusion, on by default)
    "pp2-zb-h1": (2, ["--pipeline-model-parallel-size", "2", "--pipeline-schedule", "zb-h1"]),
    "distopt-dp2": (2, ["--use-distributed-optimizer"]),
    "zero3-dp2": (2, ["--data-parallel-sharding-strategy", "optim_grads_params"]),
    # the FP8 weights cast per shard and gathered as FP8 bytes (ZeRO-3: per unit; ZeRO-1: after the step)
    "zero3-dp2-param-gather": (2, ["--data-parallel-sharding-strategy", "optim_grads_params", "--fp8-param-gather"]),
    "distopt-dp2-param-gather": (2, ["--use-distributed-optimizer", "--fp8-param-gather"]),
    "cp2": (2, ["--context-parallel-size", "2"]),
    # each expert's input holds both ranks' micro-batches: each source rank's rows cast with their own scales
    # 4 ranks: expert-DP 2, over which delayed scaling's expert step amaxes reduce
    "ep2-alltoall": (4, ["--expert-model-parallel-size", "2", "--moe-token-dispatcher-type", "alltoall"]),
    # and TP2 + SP (DP2): the pieces line up over TP (the same tokens, the same routing), so each piece's amaxes
    # reduce over expert TP as well
    "ep2-tp2-sp": (4, ["--expert-model-parallel-size", "2", "--moe-token-dispatcher-type", "alltoall"] + TP2_SP),
    # the allgather dispatcher names each expert's rows per source as well (test_moe_dispatch_pieces.py)
    "ep2-allgather": (4, ["--expert-model-parallel-size", "2", "--moe-token-dispatcher-type", "allgather"]),
    "ep2-allgather-tp2-sp": (4, ["--expert-model-parallel-size", "2", "--moe-token-dispatcher-type", "allgather"]
                             + TP2_SP),
    # with CP, EP re-splits CP x DP with CP fastest: at EP2 x CP2 an EP group is a CP pair (its pieces are one
    # micro-batch, cast together); at EP2 x CP4 also the CP ranks holding the same experts reduce (groups.ecp);
    # at EP4 x CP2 an EP group holds two micro-batches, two chunks each
    "ep2-cp2": (4, ["--expert-model-parallel-size", "2", "--moe-token-dispatcher-type", "alltoall",
                    "--context-parallel-size", "2"]),
    "ep2-cp4": (4, ["--expert-model-parallel-size", "2", "--moe-token-dispatcher-type", "alltoall",
                    "--context-parallel-size", "4"]),
    "ep4-cp2": (4, ["--expert-model-parallel-size", "4", "--moe-token-dispatcher-type", "alltoall",
                    "--context-parallel-size", "2"]),
    # folded (expert TP != TP): each TP rank routes its own sequence slice, so one micro-batch's rows of an expert
    # arrive from TP ranks (cast together); at EP4 two micro-batches' (cast apart); at EP 1 they stay on the TP
    # ranks (reduced over groups.ecp = tp_cp)
    "tp2-sp-etp1": (2, TP2_SP + ["--expert-tensor-parallel-size", "1"]),
    "tp2-sp-etp1-ep2": (2, TP2_SP + ["--expert-tensor-parallel-size", "1", "--expert-model-parallel-size", "2",
                                     "--moe-token-dispatcher-type", "alltoall"]),
    "tp2-sp-etp1-ep4-allgather": (4, TP2_SP + ["--expert-tensor-parallel-size", "1", "--expert-model-parallel-size",
                                               "4", "--moe-token-dispatcher-type", "allgather"]),
    "tp2-etp1-ep4": (4, ["--tensor-model-parallel-size", "2", "--expert-tensor-parallel-size", "1",
                         "--expert-model-parallel-size", "4", "--moe-token-dispatcher-type", "alltoall"]),
    # expert TP 2 over DP ranks: each expert's rows gathered over expert TP hold four micro-batches (sources
    # [0, 2, 1, 3]), its weights split over it
    "etp2-ep2": (4, ["--expert-tensor-parallel-size", "2", "--expert-model-parallel-size", "2",
                     "--moe-token-dispatcher-type", "alltoall"]),
    # 8 ranks: gathered over expert TP 4, micro-batches [0, 2, 0, 2, 1, 3, 1, 3]: one micro-batch's rows apart
    "tp2-sp-etp4-ep2": (8, TP2_SP + ["--expert-tensor-parallel-size", "4", "--expert-model-parallel-size", "2",
                                     "--moe-token-dispatcher-type", "alltoall"]),
    # EP2 x CP3 (neither divides the other): an EP group holds one micro-batch's two chunks, or chunks of two;
    # each micro-batch's amax reduces over the expert-DP ranks sharing it (groups.ecp, one call for all)
    "ep2-cp3": (6, ["--expert-model-parallel-size", "2", "--moe-token-dispatcher-type", "alltoall",
                    "--context-parallel-size", "3"]),
}
# MoE: each expert's input is its micro-batch's tokens, replicated over TP and split over CP, so its amaxes
# reduce over those groups as the dense linears'; under EP2 an expert's input holds two ranks' micro-batches
# (or chunks of one, with CP), cast apart per micro-batch, and delayed step amaxes reduce over expert-DP
# a capacity factor under EP: the pieces are the kept rows per source (the dispatchers count after the drop);
# padded to capacity, the expert input is padded per micro-batch, each one process's padded input
CAPACITY = ["--moe-expert-capacity-factor", "0.5"]
MOE = ["--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "96", "--moe-aux-loss-coeff", "1e-2",
       "--disable-bias-linear", "--moe-shared-expert-intermediate-size", "64"]
DENSE = [layout for layout in LAYOUTS if not layout.startswith("ep") and "etp" not in layout]
CASES = [(r, layout) for r in ("tensorwise", "delayed") for layout in DENSE] + \
    [("blockwise", "tp2-sp"), ("blockwise", "distopt-dp2")] + \
    [("moe-" + r, layout) for r in ("tensorwise", "delayed") for layout in ("tp2-sp", "cp2", "distopt-dp2",
                                                                           "ep2-alltoall", "ep2-tp2-sp")] + \
    [("moe-tensorwise", "ep2-allgather-tp2-sp"), ("moe-delayed", "ep2-allgather")] + \
    [("moe-" + r, layout) for r in ("tensorwise", "delayed") for layout in ("ep2-cp2", "ep2-cp4", "ep4-cp2")] + \
    [("moecap-tensorwise", "ep2-tp2-sp"), ("moecap-delayed", "ep2-allgather"), ("moecap-tensorwise", "ep2-cp2")] + \
    [("moe-delayed", "ep2-alltoall-zero3-param-gather")] + \
    [("moe-" + r, layout) for r in ("tensorwise", "delayed") for layout in ("tp2-sp-etp1", "tp2-sp-etp1-ep2",
                                                                           "tp2-sp-etp1-ep4-allgather", "tp2-etp1-ep4",
                                                                           "etp2-ep2", "tp2-sp-etp4-ep2")] + \
    [("moe48-" + r, "ep2-cp3") for r in ("tensorwise", "delayed")] + \
    [("moecap-tensorwise", "tp2-sp-etp1-ep4-allgather")] + \
    [("blockwise-long", "cp2")] + \
    [("moepad-" + r, layout) for r in ("tensorwise", "delayed") for layout in ("ep2-alltoall", "ep2-allgather-tp2-sp",
                                                                              "tp2-sp-etp1-ep2", "ep2-cp2")] + \
    [("moe-blockwise", layout) for layout in ("tp2-sp", "ep2-alltoall", "tp2-sp-etp1-ep2", "etp2-ep2")] + \
    [(r, layout) for r in ("tensorwise-output", "delayed-output-untied") for layout in ("tp2-sp", "pp2")]
# experts' FP8 weights in buffers over expert-DP, cast and gathered per unit there
LAYOUTS["ep2-alltoall-zero3-param-gather"] = (4, LAYOUTS["ep2-alltoall"][1] + LAYOUTS["zero3-dp2-param-gather"][1])

# where no sum of the backward is split over ranks (EP over DP only), iteration 1's grad norm is held too: the
# padding layout's flips show there first (padded with the real rows first, 9.4e-5 apart, the loss 2.6e-6)
GRAD_NORM_TOO = {("moepad-tensorwise", "ep2-alltoall"), ("moepad-delayed", "ep2-alltoall")}
_reference = {}


def _model(recipe):
    if recipe == "blockwise-long":  # CP2 chunks of 256 / 4 positions x 2 sequences: whole 128-token tiles
        return RECIPES["blockwise"] + ["--seq-length", "256"]
    if recipe == "moe-blockwise":  # every split FFN (experts over TP or expert TP 2, shared expert) 128 a rank
        return RECIPES["blockwise"] + BLOCK_SHAPE + MOE + ["--moe-ffn-hidden-size", "256",
                                                           "--moe-shared-expert-intermediate-size", "256"]
    if recipe.startswith("moe48-"):  # a sequence CP3 splits into 2 x 3 chunks
        return RECIPES[recipe[6:]] + MOE + ["--seq-length", "48"]
    if recipe.startswith("moe-"):
        return RECIPES[recipe[4:]] + MOE
    if recipe.startswith("moepad-"):  # padded to capacity, with biases: the zero rows reach fc2 as gelu(fc1's bias)
        return RECIPES[recipe[7:]] + [f for f in MOE if f != "--disable-bias-linear"] + \
            ["--moe-expert-capacity-factor", "1.5", "--moe-pad-expert-input-to-capacity"]  # experts not full
    if recipe.startswith("moecap-"):
        return RECIPES[recipe[7:]] + MOE + CAPACITY
    return RECIPES[recipe] + (BLOCK_SHAPE if recipe == "blockwise" else [])


def reference(flags):
    key = tuple(flags)
    if key not in _reference:
        _reference[key] = run_metrics(BASE + flags)[1]
    return _reference[key]


@pytest.mark.slow
@pytest.mark.parametrize("recipe,layout", CASES, ids=[f"{r}-{layout}" for r, layout in CASES])
def test_fp8_layout_matches_one_process_fp8(recipe, layout):
    nproc, flags = LAYOUTS[layout]
    got = run_metrics(BASE + _model(recipe) + flags, nproc=nproc)[1]
    ref = reference(_model(recipe))
    first = abs(got["train"][1]["losses"]["lm loss"] / ref["train"][1]["losses"]["lm loss"] - 1)
    diff = max_relative_differences(ref, got)
    print(f"{recipe} {layout}: iteration 1 loss {first:.1e}; max relative differences {diff}")
    assert first <= FIRST_TOL, f"iteration 1 loss: relative {first:.2e} > {FIRST_TOL}"
    if (recipe, layout) in GRAD_NORM_TOO:
        assert diff["first"] <= FIRST_TOL, f"iteration 1 grad norm: relative {diff['first']:.2e} > {FIRST_TOL}"


@pytest.mark.slow
@pytest.mark.parametrize("recipe", list(RECIPES))
def test_fp8_changes_the_result(recipe):
    """FP8 is on: the one-process FP8 run differs from the same run in fp32 (else parity proves nothing);
    --fp8-output-layer: from the same FP8 run with the output layer in fp32."""
    base = BLOCK_SHAPE if recipe == "blockwise" else []
    if "-output" in recipe:
        base = [f for f in RECIPES[recipe] if f != "--fp8-output-layer"]
    diff = max_relative_differences(reference(base), reference(_model(recipe)))
    print(f"{recipe} vs {'FP8 without the output layer' if '-output' in recipe else 'fp32'}: {diff}")
    assert diff["first"] > 1e-5
