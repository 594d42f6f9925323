"""Training, data and logging options (the model's live in megatron/core/config.py).

resolve(dp) fills the derived values once; validate(dp) only checks (see megatron/training/resolve.py).
"""
from dataclasses import dataclass
from typing import Optional

import torch

from ..core.config import ConfigError, flag_of, opt
from ..core.datasets import DatasetError, parse_blend, parse_split
from ..core.ranges import AT_LEAST_ONE, FRACTION, NON_NEGATIVE, POSITIVE, check_ranges
from .tokenizer import TOKENIZER_TYPES

# numeric flags outside these ranges fail in validate(); NaN and inf fail everywhere (ranges.py)
NUMBER_RULES = {
    "lr": NON_NEGATIVE, "min_lr": NON_NEGATIVE, "weight_decay": NON_NEGATIVE, "clip_grad": NON_NEGATIVE,
    "adam_beta1": FRACTION, "adam_beta2": FRACTION, "adam_eps": POSITIVE,
    "seed": ("[]", 0, 2 ** 31 - 1),  # numpy seeds (and seed + 1) must fit 32 bits
    "lr_warmup_iters": NON_NEGATIVE, "lr_decay_iters": AT_LEAST_ONE, "lr_wsd_decay_iters": AT_LEAST_ONE,
    "loss_scale": POSITIVE, "initial_loss_scale": POSITIVE, "min_loss_scale": POSITIVE,
    "eval_iters": NON_NEGATIVE,
}


@dataclass
class TrainingConfig:
    micro_batch_size: int = opt(8, "Samples per microbatch per data-parallel rank.")
    global_batch_size: Optional[int] = opt(
        None, "Samples per iteration over all data-parallel ranks (default micro batch x DP); "
        "gradients are accumulated over global / (micro x DP) microbatches.")
    train_iters: Optional[int] = opt(None, "Number of training iterations (this or --train-samples is required).")
    train_samples: Optional[int] = opt(
        None, "Train on this many samples instead: --train-iters becomes train-samples // global batch size, "
        "and the learning-rate flags count samples (--lr-decay-samples, --lr-warmup-samples, ...).")
    lr: Optional[float] = opt(None, "Peak learning rate (required, as in Megatron-LM).")
    min_lr: float = opt(0.0, "Learning rate at the end of decay.")
    lr_decay_style: str = opt("linear", "Learning-rate decay after warm-up.",
                              choices=["constant", "linear", "cosine", "inverse-square-root", "WSD"])
    lr_decay_iters: Optional[int] = opt(None, "Iterations over which to decay (default --train-iters).")
    lr_decay_samples: Optional[int] = opt(None, "Samples over which to decay (default --train-samples).")
    lr_warmup_iters: int = opt(0, "Linear warm-up iterations (iteration 1 runs at --lr-warmup-init).")
    lr_warmup_samples: int = opt(0, "Linear warm-up samples, with --train-samples.")
    lr_warmup_fraction: Optional[float] = opt(
        None, "Warm-up as a fraction of the decay (instead of --lr-warmup-iters / --lr-warmup-samples).")
    lr_warmup_init: float = opt(0.0, "Learning rate at the start of warm-up.")
    lr_wsd_decay_style: str = opt("exponential", "Shape of the final decay with --lr-decay-style WSD.",
                                  choices=["linear", "cosine", "exponential", "minus_sqrt"])
    lr_wsd_decay_iters: Optional[int] = opt(
        None, "Length of the final decay with WSD (default 10%% of the decay; Megatron-LM requires it).")
    lr_wsd_decay_samples: Optional[int] = opt(None, "Length of the final WSD decay in samples, with --train-samples.")
    weight_decay: float = opt(0.01, "AdamW weight decay (not applied to biases and norms).")
    clip_grad: float = opt(1.0, "Clip gradients to this global L2 norm (0 disables).")
    adam_beta1: float = opt(0.9, "Adam beta1.")
    adam_beta2: float = opt(0.999, "Adam beta2.")
    adam_eps: float = opt(1e-8, "Adam epsilon.")
    seed: int = opt(1234, "Random seed (initialisation, data order, dropout).")
    log_interval: int = opt(100, "Print and record metrics every this many iterations.")
    eval_interval: Optional[int] = opt(
        None, "Evaluate on the validation set every this many iterations (default: only at the end).")
    eval_iters: int = opt(100, "Validation batches per evaluation (0 disables evaluation).")
    skip_train: bool = opt(False, "Run no training iteration: evaluate the validation and test sets once, "
                           "at the loaded checkpoint's iteration, and exit.")
    tensorboard_dir: Optional[str] = opt(None, "Write TensorBoard logs here.")
    exit_interval: Optional[int] = opt(None, "Stop after an iteration that is a multiple of this.")
    exit_duration_in_mins: Optional[float] = opt(
        None, "Save (with --save) and stop after the first iteration that ends this many minutes after start-up.")
    pipeline_trace: Optional[str] = opt(
        None, "Write the start and end time of every schedule action of iteration 2 on each pipeline rank "
        "to this JSON file (draw it with tools/pipeline_timeline.py --trace; one machine's clock).")
    mock_data: bool = opt(
        False, "Train on deterministic synthetic tokens (with --tokenizer-type NullTokenizer --vocab-size N).")
    data_path: Optional[list[str]] = opt(
        None, "Indexed dataset prefix(es) from tools/preprocess_data.py, split by --split: 'PREFIX', "
        "or a blend 'W1 PREFIX1 W2 PREFIX2 ...' (without any data flag: the embedded standard-library "
        "recipe, megatron/training/embedded.py).", nargs="+")
    train_data_path: Optional[list[str]] = opt(None, "Training data (prefix or weighted blend), used whole; "
                                               "instead of --data-path and --split.", nargs="+")
    valid_data_path: Optional[list[str]] = opt(
        None, "Validation data (prefix or weighted blend), used whole.", nargs="+")
    test_data_path: Optional[list[str]] = opt(None, "Test data (prefix or weighted blend), used whole.", nargs="+")
    split: str = opt("969,30,1", "Train,valid,test shares of the documents of each --data-path dataset.")
    eod_mask_loss: bool = opt(False, "GPT: no loss on predictions made from an end-of-document token.")
    reset_position_ids: bool = opt(False, "GPT: positions restart at 0 after each end-of-document token in a sample.")
    reset_attention_mask: bool = opt(False, "GPT: no attention across end-of-document tokens within a sample.")
    blend_order: str = opt("megatron", "Order of a blend's samples: Megatron-LM's greedy rule, or Tijdeman's "
                           "(every prefix within one sample of the weights; docs/data.md).",
                           choices=["megatron", "tijdeman"])
    data_cache_path: Optional[str] = opt(None, "Where built dataset indices (and the embedded corpus) are cached "
                                         "(default $XDG_CACHE_HOME/megatron-3d or ~/.cache/megatron-3d).")
    tokenizer_type: Optional[str] = opt(
        None, "Tokenizer (default: NullTokenizer with --mock-data; required with --data-path).",
        choices=TOKENIZER_TYPES)
    vocab_file: Optional[str] = opt(
        None, "GPT2BPETokenizer vocab.json, or BertWordPiece* vocab.txt (one token per line).")
    merge_file: Optional[str] = opt(None, "GPT2BPETokenizer merges.txt.")
    tokenizer_model: Optional[str] = opt(None, "SentencePiece .model, or a Hugging Face tokenizer.json or folder.")
    # Megatron-LM's --vocab-size; the model's vocabulary is TransformerConfig.vocab_size (the tokenizer's)
    null_vocab_size: Optional[int] = opt(None, "NullTokenizer: ids 0..N-1, end-of-document N. TikTokenizer: the "
                                         "vocabulary size (default 2**17).", flag="--vocab-size")
    tiktoken_pattern: Optional[str] = opt(None, "TikTokenizer split pattern (default v2).", choices=["v1", "v2"])
    tiktoken_num_special_tokens: int = opt(1000, "TikTokenizer: ids reserved for special tokens.")
    special_tokens: Optional[list[str]] = opt(None, "TikTokenizer special tokens (must include <unk> <s> </s> "
                                              "<mask> <pad> <cls> <sep>).", flag="--tokenizer-special-tokens",
                                              nargs="+")
    distributed_backend: Optional[str] = opt(None, "Collective backend (default nccl with CUDA, else gloo).",
                                             choices=["nccl", "gloo"])
    inference_max_seq_length: int = opt(
        2560, "Longest sequence (prompt + generated tokens) generation expects; tools/generate.py's default "
        "length bound.")
    bf16: bool = opt(False, "bf16 parameters and activations, fp32 main parameters and gradients.")
    fp16: bool = opt(False, "fp16 parameters and activations with loss scaling, fp32 main parameters and gradients.")
    loss_scale: Optional[float] = opt(None, "Constant fp16 loss scale (default: dynamic).")
    initial_loss_scale: float = opt(2.0 ** 32, "Initial dynamic fp16 loss scale.")
    min_loss_scale: float = opt(1.0, "Smallest dynamic loss scale.")
    loss_scale_window: int = opt(1000, "Clean iterations before the dynamic loss scale doubles.")
    hysteresis: int = opt(2, "Overflows tolerated before the dynamic loss scale halves.")
    grad_reduce_in_bf16: bool = opt(False, "With --bf16, keep and reduce gradients in bf16.")
    ddp_bucket_size: Optional[int] = opt(None, "Elements per gradient bucket (default max(40M, 1M x DP)).")
    overlap_grad_reduce: bool = opt(False, "Reduce each gradient bucket asynchronously as soon as it is complete.")
    use_distributed_optimizer: bool = opt(False, "Shard fp32 main parameters and Adam states over data-parallel ranks.")
    overlap_param_gather: bool = opt(
        False, "With the distributed optimizer, gather parameters during the next forward.")
    save: Optional[str] = opt(None, "Directory to save checkpoints to.")
    load: Optional[str] = opt(None, "Directory to load a checkpoint from (any parallel layout).")
    save_interval: Optional[int] = opt(None, "Save a checkpoint every this many iterations (and at the end).")
    no_load_optim: bool = opt(False, "Do not load the optimizer state (Adam moments, loss scale).")
    no_load_rng: bool = opt(False, "Do not load the RNG states.")
    finetune: bool = opt(False, "Load only the model weights; start at iteration 0 with fresh optimizer and data.")
    pretrained_checkpoint: Optional[str] = opt(
        None, "When --load holds no checkpoint, start from this one's weights: iteration 0, fresh optimizer and data.")
    use_checkpoint_args: bool = opt(False, "Take the model's architecture flags from the --load checkpoint.")
    ckpt_format: str = opt("torch_dist", "Checkpoint format: torch_dist is ours (layout-free, sharded); "
                           "Megatron-LM's other formats are refused.",
                           choices=["torch", "torch_dist", "zarr", "torch_dcp", "fsdp_dtensor"])
    auto_detect_ckpt_format: bool = opt(False, "Accepted: a --load checkpoint's format is always detected "
                                        "(ours is loaded, Megatron-LM's are refused).")
    exit_signal_handler: bool = opt(False, "On SIGTERM, save a checkpoint after the current iteration and exit.")
    check_for_nan_in_loss_and_grad: bool = opt(
        True, "Do not stop the run when a loss or the gradient norm is NaN or infinite (by default such an "
        "iteration stops the run, exit code 17, before any checkpoint of it is written).",
        flag="--no-check-for-nan-in-loss-and-grad")
    distributed_timeout_minutes: int = opt(
        10, "Timeout minutes for torch.distributed; a rank waiting longer in a collective or pipeline "
        "send/receive exits naming the operation and the ranks it waits for.")
    log_metrics_jsonl: Optional[str] = opt(
        None, "This project's (not in Megatron-LM): write one JSON line per iteration (full-precision loss per "
        "term, grad norm, learning rate, skipped) and per validation to this file (from the rank with the last "
        "pipeline stage, TP and DP rank 0).")
    use_mcore_models: bool = opt(False, "Accepted for Megatron-LM recipes and ignored: the models here are "
                                 "Megatron-Core models already.")

    @property
    def params_dtype(self) -> torch.dtype:
        return torch.bfloat16 if self.bf16 else torch.float16 if self.fp16 else torch.float32

    def check_sizes(self) -> None:
        """ConfigError unless the counts something divides by or loops over are positive."""
        f = lambda n: flag_of(TrainingConfig, n)  # noqa: E731
        for name in ("micro_batch_size", "global_batch_size", "train_iters", "train_samples", "log_interval",
                     "eval_interval", "distributed_timeout_minutes", "inference_max_seq_length"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ConfigError(f"{f(name)} must be at least 1, got {getattr(self, name)}")

    def resolve_tokenizer_type(self) -> None:
        """--mock-data without --tokenizer-type means NullTokenizer (the only default there is)."""
        if self.tokenizer_type is None and self.mock_data:
            self.tokenizer_type = "NullTokenizer"

    def resolve(self, dp_size: int) -> None:
        """Fill the global batch size (default micro batch x DP) and, with --train-samples, the
        iterations (train-samples // global batch, as Megatron-LM), once. Checks the schedule flags first."""
        self.check_schedule()
        if self.global_batch_size is None:
            self.global_batch_size = self.micro_batch_size * dp_size
        if self.train_samples is not None and self.train_iters is None:
            self.train_iters = self.train_samples // self.global_batch_size
            if self.train_iters < 1:
                raise ConfigError(f"--train-samples ({self.train_samples}) is less than one global batch "
                                  f"({self.global_batch_size} samples)")

    def check_schedule(self) -> None:
        """The learning-rate and length flags fit together (Megatron-LM's rules): --lr is given; training
        counts iterations or samples, and the schedule flags count the same."""
        if self.lr is None:
            raise ConfigError("--lr is required (the peak learning rate; Megatron-LM has no default either), "
                              "e.g. --lr 3e-4")
        if self.train_samples is not None:
            resolved = self.global_batch_size and self.train_iters == self.train_samples // self.global_batch_size
            if self.train_iters is not None and not resolved:
                raise ConfigError("give --train-iters or --train-samples, not both")
            given = [f for f, v in (("--lr-decay-iters", self.lr_decay_iters), ("--lr-warmup-iters",
                     self.lr_warmup_iters or None), ("--lr-wsd-decay-iters", self.lr_wsd_decay_iters)) if v is not None]
            unit, warmup = "samples", self.lr_warmup_samples
        elif self.train_iters is not None:
            given = [f for f, v in (("--lr-decay-samples", self.lr_decay_samples), ("--lr-warmup-samples",
                     self.lr_warmup_samples or None), ("--lr-wsd-decay-samples", self.lr_wsd_decay_samples))
                     if v is not None]
            unit, warmup = "iters", self.lr_warmup_iters
        else:
            raise ConfigError("give the training length: --train-iters N or --train-samples N")
        if given:
            other = "iterations (--train-iters)" if unit == "iters" else "samples (--train-samples)"
            raise ConfigError(f"{', '.join(given)} do not fit training measured in {other}; use the "
                              f"--lr-*-{unit} flags")
        if self.lr_warmup_fraction is not None and warmup:
            raise ConfigError(f"give --lr-warmup-fraction or --lr-warmup-{unit}, not both")

    def validate(self, dp_size: int) -> None:
        """Check the resolved configuration for a data-parallel size; assigns nothing."""
        f = lambda n: flag_of(TrainingConfig, n)  # noqa: E731
        self.check_sizes()
        check_ranges(self, NUMBER_RULES, f)
        self._validate_schedule(f)
        if self.global_batch_size is None:
            raise ConfigError(f"{f('global_batch_size')} is not set: resolve the configuration first")
        if self.global_batch_size % (self.micro_batch_size * dp_size):
            raise ConfigError(
                f"{f('global_batch_size')} ({self.global_batch_size}) is not divisible by "
                f"{f('micro_batch_size')} ({self.micro_batch_size}) x data-parallel size ({dp_size}) = "
                f"{self.micro_batch_size * dp_size}; use a multiple of it")
        self.check_schedule()
        if self.lr < 0 or self.min_lr < 0 or self.min_lr > self.lr:
            raise ConfigError(f"need 0 <= {f('min_lr')} ({self.min_lr}) <= {f('lr')} ({self.lr})")
        if self.clip_grad < 0 or self.weight_decay < 0 or self.eval_iters < 0:
            raise ConfigError(f"{f('clip_grad')}, {f('weight_decay')} and {f('eval_iters')} must be non-negative")
        if self.lr_warmup_fraction is not None and not 0 <= self.lr_warmup_fraction <= 1:
            raise ConfigError(f"{f('lr_warmup_fraction')} must be in [0, 1], got {self.lr_warmup_fraction}")
        if self.exit_interval is not None and self.exit_interval < 1:
            raise ConfigError(f"{f('exit_interval')} must be at least 1")
        self._validate_schedule_values()
        if self.bf16 and self.fp16:
            raise ConfigError("--bf16 and --fp16 are exclusive; pick one")
        if self.grad_reduce_in_bf16 and not self.bf16:
            raise ConfigError("--grad-reduce-in-bf16 needs --bf16")
        if self.overlap_param_gather and not self.use_distributed_optimizer:
            raise ConfigError("--overlap-param-gather needs --use-distributed-optimizer")
        if self.hysteresis < 1 or self.loss_scale_window < 1 or (self.loss_scale is not None and self.loss_scale <= 0):
            raise ConfigError("--hysteresis and --loss-scale-window must be at least 1, --loss-scale positive")
        if self.save_interval is not None and self.save_interval < 1:
            raise ConfigError("--save-interval must be at least 1")
        if self.save_interval and not self.save:
            raise ConfigError("--save-interval needs --save DIR")
        if self.distributed_timeout_minutes < 1:
            raise ConfigError(f"{f('distributed_timeout_minutes')} must be at least 1, "
                              f"got {self.distributed_timeout_minutes}")
        if self.ddp_bucket_size is not None and self.ddp_bucket_size < 1:
            raise ConfigError("--ddp-bucket-size must be at least 1")
        self._validate_data()

    def _validate_schedule(self, f):
        """The warm-up and decay lengths fit inside each other; the loss-scale floor below its start."""
        decay = self.lr_decay_iters or self.train_iters
        if self.lr_wsd_decay_iters is not None and self.lr_wsd_decay_iters > decay:
            raise ConfigError(f"{f('lr_wsd_decay_iters')} ({self.lr_wsd_decay_iters}) is longer than the decay "
                              f"({f('lr_decay_iters')} or {f('train_iters')}: {decay}); shorten it")
        if self.fp16 and self.loss_scale is None and self.min_loss_scale > self.initial_loss_scale:
            raise ConfigError(f"{f('min_loss_scale')} ({self.min_loss_scale}) is above {f('initial_loss_scale')} "
                              f"({self.initial_loss_scale}); lower it")
    def _validate_schedule_values(self):
        """Signs and ranges of the learning-rate schedule's own numbers."""
        for name in ("lr_decay_iters", "lr_decay_samples", "lr_wsd_decay_iters", "lr_wsd_decay_samples"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ConfigError(f"{flag_of(TrainingConfig, name)} must be at least 1, got {getattr(self, name)}")
        for name in ("lr_warmup_iters", "lr_warmup_samples"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{flag_of(TrainingConfig, name)} must be non-negative, got {getattr(self, name)}")
        if not 0 <= self.lr_warmup_init <= self.lr:
            raise ConfigError(f"need 0 <= --lr-warmup-init ({self.lr_warmup_init}) <= --lr ({self.lr})")
        if self.exit_duration_in_mins is not None and self.exit_duration_in_mins <= 0:
            raise ConfigError(f"--exit-duration-in-mins must be positive, got {self.exit_duration_in_mins}")

    @property
    def per_split_paths(self):
        return [self.train_data_path, self.valid_data_path, self.test_data_path]

    def _validate_data(self):
        per_split = any(self.per_split_paths)
        if self.mock_data and (self.data_path or per_split):
            raise ConfigError("--mock-data and --data-path (or --train-data-path ...) exclude each other")
        if self.data_path and per_split:
            raise ConfigError("give either --data-path (split by --split) or --train-data-path / "
                              "--valid-data-path / --test-data-path, not both")
        if per_split and not self.train_data_path:
            raise ConfigError("--valid-data-path / --test-data-path need --train-data-path as well")
        if per_split and self.eval_iters > 0 and not self.valid_data_path:
            raise ConfigError(f"--eval-iters {self.eval_iters} needs validation data: give --valid-data-path, "
                              "or set --eval-iters 0")
        try:
            parse_split(self.split)
            for flag, paths in (("--data-path", self.data_path), ("--train-data-path", self.train_data_path),
                                ("--valid-data-path", self.valid_data_path), ("--test-data-path", self.test_data_path)):
                parse_blend(paths, flag)
        except DatasetError as e:
            raise ConfigError(str(e)) from None
        self.validate_tokenizer()

    def validate_tokenizer(self) -> None:
        """The tokenizer flags fit together (checked before the tokenizer is built)."""
        if not (self.mock_data or self.data_path or any(self.per_split_paths)):
            raise ConfigError("no training data: give --data-path (or --train-data-path ...) or --mock-data")
        tok = self.tokenizer_type
        if tok is None:
            raise ConfigError("--data-path needs --tokenizer-type (and its files): the tokenizer that "
                              "tools/preprocess_data.py used")
        if tok == "NullTokenizer" and (self.null_vocab_size is None or self.null_vocab_size < 1):
            raise ConfigError("--tokenizer-type NullTokenizer needs --vocab-size N (N >= 1)")
        if tok not in ("NullTokenizer", "TikTokenizer") and self.null_vocab_size is not None:
            raise ConfigError(f"--vocab-size goes with --tokenizer-type NullTokenizer, not {tok} "
                              "(whose files define the vocabulary)")


@dataclass
class BertOptions:
    """pretrain_bert.py's own flags (Megatron-LM names where it has them)."""
    bert_binary_head: bool = opt(True, "Train the masked LM alone, without the binary head on the first token "
                                 "(samples are then single segments).", flag="--bert-no-binary-head")
    binary_head_task: str = opt("sop", "What the binary head predicts: sop (sentence order: were the two segments "
                                "swapped?, ALBERT / Megatron-LM) or nsp (next sentence: is the second segment from "
                                "another document?, original BERT).", choices=["sop", "nsp"])
    mask_prob: float = opt(0.15, "Fraction of each sample's tokens chosen for the masked-LM loss (80%% replaced "
                           "by [MASK], 10%% by a random token, 10%% kept).")
    short_seq_prob: float = opt(0.1, "Probability that a sample is built to a random length shorter than "
                                "--seq-length (so the model also sees short inputs).")

    def validate(self):
        if not 0.0 < self.mask_prob < 1.0:
            raise ConfigError(f"--mask-prob must be in (0, 1), got {self.mask_prob}")
        if not 0.0 <= self.short_seq_prob <= 1.0:
            raise ConfigError(f"--short-seq-prob must be in [0, 1], got {self.short_seq_prob}")

    @property
    def loss_terms(self):
        """{logged loss name: batch key of its mask (None: one per sample)}."""
        terms = {"lm loss": "loss_mask"}
        if self.bert_binary_head:
            terms[f"{self.binary_head_task} loss"] = None
        return terms
