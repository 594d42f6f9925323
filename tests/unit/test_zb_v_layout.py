"""ZB-V's model layout (--pipeline-schedule zb-v): which layers each chunk holds, where the embedding
and the loss are, the flag's checks, and the tied table's two copies on rank 0."""
from types import SimpleNamespace

import pytest
import torch

from megatron.core.config import ConfigError, TransformerConfig
from megatron.core.distributed.finalize import allreduce_tied_embedding_grads
from megatron.core.parallel_layout import ParallelLayout
from megatron.core.pipeline_parallel.schedule_flag import check_v_layout, schedule_for_flag
from megatron.core.pipeline_parallel.split import chunk_roles, stage_layers, v_layer_split
from megatron.core.tensor_parallel.param_meta import counted_once, set_tied_embedding


def _cfg(num_layers=8, pp=4, **kw):
    return TransformerConfig(num_layers=num_layers, hidden_size=8, num_attention_heads=2,
                             pipeline_model_parallel_size=pp, **kw)


@pytest.mark.parametrize("P,L", [(2, 4), (2, 8), (4, 8), (3, 12)])
def test_v_split_holds_every_layer_once_in_a_v(P, L):
    split = v_layer_split(L, P)
    n = L // (2 * P)
    for p in range(P):  # chunk 0 is stage p going down, chunk 1 stage 2P - 1 - p coming back
        assert split[p] == [(p * n, n), ((2 * P - 1 - p) * n, n)]
    layers = sorted(i for chunks in split for o, k in chunks for i in range(o, o + k))
    assert layers == list(range(L))


def test_the_zb_v_layout_has_two_chunks_and_the_roles_put_embedding_and_loss_on_rank_0():
    cfg = _cfg()
    check_v_layout(cfg, "zb-v")
    assert cfg.virtual_pipeline_model_parallel_size is None  # the flag writes no model config
    layout = ParallelLayout(4, pp=4, schedule=schedule_for_flag("zb-v", 4, 1))
    assert layout.v_shape and layout.chunks == 2
    assert stage_layers(cfg, layout, 3, 0) == (3, 1) and stage_layers(cfg, layout, 3, 1) == (4, 1)
    assert [chunk_roles(layout, p, v) for p in (0, 3) for v in (0, 1)] == \
        [(True, False), (False, True), (False, False), (False, False)]
    with pytest.raises(ConfigError, match="needs --pipeline-model-parallel-size 2"):
        schedule_for_flag("zb-v", 1, 1)  # one stage: no bubble to fill, the flag is refused
    one = ParallelLayout(1, schedule="zb_v")  # a layout given the schedule anyway has no V at one stage
    assert not one.v_shape and one.chunks == 1
    plain = ParallelLayout(4, pp=4, vpp=2, schedule="interleaved_1f1b")
    assert chunk_roles(plain, 3, 1) == (False, True) and chunk_roles(plain, 0, 1) == (False, False)


@pytest.mark.parametrize("kw,message", [
    (dict(num_layers=12), "zb-v needs --num-layers \\(12\\) divisible by 2 x --pipeline-model-parallel-size \\(8\\)"),
    (dict(virtual_pipeline_model_parallel_size=2), "zb-v places its own two model chunks per rank"),
    (dict(decoder_first_pipeline_num_layers=1, num_layers=9), "zb-v splits the layers evenly"),
])
def test_the_v_layout_check_names_the_flag_and_the_fix(kw, message):
    with pytest.raises(ConfigError, match=message):
        check_v_layout(_cfg(**kw), "zb-v")


def test_both_tied_copies_on_rank_0_are_summed_there_and_only_the_input_copy_counts():
    emb, out = torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(3))
    set_tied_embedding(emb)
    set_tied_embedding(out, output_copy=True)
    groups = SimpleNamespace(pp_size=4, pp_rank=0, tp_rank=0, embd=None)  # embd unused: no communication
    assert counted_once(emb, groups) and not counted_once(out, groups)
    emb.grad, out.grad = torch.tensor([1.0, 2.0, 3.0]), torch.tensor([10.0, 20.0, 30.0])
    allreduce_tied_embedding_grads(torch.nn.ParameterList([emb, out]), groups, lambda p: p.grad)
    assert emb.grad.tolist() == out.grad.tolist() == [11.0, 22.0, 33.0]
