"""The FLOPs profiler's counter (flops_counter.ModuleFlops) over a real forward + backward: its total is flops.py's
model FLOPs for GPT, Llama-style, MoE and MLA models at one process, and each rank's share at TP2 (issue 47); every
module's backward is twice its forward (the backward attribution by autograd node)."""
import pytest
import torch

from megatron.core.config import TransformerConfig
from megatron.training.observability import flops
from tests.harness import spawn

BATCH = 2
MODELS = {
    "gpt": {},
    "llama": dict(position_embedding_type="rope", normalization="RMSNorm", swiglu=True, group_query_attention=True,
                  num_query_groups=2, add_bias_linear=False, untie_embeddings_and_output_weights=True),
    "moe": dict(num_experts=4, moe_router_topk=2, moe_ffn_hidden_size=32, add_bias_linear=False),
    # q head 24 > v head 12: the attention core pads v with zeros, which the counter leaves out
    "mla": dict(multi_latent_attention=True, position_embedding_type="rope", q_lora_rank=24, kv_lora_rank=16,
                qk_head_dim=16, qk_pos_emb_head_dim=8, v_head_dim=12),
}


def _config(kind, tp):
    # sequence parallel at TP2: MLA's down-projections then run on each rank's share of the tokens, not all of them
    cfg = TransformerConfig(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=32, vocab_size=500,
                            make_vocab_size_divisible_by=128, hidden_dropout=0.0, attention_dropout=0.0,
                            tensor_model_parallel_size=tp, sequence_parallel=tp > 1, **MODELS[kind])
    cfg.validate()
    return cfg


def _measure(groups, configs):
    from megatron.core.models.gpt import GPTModel
    from megatron.core.tensor_parallel.initialization import initialize_parameters
    from megatron.training.observability.flops_counter import ModuleFlops
    out = {}
    for kind, cfg in configs.items():
        model = GPTModel(cfg, groups)
        initialize_parameters(model, 1, groups.tp_rank, groups.tp_size)
        ids = torch.randint(0, cfg.vocab_size, (BATCH, cfg.seq_length), generator=torch.Generator().manual_seed(0))
        with ModuleFlops(model, "cpu") as measured:
            model(ids, ids).sum().backward()
        out[kind] = (measured.total_flops, measured.flops)
    return out


def _router(cfg):
    """The router's FLOPs of the batch (2 h E per token and MoE layer, x3 for the backward)."""
    return 3 * BATCH * cfg.seq_length * cfg.num_layers * 2 * cfg.hidden_size * cfg.num_experts


@pytest.mark.parametrize("tp", [1, 2])
def test_total_is_the_model_flops_and_each_rank_its_share(tp):
    configs = {kind: _config(kind, tp) for kind in MODELS}
    for rank, measured in enumerate(spawn(tp, _measure, configs, tp=tp, timeout=240)):
        for kind, (total, per_module) in measured.items():
            cfg = configs[kind]
            model = flops.num_floating_point_operations(cfg, BATCH)
            # the MoE router runs whole on every TP rank (work repeated, which model FLOPs count once)
            repeated = _router(cfg) * (tp - 1) if kind == "moe" else 0
            assert total["recompute"] == 0
            assert (total["forward"] + total["backward"]) * tp == model + repeated, (kind, rank, total)
            assert per_module["model"]["forward"] == total["forward"], kind  # every counted op in the model
            for path, counts in per_module.items():
                assert counts["backward"] == 2 * counts["forward"], (kind, path, counts)
            if kind == "moe":
                experts = [p for p in per_module if ".local_experts." in p]
                assert len(experts) == 8 and all(per_module[p]["forward"] > 0 for p in experts)
