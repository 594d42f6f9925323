"""Megatron-LM flags accepted here although they change nothing: each names an optimisation or a setting
whose absence changes no result (or that this project has always). The start-up log lists those a run
gives on one line, with the reason:

    > accepted, no effect here: --use-nccl-ub (NCCL user-buffer registration is not built), ...

Everything else a recipe gives has an effect (or is refused: unbuilt_flags.py).
"""
import dataclasses

from ...core.config_fields import flag_of
from ...core.transformer.mla_config import MLAConfig
from ...core.transformer.model_options import RECOMPUTE_NEEDS
from . import modifier_flags
from .auto_parallel_flags import no_effect_rules as auto_parallel_rules
from .fault_tolerance_flags import no_effect_rules as fault_tolerance_rules


def _rules(m, t, device):
    """(config, field name, applies, why) for every accepted-without-effect flag."""
    cpu = device is not None and device.type != "cuda"
    return [
        (t, "use_mcore_models", t.use_mcore_models, "the models here are Megatron-Core models already"),
        (t, "auto_detect_ckpt_format", t.auto_detect_ckpt_format, "a --load checkpoint's format is always detected"),
        (m, "use_flash_attn", m.use_flash_attn, "--attention-backend picks the kernel (the flag selects nothing in "
                                                "Megatron-LM either)"),
        (m, "moe_permute_fusion", m.moe_permute_fusion, "the token permutation is an exact gather, no fused kernel"),
        (m, "bias_dropout_fusion", not m.bias_dropout_fusion, "the row-parallel bias is inside its GEMM; no fused "
                                                              "bias-dropout-add kernel is built"),
        (m, "moe_per_layer_logging", m.moe_per_layer_logging, "router losses are logged summed over layers"),
        (t, "nccl_ub", t.nccl_ub, "NCCL user-buffer registration is not built"),
        (t, "fsdp_double_buffer", t.fsdp_double_buffer, "the sharded buffers here manage their own memory"),
        (t, "fsdp_manual_registration", t.fsdp_manual_registration, "NCCL user-buffer registration is not built"),
        (t, "enable_experimental", t.enable_experimental, "no experimental path is gated by it here"),
        (t, "num_workers", t.num_workers != 2, "batches are read in the training process, the same samples"),
        (t, "create_attention_mask_in_dataloader", not t.create_attention_mask_in_dataloader,
         "the causal mask is never materialised here"),
        (m, "init_model_with_meta_device", m.init_model_with_meta_device,
         "each rank initialises its shard from the layout-free seed directly"),
        (t, "accumulate_allreduce_grads_in_fp32", t.accumulate_allreduce_grads_in_fp32,
         "--grad-reduce-in-bf16 wins, as in Megatron-LM" if t.grad_reduce_in_bf16
         else "gradients accumulate and reduce in fp32 here already"),
        (m, "moe_router_pre_softmax", m.moe_router_pre_softmax and m.moe_router_score_function == "sigmoid",
         "sigmoid scores have no softmax to move, as in Megatron-LM"),
        (m, "add_position_embedding", not m.add_position_embedding, "rope has no learned position table"),
        (m, "rope_type", m.rope_type == "rope" and not m.multi_latent_attention,
         "standard RoPE is what --position-embedding-type rope runs"),
        (m, "export_force_local_attention", m.export_force_local_attention, "a ModelOpt export switch"),
        (m, "disable_bf16_reduced_precision_matmul", m.disable_bf16_reduced_precision_matmul and (not t.bf16 or cpu),
         "no CUDA bf16 GEMM runs" if t.bf16 else "without --bf16 there is no bf16 GEMM"),
        (t, "null_vocab_size", t.null_vocab_size is not None and t.tokenizer_type == "HuggingFaceTokenizer",
         "the HuggingFaceTokenizer's vocabulary is the model's, as in Megatron-LM"),
        (t, "empty_unused_memory_level", t.empty_unused_memory_level > 0 and cpu, "no CUDA caching allocator on CPU"),
        (m, "fp8_param_gather", m.fp8_param_gather and m.fp8_format is None,
         "without --fp8-format no weight is FP8 (the FP8 linears' weights are what it gathers)"),
        (m, "fp8_output_layer", m.fp8_output_layer and m.fp8_format is None,
         "without --fp8-format no GEMM runs in FP8"),
        (m, "mtp_loss_scaling_factor", not m.mtp_num_layers and m.mtp_loss_scaling_factor != 0.1,
         "without --mtp-num-layers there is no MTP loss"),
        (t, "cpu_offloading", t.cpu_offloading and not t.cpu_offloading_num_layers,
         "--cpu-offloading-num-layers is 0: no layer is offloaded, as in Megatron-LM"),
        (t, "cpu_offloading_weights", t.cpu_offloading_weights and not t.cpu_offloading,
         "without --cpu-offloading nothing is offloaded"),
        (t, "cpu_offloading_activations", not t.cpu_offloading_activations and not t.cpu_offloading,
         "without --cpu-offloading nothing is offloaded"),
        # the other modifier flags given without their feature: generated from `requires=` (modifier_flags.py)
    ] + _latent_attention_only(m) + _values_without_effect(m, t) + fault_tolerance_rules(t) + auto_parallel_rules(t)


def _values_without_effect(m, t):
    """Values that leave their feature nothing to do: a recomputed module the model does not have, a profile
    window after the last iteration, FP8 layers all kept in the model's precision."""
    rules = [(m, "recompute_modules", getattr(m, needs) in (None, False), f"{module}: {why}")
             for module, (needs, why) in RECOMPUTE_NEEDS.items() if module in (m.recompute_modules or ())]
    first = t.profile_step_start + (0 if t.use_pytorch_profiler else 1)  # nsys's range opens an iteration later
    if t.profile and t.train_iters is not None and first > t.train_iters:
        rules.append((t, "profile", True, f"its window starts at iteration {first}, after the last one "
                                          f"(--train-iters {t.train_iters}); lower --profile-step-start"))
    kept = m.num_layers_at_start_in_bf16 + m.num_layers_at_end_in_bf16
    if m.fp8_format and m.first_last_layers_bf16 and kept >= m.num_layers and not m.fp8_output_layer:
        rules.append((m, "fp8_format", True, f"--num-layers-at-start-in-bf16 {m.num_layers_at_start_in_bf16} + "
                                             f"--num-layers-at-end-in-bf16 {m.num_layers_at_end_in_bf16} keep all "
                                             f"{m.num_layers} layers out of FP8"))
    return rules


def _latent_attention_only(m):
    """Multi-latent attention's sizes and YaRN settings given without --multi-latent-attention (as Megatron-LM,
    which reads them only there; --qk-layernorm has an effect in either attention)."""
    if m.multi_latent_attention:
        return []
    return [(m, f.name, getattr(m, f.name) != f.default, "it shapes multi-latent attention, which is off")
            for f in dataclasses.fields(MLAConfig) if f.name not in ("multi_latent_attention", "qk_layernorm")]


def accepted(model_cfg, train_cfg, device=None, *extra):
    """[(flag, why)] of the given flags that change nothing here. device: the run's (None: any); extra: the
    model's own option configs (e.g. BERT's), whose modifier flags are checked too."""
    found = [(cfg, name, why) for cfg, name, applies, why in _rules(model_cfg, train_cfg, device) if applies]
    named = {name for _, name, _ in found}
    found += [r for r in modifier_flags.without_feature(model_cfg, train_cfg, *extra) if r[1] not in named]
    return [(flag_of(type(cfg), name), why) for cfg, name, why in found]


def line(model_cfg, train_cfg, device=None, *extra):
    """The start-up line, or None when no such flag is given."""
    found = accepted(model_cfg, train_cfg, device, *extra)
    if not found:
        return None
    return "> accepted, no effect here: " + ", ".join(f"{flag} ({why})" for flag, why in found)
