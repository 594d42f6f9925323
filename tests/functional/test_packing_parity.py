"""Packed documents (--reset-attention-mask: segment ids, no [s, s] mask) through the CLI: every layout gives
the losses and grad norms of one process. --mock-data samples pack documents of mean length 12 (seeded,
exponential: from one token to several CP chunks, crossing chunk boundaries)."""
import pytest

from .cli import run_metrics
from .test_parity import BASE, DEEP, LLAMA, PP2, SMALL_BUCKETS, TP2, assert_metrics_parity

# Llama-style: RoPE restarts at each document (--reset-position-ids), GQA
DOCS = LLAMA + ["--reset-attention-mask", "--reset-position-ids", "--mock-document-length", "12"]
CP = ["--context-parallel-size"]
# a window shorter than the mock documents on layers 1 and 3, full attention on 2 and 4, the off-by-one sink
WINDOW = ["--window-size", "8,0", "--window-attn-skip-freq", "2", "--softmax-type", "off-by-one"]
MOE = ["--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "96"]
WINDOW24 = ["--window-size", "24,0", "--softmax-type", "off-by-one"]
LAYOUTS = {  # name: (processes, layout flags, model flags shared with the reference)
    "tp2-sp-pp2": (4, TP2 + PP2 + ["--sequence-parallel"], DEEP),
    "distopt-dp2": (2, ["--use-distributed-optimizer"] + SMALL_BUCKETS, []),
    "tp2-sp": (2, TP2 + ["--sequence-parallel"], []),
    "pp2": (2, PP2, DEEP),
    "pp2-vpp2": (2, PP2 + ["--num-layers-per-virtual-pipeline-stage", "1"], DEEP),
    # CP: chunks of 16 (CP2) or 8 (CP4) tokens; documents cross chunks, short ones let the ring skip blocks
    **{f"cp2-{c}": (2, CP + ["2", "--cp-comm-type", c], []) for c in ("p2p", "all_gather", "a2a")},
    "cp4-p2p": (4, CP + ["4", "--cp-comm-type", "p2p"], []),
    "window-tp2-sp": (2, TP2 + ["--sequence-parallel"], DEEP + WINDOW),
    # CP2 chunks of 16: a window of 8 (shorter than a chunk) and of 24 (longer)
    **{f"window-cp2-{c}": (2, CP + ["2", "--cp-comm-type", c], DEEP + WINDOW) for c in ("p2p", "all_gather", "a2a")},
    "window24-cp2-p2p": (2, CP + ["2", "--cp-comm-type", "p2p"], DEEP + WINDOW24),
    "tp2-cp2-pp2": (8, TP2 + CP + ["2"] + PP2 + ["--sequence-parallel"], DEEP),
    "moe-ep2": (2, ["--expert-model-parallel-size", "2"], MOE),
}
_reference = {}


def _reference_run(model):
    key = tuple(model)
    if key not in _reference:
        _reference[key] = run_metrics(BASE + DOCS + model)[1]
    return _reference[key]


@pytest.mark.slow
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_packed_documents_layout_matches_one_process(name):
    nproc, flags, model = LAYOUTS[name]
    proc, got = run_metrics(BASE + DOCS + model + flags, nproc=nproc)
    assert ("> document masks: across context-parallel" if "cp" in name else
            "> document masks: exact per-document SDPA") in proc.stdout
    window = "window (24, 0) on layers [1, 2, 3, 4]" if "window24" in name else "window (8, 0) on layers [1, 3]"
    assert (f"> attention window / sink: {window}, softmax off-by-one" in proc.stdout) == ("window" in name)
    assert_metrics_parity(_reference_run(model), got)
