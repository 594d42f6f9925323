"""A DeepSeek-V3-shaped model through the CLI (multi-latent attention with query compression, latent
norms and YaRN; sigmoid group-limited MoE with the expert bias and the top-k scaling; a dense first
layer; one multi-token prediction module, an MoE layer like the last decoder layer): each layout gives
one process's per-iteration losses (lm, mtp_1, balance) and grad norms, fp32, 12 iterations.

Each layout proves something the others do not:
  TP2: heads split, the shared rotary key's gradient (from every rank's heads) summed over TP
  TP2 + SP: heads split, the replicated down-projections and latent norms run on sequence shards (their
      gradients summed over TP by finalize_model_grads), the latent and the rotary key gathered over TP
  TP2 + SP, selective recompute of the core, of the up-projections (--recompute-modules mla_up_proj) and of
      the norms (layernorm: their outputs freed once read and rebuilt in the backward)
  PP2: the dense layer on one stage, the MoE layer and the MTP module on the other, which holds a copy of
      the (untied) input embedding for MTP whose gradient is summed with the first stage's as a tied one
  EP2 x TP2, expert TP 1 (folding): the MTP module's experts and router over the folded expert grid
  CP2: each rank's chunks of the sequence rotated at their global positions (YaRN table indexed by them)
  DP2 with ZeRO-3 and full recompute: the down-projections sharded and gathered like any other parameter;
      the layers run again in the backward pass
  ZB-H1 at PP2: the up- and down-projections' weight gradients split off into the delayed W passes
  PP2 with two chunks per rank (4 layers), interleaved and ZB-V: the MTP module on the chunk holding the head
"""
import pytest

from .cli import run_metrics
from .test_parity import BASE, ITERS, PP2, TP2, assert_metrics_parity

MLA = ["--position-embedding-type", "rope", "--normalization", "RMSNorm", "--swiglu", "--disable-bias-linear",
       "--untie-embeddings-and-output-weights", "--multi-latent-attention", "--q-lora-rank", "24",
       "--kv-lora-rank", "16", "--qk-head-dim", "16", "--qk-pos-emb-head-dim", "8", "--v-head-dim", "12",
       "--qk-layernorm", "--rotary-scaling-factor", "4", "--mscale", "1.0", "--mscale-all-dim", "1.0",
       "--yarn-original-max-position-embeddings", "16"]
MOE = ["--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "48", "--moe-layer-freq", "([0]+[1])",
       "--moe-router-score-function", "sigmoid", "--moe-router-num-groups", "2", "--moe-router-group-topk", "1",
       "--moe-router-topk-scaling-factor", "2.5", "--moe-router-enable-expert-bias", "--moe-router-bias-update-rate",
       "1e-3", "--moe-router-load-balancing-type", "seq_aux_loss", "--moe-aux-loss-coeff", "1e-2",
       "--moe-shared-expert-intermediate-size", "48", "--moe-token-dispatcher-type", "alltoall"]
MTP = ["--mtp-num-layers", "1", "--mtp-loss-scaling-factor", "0.1"]
FLAGS = BASE + MLA + MOE + MTP + ["--eval-iters", "0"]  # validation logs the lm loss alone
TERMS = ("lm loss", "mtp_1 loss", "load_balancing_loss")
_ref = {}


def reference():
    if "one" not in _ref:
        _ref["one"] = run_metrics(FLAGS)[1]
        assert sorted(_ref["one"]["train"]) == list(range(1, ITERS + 1))
    return _ref["one"]


LAYOUTS = {
    "tp2": (2, TP2),
    "tp2-sp": (2, TP2 + ["--sequence-parallel"]),
    "tp2-sp-recompute-up": (2, TP2 + ["--sequence-parallel", "--recompute-granularity", "selective",
                                      "--recompute-modules", "core_attn", "mla_up_proj", "layernorm"]),
    "pp2": (2, PP2),
    "cp2": (2, ["--context-parallel-size", "2"]),
    "dp2-zero3-recompute": (2, ["--use-distributed-optimizer", "--data-parallel-sharding-strategy",
                                "optim_grads_params", "--recompute-granularity", "full"]),
    "pp2-zb-h1": (2, PP2 + ["--pipeline-schedule", "zb-h1"]),
    "ep2-tp2-folded": (4, TP2 + ["--sequence-parallel", "--expert-model-parallel-size", "2",
                                 "--expert-tensor-parallel-size", "1"]),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_deepseek_shaped_layout_matches_one_process(name):
    nproc, flags = LAYOUTS[name]
    got = run_metrics(FLAGS + flags, nproc=nproc)[1]
    assert_metrics_parity(reference(), got, TERMS)


DEEP = ["--num-layers", "4", "--moe-layer-freq", "([0]+[1]*3)"]
CHUNKED = {  # two model chunks per rank, MTP in the last one
    "pp2-vpp2": (2, PP2 + ["--num-layers-per-virtual-pipeline-stage", "1"]),
    "pp2-zb-v": (2, PP2 + ["--pipeline-schedule", "zb-v"]),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CHUNKED))
def test_deepseek_shaped_chunked_pipeline_matches_one_process(name):
    """Interleaved 1F1B (the MTP module in the last stage's second chunk) and ZB-V (in the first stage's second
    chunk, the bottom of the V, with the input table's copy tied across chunks of one rank), 4 layers."""
    if "deep" not in _ref:
        _ref["deep"] = run_metrics(FLAGS + DEEP)[1]
    nproc, flags = CHUNKED[name]
    assert_metrics_parity(_ref["deep"], run_metrics(FLAGS + DEEP + flags, nproc=nproc)[1], TERMS)


@pytest.mark.slow
def test_checkpoint_saved_at_tp2_pp2_continues_at_one_process(tmp_path):
    """Layout-free checkpoints of the new parameters: the replicated down-projections (saved once), the MTP module
    and the expert biases saved at TP2 x PP2 (the last stage's copy of the input table not saved); one process
    loads them at iteration 6 and goes on with the one-process run's losses."""
    d = str(tmp_path / "ck")
    first = run_metrics(FLAGS + TP2 + PP2 + ["--sequence-parallel", "--save", d, "--save-interval", "6",
                                             "--exit-interval", "6"], nproc=4)[1]
    second = run_metrics(FLAGS + ["--load", d])[1]
    assert sorted(first["train"]) == list(range(1, 7)) and sorted(second["train"]) == list(range(7, ITERS + 1))
    got = {"train": {**first["train"], **second["train"]}, "validation": {}}
    assert_metrics_parity(reference(), got, TERMS)
