"""Training, data and logging options (the model's live in megatron/core/config.py).

resolve(dp) fills the derived values once; validate(dp) only checks (see megatron/training/config/resolve.py).
"""
from dataclasses import dataclass

import torch

from ...core.config import ConfigError, opt
from ...core.distributed.ddp_config import DistributedDataParallelConfig
from ...core.distributed.strategy import SHARDING_STRATEGIES, resolve_strategy
from ..loop import batch_schedule
from ..tokenizer import TOKENIZER_TYPES
from . import training_checks as config_checks
from .auto_parallel_flags import AutoParallelOptions
from .bert_flags import BertOptions as BertOptions
from .compile_flags import CompileOptions
from .fault_tolerance_flags import FaultToleranceOptions, check_fault_tolerance
from .fsdp_flags import FSDPOptions, resolve_fsdp
from .logging_flags import LoggingOptions
from .offload_flags import OffloadOptions
from .optimizer_flags import OptimizerOptions, check_optimizer
from .precision_optimizer_flags import PrecisionOptimizerOptions, check_precision_optimizer
from .recipe_flags import RunOptions, check_run_options


# the flags by concern: *_flags.py
@dataclass
class TrainingConfig(LoggingOptions, RunOptions, FSDPOptions, OptimizerOptions, OffloadOptions, CompileOptions,
                     PrecisionOptimizerOptions, FaultToleranceOptions, AutoParallelOptions):
    micro_batch_size: int = opt(8, "Samples per microbatch per data-parallel rank.")
    global_batch_size: int | None = opt(
        None, "Samples per iteration over all data-parallel ranks (default micro batch x DP); "
        "gradients are accumulated over global / (micro x DP) microbatches.")
    train_iters: int | None = opt(None, "Number of training iterations (this or --train-samples is required).")
    train_samples: int | None = opt(
        None, "Train on this many samples instead: --train-iters becomes train-samples // global batch size, "
        "and the learning-rate flags count samples (--lr-decay-samples, --lr-warmup-samples, ...).")
    lr: float | None = opt(None, "Peak learning rate (required, as in Megatron-LM).")
    min_lr: float = opt(0.0, "Learning rate at the end of decay.")
    lr_decay_style: str = opt("linear", "Learning-rate decay after warm-up.",
                              choices=["constant", "linear", "cosine", "inverse-square-root", "WSD"])
    lr_decay_iters: int | None = opt(None, "Iterations over which to decay (default --train-iters).")
    lr_decay_samples: int | None = opt(None, "Samples over which to decay (default --train-samples).")
    lr_warmup_iters: int = opt(0, "Linear warm-up iterations (iteration 1 runs at --lr-warmup-init).")
    lr_warmup_samples: int = opt(0, "Linear warm-up samples, with --train-samples.")
    lr_warmup_fraction: float | None = opt(
        None, "Warm-up as a fraction of the decay (instead of --lr-warmup-iters / --lr-warmup-samples).")
    lr_warmup_init: float = opt(0.0, "Learning rate at the start of warm-up.",
                                requires=["lr_warmup_iters", "lr_warmup_samples", "lr_warmup_fraction"])
    lr_wsd_decay_style: str = opt("exponential", "Shape of the final decay with --lr-decay-style WSD.",
                                  choices=["linear", "cosine", "exponential", "minus_sqrt"],
                                  requires=("lr_decay_style", "WSD"))
    lr_wsd_decay_iters: int | None = opt(
        None, "Length of the final decay with WSD (default 10%% of the decay; Megatron-LM requires it).",
        requires=("lr_decay_style", "WSD"))
    lr_wsd_decay_samples: int | None = opt(None, "Length of the final WSD decay in samples, with --train-samples.",
                                           requires=("lr_decay_style", "WSD"))
    weight_decay: float = opt(0.01, "Weight decay, decoupled for AdamW and Muon, L2 for SGD (not applied to biases "
                              "and norms).")
    clip_grad: float = opt(1.0, "Clip gradients to this global L2 norm (0 disables).")
    adam_beta1: float = opt(0.9, "Adam beta1.", requires=("optimizer", ("adam", "muon")))
    adam_beta2: float = opt(0.999, "Adam beta2.", requires=("optimizer", ("adam", "muon")))
    adam_eps: float = opt(1e-8, "Adam epsilon.", requires=("optimizer", ("adam", "muon")))
    seed: int = opt(1234, "Random seed (initialisation, data order, dropout).")
    log_interval: int = opt(100, "Print and record metrics every this many iterations.")
    eval_interval: int | None = opt(
        None, "Evaluate on the validation set every this many iterations (default: only at the end).")
    eval_iters: int = opt(100, "Validation batches per evaluation (0 disables evaluation).")
    skip_train: bool = opt(False, "Run no training iteration: evaluate the validation and test sets once, "
                           "at the loaded checkpoint's iteration, and exit.")
    tensorboard_dir: str | None = opt(None, "Write TensorBoard logs here.")
    exit_interval: int | None = opt(None, "Stop after an iteration that is a multiple of this.")
    exit_duration_in_mins: float | None = opt(
        None, "Save (with --save) and stop after the first iteration that ends this many minutes after start-up.")
    pipeline_trace: str | None = opt(
        None, "Write the start and end time of every schedule action of iteration 2 on each pipeline rank "
        "to this JSON file (draw it with tools/pipeline_timeline.py --trace; one machine's clock).")
    pipeline_schedule: str | None = opt(
        None, "Pipeline schedule (default: 1f1b, or interleaved with model chunks): zb-h1 / zb-h2 are the "
        "zero-bubble schedules, whose backward computes weight gradients in separate W steps; zb-v also "
        "places two model chunks per rank in a V (num layers divisible by 2 x pipeline size).",
        choices=["1f1b", "interleaved", "zb-h1", "zb-h2", "zb-v"])
    mock_data: bool = opt(
        False, "Train on deterministic synthetic tokens (with --tokenizer-type NullTokenizer --vocab-size N).")
    mock_document_length: int | None = opt(
        None, "Ours: --mock-data samples pack documents of this mean length (seeded, exponential), each ended "
        "by end-of-document, instead of one document and end-of-document padding (docs/packing.md).")
    data_path: list[str] | None = opt(
        None, "Indexed dataset prefix(es) from tools/preprocess_data.py, split by --split: 'PREFIX', "
        "or a blend 'W1 PREFIX1 W2 PREFIX2 ...' (without any data flag: the embedded standard-library "
        "recipe, megatron/training/data/embedded.py).", nargs="+")
    train_data_path: list[str] | None = opt(None, "Training data (prefix or weighted blend), used whole; "
                                               "instead of --data-path and --split.", nargs="+")
    valid_data_path: list[str] | None = opt(
        None, "Validation data (prefix or weighted blend), used whole.", nargs="+")
    test_data_path: list[str] | None = opt(None, "Test data (prefix or weighted blend), used whole.", nargs="+")
    split: str = opt("969,30,1", "Train,valid,test shares of the documents of each --data-path dataset.")
    eod_mask_loss: bool = opt(False, "GPT: no loss on predictions made from an end-of-document token.")
    reset_position_ids: bool = opt(False, "GPT: positions restart at 0 after each end-of-document token in a sample.")
    reset_attention_mask: bool = opt(False, "GPT: no attention across end-of-document tokens within a sample "
                                     "(the batches carry document boundaries, never an [s, s] mask: docs/packing.md).")
    dataloader_inter_document_masking: bool = opt(
        False, "Megatron-Core's name for --reset-attention-mask: attention restricted to each document of a "
        "sample, from its end-of-document tokens (docs/packing.md).")
    blend_order: str = opt("megatron", "Order of a blend's samples: Megatron-LM's greedy rule, or Tijdeman's "
                           "(every prefix within one sample of the weights; docs/data.md).",
                           choices=["megatron", "tijdeman"])
    data_cache_path: str | None = opt(None, "Where built dataset indices (and the embedded corpus) are cached "
                                         "(default $XDG_CACHE_HOME/megatron-3d or ~/.cache/megatron-3d).")
    tokenizer_type: str | None = opt(
        None, "Tokenizer (default: NullTokenizer with --mock-data; required with --data-path).",
        choices=TOKENIZER_TYPES)
    vocab_file: str | None = opt(
        None, "GPT2BPETokenizer vocab.json, or BertWordPiece* vocab.txt (one token per line).")
    merge_file: str | None = opt(None, "GPT2BPETokenizer merges.txt.")
    tokenizer_model: str | None = opt(None, "SentencePiece .model, or a Hugging Face tokenizer.json or folder.")
    # Megatron-LM's --vocab-size; the model's vocabulary is TransformerConfig.vocab_size (the tokenizer's)
    null_vocab_size: int | None = opt(None, "NullTokenizer: ids 0..N-1, end-of-document N. TikTokenizer: the "
                                         "vocabulary size (default 2**17).", flag="--vocab-size")
    tiktoken_pattern: str | None = opt(None, "TikTokenizer split pattern (default v2).", choices=["v1", "v2"],
                                       requires=("tokenizer_type", "TikTokenizer"))
    tiktoken_num_special_tokens: int = opt(1000, "TikTokenizer: ids reserved for special tokens.",
                                           requires=("tokenizer_type", "TikTokenizer"))
    special_tokens: list[str] | None = opt(None, "TikTokenizer special tokens (must include <unk> <s> </s> "
                                              "<mask> <pad> <cls> <sep>).", flag="--tokenizer-special-tokens",
                                              nargs="+", requires=("tokenizer_type", "TikTokenizer"))
    distributed_backend: str | None = opt(None, "Collective backend (default nccl with CUDA, else gloo).",
                                             choices=["nccl", "gloo"])
    inference_max_seq_length: int = opt(
        2560, "Longest sequence (prompt + generated tokens) generation expects; tools/generate.py's default "
        "length bound.")
    bf16: bool = opt(False, "bf16 parameters and activations, fp32 main parameters and gradients.")
    fp16: bool = opt(False, "fp16 parameters and activations with loss scaling, fp32 main parameters and gradients.")
    loss_scale: float | None = opt(None, "Constant fp16 loss scale (default: dynamic).", requires="fp16")
    initial_loss_scale: float = opt(2.0 ** 32, "Initial dynamic fp16 loss scale.", requires="fp16")
    min_loss_scale: float = opt(1.0, "Smallest dynamic loss scale.", requires="fp16")
    loss_scale_window: int = opt(1000, "Clean iterations before the dynamic loss scale doubles.", requires="fp16")
    hysteresis: int = opt(2, "Overflows tolerated before the dynamic loss scale halves.", requires="fp16")
    grad_reduce_in_bf16: bool = opt(False, "With --bf16, keep and reduce gradients in bf16.")
    ddp_bucket_size: int | None = opt(None, "Elements per gradient bucket (default max(40M, 1M x DP)).")
    overlap_grad_reduce: bool = opt(False, "Reduce each gradient bucket asynchronously as soon as it is complete.")
    use_distributed_optimizer: bool = opt(False, "Shard fp32 main parameters and Adam states over data-parallel ranks.")
    overlap_param_gather: bool = opt(
        False, "With the distributed optimizer, gather parameters during the next forward.")
    data_parallel_sharding_strategy: str | None = opt(
        None, "What each data-parallel rank keeps only its shard of: no_shard (nothing), optim (optimizer state: "
        "ZeRO-1, as --use-distributed-optimizer), optim_grads (+ gradients: ZeRO-2), optim_grads_params "
        "(+ parameters, gathered per layer for its forward and backward: ZeRO-3). Default: optim with "
        "--use-distributed-optimizer, else no_shard.", choices=list(SHARDING_STRATEGIES))
    optimizer_cpu_offload: bool = opt(False, "Keep the optimizer state (fp32 main values, Adam moments) and run "
                                      "its update on the host, with explicit copies of gradients and new values.")
    optimizer_offload_fraction: float = opt(1.0, "With --optimizer-cpu-offload, the share (0 to 1) of each rank's "
                                            "optimizer state on the host.")
    save: str | None = opt(None, "Directory to save checkpoints to.")
    load: str | None = opt(None, "Directory to load a checkpoint from (any parallel layout).")
    save_interval: int | None = opt(None, "Save a checkpoint every this many iterations (and at the end).")
    no_load_optim: bool = opt(False, "Do not load the optimizer state (Adam moments, momentum buffers, loss scale).",
                              requires=["load", "pretrained_checkpoint"])
    no_load_rng: bool = opt(False, "Do not load the RNG states.", requires=["load", "pretrained_checkpoint"])
    finetune: bool = opt(False, "Load only the model weights; start at iteration 0 with fresh optimizer and data.",
                         requires=["load", "pretrained_checkpoint"])
    pretrained_checkpoint: str | None = opt(
        None, "When --load holds no checkpoint, start from this one's weights: iteration 0, fresh optimizer and data.")
    use_checkpoint_args: bool = opt(False, "Take the model's architecture flags from the --load checkpoint.")
    ckpt_format: str = opt("torch_dist", "Checkpoint format: torch_dist is ours (layout-free, sharded); "
                           "Megatron-LM's other formats are refused.",
                           choices=["torch", "torch_dist", "zarr", "torch_dcp", "fsdp_dtensor"])
    auto_detect_ckpt_format: bool = opt(False, "Accepted: a --load checkpoint's format is always detected "
                                        "(ours is loaded, Megatron-LM's are refused).")
    exit_signal_handler: bool = opt(False, "On SIGTERM, save a checkpoint after the current iteration and exit.")
    async_save: bool = opt(False, "Write checkpoints in a background thread: the step waits only for the copy of the "
                           "state to host memory; a save waits for the previous one, the run for the last.",
                           requires="save")
    ckpt_fully_parallel_save: bool = opt(
        False, "Without the distributed optimizer, the DP replicas each write 1/DP of the state (default: DP rank 0 "
        "writes it all; the distributed optimizer's saves are always spread).", requires="save")
    ckpt_fully_parallel_load: bool = opt(
        False, "The DP replicas each read 1/DP of the state they share and all-gather it over the DP group "
        "(default: each reads its whole shard).", requires=["load", "pretrained_checkpoint"])
    check_for_nan_in_loss_and_grad: bool = opt(
        True, "Do not stop the run when a loss or the gradient norm is NaN or infinite (by default such an "
        "iteration stops the run, exit code 17, before any checkpoint of it is written).",
        flag="--no-check-for-nan-in-loss-and-grad")
    distributed_timeout_minutes: int = opt(
        10, "Timeout minutes for torch.distributed; a rank waiting longer in a collective or pipeline "
        "send/receive exits naming the operation and the ranks it waits for.")
    log_metrics_jsonl: str | None = opt(
        None, "This project's (not in Megatron-LM): write one JSON line per iteration (full-precision loss per "
        "term, grad norm, learning rate, skipped) and per validation to this file (from the rank with the last "
        "pipeline stage, TP and DP rank 0).")
    use_mcore_models: bool = opt(False, "Accepted for Megatron-LM recipes and ignored: the models here are "
                                 "Megatron-Core models already.")

    @property
    def params_dtype(self) -> torch.dtype:
        return torch.bfloat16 if self.bf16 else torch.float16 if self.fp16 else torch.float32

    def document_masking(self) -> bool:
        """Whether attention stops at document boundaries (either flag)."""
        return self.reset_attention_mask or self.dataloader_inter_document_masking

    def check_sizes(self) -> None:
        """ConfigError unless the counts something divides by or loops over are positive."""
        config_checks.check_sizes(self)

    def resolve_tokenizer_type(self) -> None:
        """--mock-data without --tokenizer-type means NullTokenizer; --vocab-file with --merge-file means
        GPT2BPETokenizer, the one tokenizer that takes both (Megatron-LM's GPT-3 recipe gives no type)."""
        if self.tokenizer_type is None and self.mock_data:
            self.tokenizer_type = "NullTokenizer"
        elif self.tokenizer_type is None and self.vocab_file and self.merge_file:
            self.tokenizer_type = "GPT2BPETokenizer"

    def resolve(self, dp_size: int, seq_length: int | None = None) -> None:
        """Fill the global batch size (default micro batch x DP; a step schedule's last size) and, with
        --train-samples, the iterations (train-samples // global batch, or counted along the batch-size
        schedule, as Megatron-LM), once; map the Megatron-FSDP flags (fsdp_flags.py). Checks the
        schedule flags first. seq_length: the model's (a step schedule's thresholds count tokens)."""
        self.check_schedule()
        resolve_fsdp(self)
        self.resolve_optimizer()
        self.resolve_offload()
        self.resolve_sharding()
        self.resolve_main_grads()
        derive = self.train_samples is not None and self.train_iters is None
        batch_schedule.resolve(self, seq_length or 1, dp_size)
        self.train_iters_derived = self.train_iters_derived or derive

    def resolve_sharding(self) -> None:
        """--data-parallel-sharding-strategy from --use-distributed-optimizer (its alias for optim) when
        unset, once; from then on the strategy is the one value (ddp_config())."""
        if self.use_distributed_optimizer and self.data_parallel_sharding_strategy == "no_shard":
            raise ConfigError("--use-distributed-optimizer shards the optimizer state but "
                              "--data-parallel-sharding-strategy is no_shard; drop one of the two flags")
        self.data_parallel_sharding_strategy = resolve_strategy(self.data_parallel_sharding_strategy,
                                                                self.use_distributed_optimizer)
        # kept in step for the flag's Megatron-LM meaning (recipes, saved arguments); the code reads ddp_config()
        self.use_distributed_optimizer = self.data_parallel_sharding_strategy != "no_shard"

    def ddp_config(self, fp8_param_gather=False) -> DistributedDataParallelConfig:
        """How DDP holds and reduces gradients: the sharding strategy (resolve_strategy) and the DDP flags;
        fp8_param_gather: the model's --fp8-param-gather (a model flag in Megatron-LM too)."""
        strategy = resolve_strategy(self.data_parallel_sharding_strategy, self.use_distributed_optimizer)
        return DistributedDataParallelConfig(strategy, self.ddp_bucket_size,
                                             self.overlap_grad_reduce, self.overlap_param_gather,
                                             self.grad_reduce_in_bf16, fp8_param_gather)

    def check_schedule(self) -> None:
        """The learning-rate and length flags fit together (Megatron-LM's rules)."""
        config_checks.check_schedule(self)

    def validate(self, dp_size: int) -> None:
        """Check the resolved configuration for a data-parallel size; assigns nothing (training_checks.py)."""
        config_checks.validate(self, dp_size)
        check_run_options(self)
        check_optimizer(self)
        check_precision_optimizer(self)
        check_fault_tolerance(self)

    @property
    def per_split_paths(self):
        return [self.train_data_path, self.valid_data_path, self.test_data_path]

    def validate_tokenizer(self) -> None:
        """The tokenizer flags fit together (checked before the tokenizer is built)."""
        config_checks.validate_tokenizer(self)
