"""The planner prices each group where the layout puts it (ParallelLayout.stride / crosses_node), not where
a rank-order formula of its own says: the tied embedding's first <-> last stage all-reduce, the CP ring, the
pipeline's sends and ZB-V's two chunks."""
import collections

import pytest

from megatron.core.parallel_layout import ParallelLayout
from megatron.training.config.resolve import parallel_layout
from megatron.training.planner import make_cluster, predict
from megatron.training.planner.hardware import collective_time
from megatron.training.planner.layouts import Space, enumerate_layouts
from megatron.training.planner.predict import configs
from megatron.training.planner.traffic import iteration_p2p_sent, p2p_message_bytes

TOY = ["--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "128",
       "--max-position-embeddings", "128", "--vocab-size", "512", "--global-batch-size", "16", "--bf16",
       "--micro-batch-size", "1"]
TP4_CP2_PP2 = ["--tensor-model-parallel-size", "4", "--context-parallel-size", "2", "--attention-dropout", "0",
               "--pipeline-model-parallel-size", "2"]


def test_tied_embedding_all_reduce_at_tp4_cp2_crosses_nodes():
    """16 GPUs, 8 to a node, TP4 x CP2 x PP2 (DP 1): the first stage is ranks 0-7, the last 8-15, so the
    tied embedding's all-reduce between them (rank r and r + TP x CP x DP = r + 8) leaves the node. Priced
    at TP x DP x (PP - 1) = 4 ranks apart (CP left out) it looked like NVLink."""
    cluster = make_cluster("H100-SXM", 16, gpus_per_node=8)
    c, _ = configs(TOY + TP4_CP2_PP2, 16)
    tied = c.padded_vocab_size * c.hidden_size / 4 * 4  # the fp32 gradient of this TP rank's table shard
    across, inside = (collective_time(cluster, "all_reduce", tied, 2, apart) for apart in (4 * 2 * 1, 4))
    assert across > 2 * inside  # the network is far slower than NVLink: the two prices are told apart
    step = predict(TOY + TP4_CP2_PP2, cluster).step
    assert step.finalize == pytest.approx(across, rel=1e-12)


def test_the_layout_answers_the_planners_distance_questions():
    lay = ParallelLayout(16, tp=4, cp=2, pp=2)
    assert (lay.stride("embd"), lay.group_size("embd")) == (8, 2)
    assert lay.crosses_node("embd", 8) and not lay.crosses_node("tp_cp", 8) and not lay.crosses_node("cp", 8)
    assert (lay.stride("cp"), lay.stride("dp_cp"), lay.stride("pp")) == (4, 4, 8)
    assert lay.crosses_node("cp", 4) and not lay.crosses_node("tp", 4)
    folded = ParallelLayout(8, tp=2, ep=4, etp=1)
    assert folded.stride("ep") == 1 and folded.stride("edp") == 4 and folded.group_size("ep") == 4
    assert [lay.rank_in("embd", r) for r in (0, 5, 8, 15)] == [0, 0, 1, 1]
    four = ParallelLayout(16, tp=4, pp=4)  # stages 4 ranks apart: only the hops 1 -> 2 and 3 -> 0 leave a node of 8
    assert [four.stages_cross_node(r, (r + 1) % 4, 8) for r in range(4)] == [False, True, False, True]
    assert ParallelLayout(4, tp=2, sequence_parallel=True).sequence_split
    assert not ParallelLayout(2, sequence_parallel=True).sequence_split
    assert ParallelLayout(8, tp=2, cp=2).sequence_multiple == 8 and ParallelLayout(8, tp=2, ep=2, etp=1).etp == 1


def test_zb_v_sends_count_its_two_chunks():
    """ZB-V runs two chunks per rank: the sends per iteration are its action lists', as executed."""
    flags = TOY + ["--pipeline-model-parallel-size", "2", "--pipeline-schedule", "zb-v"]
    c, t = configs(flags, 2)
    layout = parallel_layout(c, t, 2)
    assert layout.v_shape and layout.chunks == 2
    one = p2p_message_bytes(c, t.micro_batch_size, 1)
    sent = [iteration_p2p_sent(c, t, layout, r) // one for r in range(2)]
    # the V is rank 0 chunk 0 -> rank 1 chunk 0 -> rank 1 chunk 1 -> rank 0 chunk 1: per micro-batch rank 0
    # sends chunk 0's output and chunk 1's input gradient, rank 1 chunk 1's output and chunk 0's input gradient
    # (1F1B's one chunk would send one message a micro-batch per rank)
    assert sent == [2 * 16, 2 * 16]


def test_enumerated_layouts_are_parallel_layouts():
    space = Space(num_gpus=16, gpus_per_node=8, num_layers=4, num_heads=4, num_query_groups=4,
                  global_batch_size=16, full=False)
    cands = enumerate_layouts(space)
    assert cands and all(isinstance(x.layout, ParallelLayout) for x in cands)
    assert {(x.layout.tp, x.layout.pp) for x in cands} >= {(1, 1), (4, 2), (2, 4)}
    assert all(x.layout.world == 16 and x.layout.pp <= 4 for x in cands)


def test_the_meta_model_cache_keeps_the_most_recent_stages_only(monkeypatch):
    """planner/memory's cache of meta models is bounded: past its limit the least recently asked stage goes."""
    from megatron.training.planner import memory
    monkeypatch.setattr(memory, "_BUILT_LIMIT", 2)
    monkeypatch.setattr(memory, "_built", collections.OrderedDict())
    c, t = configs(TOY + ["--pipeline-model-parallel-size", "2"], 2)
    first = memory.stage_chunks(c, t, 2, 0)
    memory.stage_chunks(c, t, 2, 1)
    assert memory.stage_chunks(c, t, 2, 0) is first  # a hit, now the most recent
    memory.stage_chunks(c, t, 4, 0)  # a third stage: stage 1 of world 2 goes
    assert len(memory._built) == 2 and memory.stage_chunks(c, t, 2, 0) is first
    assert memory.stage_chunks(c, t, 2, 1) is not None and len(memory._built) == 2


def test_moe_activations_split_each_expert_over_the_layouts_expert_tp():
    """Folded at TP4 x ETP2 each expert's hidden activations are split 2 ways, not TP's 4 (nor 1)."""
    from megatron.core.config import TransformerConfig
    from megatron.training.planner.moe_activations import _ffn_bytes, moe_mlp_bytes

    def cfg(etp):
        return TransformerConfig(num_layers=2, hidden_size=16, num_attention_heads=4, num_experts=4,
                                 moe_ffn_hidden_size=32, moe_router_topk=2, tensor_model_parallel_size=4,
                                 expert_tensor_parallel_size=etp)
    tokens, pairs = 64, 2 * 64
    gap = moe_mlp_bytes(cfg(2), tokens, tp=4) - moe_mlp_bytes(cfg(None), tokens, tp=4)
    assert gap == pytest.approx(pairs * (_ffn_bytes(32 / 2, False, 2) - _ffn_bytes(32 / 4, False, 2)), rel=1e-12)
