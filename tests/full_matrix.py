"""Cases the default run (the README's test command, and CI) leaves to the full matrix; with
MEGATRON_TEST_FULL=1 they run too (tests/conftest.py skips them otherwise).

Each is one more layout of a feature whose parity the default run proves in other layouts, named beside
it, so every feature keeps a parity test in CI while CI on 2 cores stays well inside its time.
tests/unit/test_full_matrix.py checks that every id here still names a collected test.
"""
FP8 = "tests/functional/test_fp8_parity.py::test_fp8_layout_matches_one_process_fp8"
GPT = "tests/functional/test_parity.py::test_gpt_layout_matches_one_process"
QWEN3 = "tests/functional/test_parity.py::test_qwen3_layout_matches_one_process"
W_REST = ("tests/unit/test_weight_grad_rest.py::"
          "test_every_parameter_gets_its_gradient_in_w_equal_to_the_ordinary_backward")
MOE_BIAS = "tests/functional/test_moe_bias_parity.py::test_expert_biases_split_over_tp_match_one_process"
MLA = "tests/functional/test_mla_parity.py::test_deepseek_shaped_layout_matches_one_process"
BERT = "tests/functional/test_bert_parity.py::test_bert_layout_matches_one_process"
RESHARD = "tests/functional/test_checkpoint.py::test_checkpoint_loads_into_another_layout"
NORMS = "tests/functional/test_observability.py::test_params_norm_and_zeros_match_one_process"
FP8_GATHER = "tests/distributed/test_fp8_param_gather.py::test_fp8_param_gather_moves_bytes_and_changes_no_loss"
MUON = "tests/functional/test_muon_parity.py::test_muon_layout_matches_one_process"
OFFLOAD = "tests/functional/test_activation_offload.py::test_offloaded_layout_matches_one_process"
NVME = "tests/functional/test_optimizer_offload.py::test_state_in_files_matches_the_state_in_memory"
PACKING = "tests/functional/test_packing_parity.py::test_packed_documents_layout_matches_one_process"
COMPILED = "tests/functional/test_compiled_layers.py::test_compiled_layers_match_eager_one_process"
AUTO_RESUME = "tests/functional/test_auto_parallel.py::test_resume_at_another_world_size_picks_again_and_loads"

FULL_ONLY = {
    # --auto-parallel resumed at another world size: layout-free loading is proven by test_checkpoint.py's
    # resharding cases; the default run keeps the 4-rank choice's parity and its checkpoint's layout
    AUTO_RESUME,
    # FP8: the default run keeps tensorwise TP2+SP, delayed PP2 zb-h1 and CP2, blockwise TP2+SP,
    # MoE tensorwise TP2+SP, MoE delayed EP2, MoE tensorwise EP2 x TP2 + SP (both dispatchers), MoE tensorwise
    # EP2 x CP2, MoE delayed EP2 x CP4, MoE with a capacity factor tensorwise EP2 x TP2 + SP, delayed ZeRO-3
    # and ZeRO-1 with --fp8-param-gather, the output layer in FP8 tied at TP2+SP and untied at PP2 (each recipe,
    # each reduction group: TP, SP, CP, DP, expert-DP, the B/W split, the per-source casts, the FP8 gathers;
    # tests/distributed/test_fp8_param_gather.py runs the gathers at TP2 x DP2 for every strategy)
    *(f"{FP8}[{case}]" for case in (
        "tensorwise-pp2", "tensorwise-pp2-zb-h1", "tensorwise-distopt-dp2", "tensorwise-cp2",
        "delayed-tp2-sp", "delayed-pp2", "delayed-distopt-dp2", "delayed-zero3-dp2", "blockwise-distopt-dp2",
        "moe-tensorwise-cp2", "moe-tensorwise-distopt-dp2", "moe-delayed-tp2-sp", "moe-delayed-cp2",
        "moe-delayed-distopt-dp2", "moe-tensorwise-ep2-alltoall", "moe-delayed-ep2-tp2-sp", "moe-delayed-ep2-allgather",
        "moe-delayed-ep2-cp2", "moe-tensorwise-ep2-cp4", "moe-tensorwise-ep4-cp2", "moe-delayed-ep4-cp2",
        "moecap-delayed-ep2-allgather", "moecap-tensorwise-ep2-cp2",
        "tensorwise-zero3-dp2",
        "tensorwise-zero3-dp2-param-gather",
        "tensorwise-distopt-dp2-param-gather", "moe-delayed-ep2-alltoall-zero3-param-gather",
        "tensorwise-output-pp2", "delayed-output-untied-tp2-sp",
        # folded and EP x CP dividing neither way: the default run keeps MoE tensorwise TP2 + SP with expert TP 1
        # at EP2, MoE delayed expert TP 2 at EP2 (gathered rows of four micro-batches) and MoE tensorwise EP2 x CP3
        "moe-tensorwise-tp2-sp-etp1", "moe-delayed-tp2-sp-etp1", "moe-delayed-tp2-sp-etp1-ep2",
        "moe-tensorwise-tp2-sp-etp1-ep4-allgather", "moe-delayed-tp2-sp-etp1-ep4-allgather",
        "moe-tensorwise-tp2-etp1-ep4", "moe-delayed-tp2-etp1-ep4", "moe-tensorwise-etp2-ep2",
        "moe-tensorwise-tp2-sp-etp4-ep2", "moe-delayed-tp2-sp-etp4-ep2", "moe48-delayed-ep2-cp3",
        "moecap-tensorwise-tp2-sp-etp1-ep4-allgather",
        # padded to capacity per micro-batch: the default run keeps delayed EP2 and tensorwise EP2 x TP2 + SP
        "moepad-tensorwise-ep2-alltoall", "moepad-tensorwise-tp2-sp-etp1-ep2", "moepad-tensorwise-ep2-cp2",
        "moepad-delayed-ep2-allgather-tp2-sp", "moepad-delayed-tp2-sp-etp1-ep2", "moepad-delayed-ep2-cp2",
        # blockwise MoE: the default run keeps EP2 (and blockwise CP2, dense)
        "moe-blockwise-tp2-sp", "moe-blockwise-tp2-sp-etp1-ep2", "moe-blockwise-etp2-ep2")),
    # dense GPT: the default run keeps tp2, tp2-sp, pp2-vpp2, tp2-pp2-dp2-sp, dp2-overlap, distopt-dp2,
    # distopt-pp2-dp2 and its overlapped variant (wider groups of the same code: tp4, dp4, pp4; pp2 and dp2 are
    # inside pp2-vpp2 / distopt-pp2-dp2 and dp2-overlap, tp2-pp2 inside tp2-pp2-dp2-sp)
    *(f"{GPT}[{case}]" for case in ("tp4", "dp4", "dp4-overlap", "pp4", "tp2-dp2", "distopt-tp2-dp2-overlap",
                                    "pp2", "dp2", "tp2-pp2")),
    # Qwen3's per-head q/k norms: the default run keeps tp2, where only their own rule sums their grads over TP
    # (with SP every replicated weight's is summed; PP2 splits layers, not heads)
    *(f"{QWEN3}[{case}]" for case in ("tp2-sp", "pp2")),
    # their weights under the zero-bubble split: the default run keeps the middle stage (B through the norms)
    *(f"{W_REST}[gpt-qk-norm-{stage}-{how}]" for stage in ("first", "last") for how in ("autograd", "fused")),
    # MLA + MoE + MTP: the default run keeps tp2-sp-recompute-up, cp2, dp2-zero3-recompute, pp2-zb-h1,
    # ep2-tp2-folded (TP2 + SP too) and the chunked pipelines (tp2 and tp2-sp are tp2-sp-recompute-up without
    # recompute, pp2 is pp2-zb-h1's 1F1B)
    *(f"{MLA}[{case}]" for case in ("tp2", "tp2-sp", "pp2")),
    # BERT: the default run keeps tp2-pp2-dp2, the post-norm TP+SP+VPP layout, dp2 with NSP, the headless TP2xPP2
    *(f"{BERT}[{case}]" for case in ("tp2", "pp2")),
    # a checkpoint of TP2 x PP2 x DP2 loaded at one process and at DP4 with the distributed optimizer (default),
    # at TP4 and PP4 (full): every load reshards from the same global offsets
    *(f"{RESHARD}[{case}]" for case in ("tp4", "pp4")),
    # params norm and zeros: the default run keeps ZeRO-1 TP2xPP2xDP2, ZeRO-3 TP2xDP2 + SP, EP2
    f"{NORMS}[pp2xdp2-zero2]",
    # --fp8-param-gather at TP2 x DP2: the default run keeps ZeRO-1 tensorwise, ZeRO-2 and ZeRO-3 delayed
    f"{FP8_GATHER}[optim_grads_params-tensorwise]",
    # Muon: the default run keeps TP2 + SP in both exact TP modes, ZeRO-1 TP2 x PP2 x DP2, ZeRO-3 DP2, MoE EP2
    # with the distributed optimizer and TP2 x EP2 folded (each a code path of its own); these are wider or
    # other groups of the same code
    *(f"{MUON}[{case}]" for case in ("tp4", "tp2-distributed-nesterov", "pp2", "pp2-vpp2", "pp2-zb-h1",
                                     "distopt-dp2", "zero2-dp2-overlap", "cp2", "moe-ep2", "moe-tp2-ep2-sp")),
    # a Muon checkpoint: the default run keeps the bitwise resume and TP2 x PP2 x DP2 -> one process; the reverse
    # loads the momentum into the distributed optimizer's slices by the code Adam's moments take (RESHARD)
    "tests/functional/test_muon_checkpoint.py::test_muon_checkpoint_of_one_process_resumes_at_tp2_pp2_dp2",
    # expert biases over TP: the default run keeps tp2xep2 alltoall, both folded layouts and the checkpoint
    *(f"{MOE_BIAS}[{case}]" for case in ("tp2xep2-allgather-sp", "tp1xdp2-etp2")),
    # restarts under torchrun (issue 41): the default run keeps a kill at an iteration's start (TP2 x DP2) and one
    # during an --async-save's write with no checkpoint yet (PP2 x DP2 ZeRO-3); these kill rank 0 or 1 during sync
    # saves, an async save of TP2 x DP2 and at iteration 5 of ZeRO-3: the same restart and load paths
    *(f"tests/functional/test_restart.py::test_a_killed_rank_restarts_the_group_which_resumes_bitwise[{case}]"
      for case in ("tp2-dp2-rank0-sync-save4", "tp2-dp2-rank1-async-save4", "zero3-rank0-iteration5",
                   "zero3-rank0-sync-commit4")),
    # a failed save goes on: the default run keeps sync (one process) and --async-save (rank 1 only); this fails
    # rank 0's commit under --ckpt-fully-parallel-save: the same SaveFailures path after another storage step
    "tests/functional/test_save_failures.py::test_a_failed_save_is_one_line_and_training_goes_on[fully-parallel-save]",
    # activation offload: the default run keeps one process (units around layers) and PP2 1F1B with full recompute
    # (units around checkpointed chunks, micro-batches in flight); the other layouts run the same hooks
    *(f"{OFFLOAD}[{case}]" for case in ("one-selective", "tp2-sp", "tp2-sp-selective", "pp2-1f1b", "pp2-interleaved",
                                        "cp2", "ep2-moe", "ep2-moe-selective", "one-fp8")),
    # optimizer state in files: the default run keeps the distributed optimizer at DP2, all and half of the state in
    # files; under ZeRO-3 the same rule writes the parameter shard instead of the whole parameter's slice
    f"{NVME}[zero3-dp2]",
    # peak RSS of a whole run is noisy on a loaded 2-core machine (28 of the 32 MB needed, once): the buffer's
    # high-water mark and the parity cases stay in the default run
    "tests/functional/test_optimizer_offload.py::test_host_memory_is_the_buffer_not_the_state",
    # the FLOPs profiler's counter at one process: the default run keeps TP2, the same counter on the same four
    # models (each rank's share, so its total too)
    "tests/distributed/test_flops_profiler.py::test_total_is_the_model_flops_and_each_rank_its_share[1]",
    # packed documents: the default run keeps TP2 + SP x PP2 (segment ids on every stage, the full sequence
    # gathered back for attention), the distributed optimizer at DP2 (micro-batches sliced over DP) and CP2
    # through each of p2p, all_gather and a2a (tests/distributed/test_cp_documents.py runs the CP4 ring)
    # windows and sinks: the default run keeps TP2 + SP and the CP2 ring with a window shorter than a chunk
    # (tests/distributed/test_cp_documents.py runs all_gather and a2a with both window lengths)
    *(f"{PACKING}[{case}]" for case in ("tp2-sp", "pp2", "pp2-vpp2", "cp4-p2p", "window-cp2-all_gather",
                                        "window-cp2-a2a", "window24-cp2-p2p", "tp2-cp2-pp2", "moe-ep2")),
    # --compile-layers (inductor compiles for tens of seconds on 2 cores): the default run keeps TP2 + SP, the
    # compiled layers with the collectives' graph breaks and the validation graph; one process, PP2 with full
    # recompute and MoE (attention compiled, dispatch eager) run the same compile code
    *(f"{COMPILED}[{case}]" for case in ("one-process", "pp2-recompute", "moe-ep2")),
}
