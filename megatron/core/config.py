"""Configuration dataclasses. The CLI is generated from these fields (megatron/training/config/arguments.py).

Each field's metadata holds its help text and, where Megatron-LM's flag name is not the
field name with dashes, the flag (e.g. add_bias_linear <- --disable-bias-linear).
Derived values are filled once by resolve() (defaults that follow from sibling fields already in
__post_init__); validate() only checks and raises ConfigError naming the flags and the fix.
"""
import dataclasses
from dataclasses import dataclass

import torch

from . import config_checks
from .config_fields import flag_of as flag_of  # re-exported (as ConfigError): importers name this module
from .config_fields import opt
from .errors import ConfigError as ConfigError
from .fp8.config import Fp8Config, check_fp8
from .transformer.mla_config import MLAConfig
from .transformer.model_options import ModelOptions, check_options, resolve_options
from .transformer.moe.moe_config import MoEConfig
from .transformer.mtp_config import MTPConfig
from .transformer.window_config import WindowConfig, check_window


@dataclass
class ModelParallelConfig:
    tensor_model_parallel_size: int = opt(1, "Degree of tensor model parallelism.")
    pipeline_model_parallel_size: int = opt(1, "Degree of pipeline model parallelism.")
    virtual_pipeline_model_parallel_size: int | None = opt(
        None, "Model chunks per pipeline rank, for the interleaved 1F1B schedule (or give "
        "--num-layers-per-virtual-pipeline-stage).", flag="--num-virtual-stages-per-pipeline-rank")
    num_layers_per_virtual_pipeline_stage: int | None = opt(
        None, "Layers per model chunk: each pipeline rank holds num_layers / (P x this) chunks and "
        "runs the interleaved 1F1B schedule.")
    sequence_parallel: bool = opt(False, "Split activations outside TP regions along the sequence over the TP group.")
    context_parallel_size: int = opt(1, "Degree of context parallelism: each sequence split over this many ranks "
                                     "(rank order TP, CP, DP, PP).")
    cp_comm_type: str = opt("p2p", "Attention across context-parallel ranks: p2p (ring attention), all_gather "
                            "(gather K/V) or a2a (Ulysses all-to-all over heads).",
                            choices=["p2p", "all_gather", "a2a"])
    gradient_accumulation_fusion: bool = opt(
        True, "Give each linear layer's weight gradient its own tensor, added to the fp32 main gradient in a "
        "pass of its own, instead of accumulating it there inside the weight-gradient GEMM (csrc cuBLAS kernel "
        "on CUDA where built, torch elsewhere).", flag="--no-gradient-accumulation-fusion")
    params_dtype: torch.dtype = dataclasses.field(default=torch.float32, metadata={"cli": False})


@dataclass
class TransformerConfig(ModelParallelConfig, MoEConfig, MLAConfig, MTPConfig, ModelOptions, Fp8Config, WindowConfig):
    num_layers: int = opt(4, "Number of transformer layers.")
    decoder_first_pipeline_num_layers: int | None = opt(
        None, "Layers on the first pipeline stage (uneven split; the other stages share the rest evenly).")
    decoder_last_pipeline_num_layers: int | None = opt(
        None, "Layers on the last pipeline stage (uneven split; the other stages share the rest evenly).")
    hidden_size: int = opt(256, "Transformer hidden size.")
    num_attention_heads: int = opt(4, "Number of attention heads.")
    ffn_hidden_size: int | None = opt(
        None, "MLP hidden size (default 4 x hidden, or about 8/3 x hidden with --swiglu).")
    kv_channels: int | None = opt(None, "Per-head size (default hidden / heads).")
    group_query_attention: bool = opt(False, "Use grouped-query attention (with --num-query-groups).")
    num_query_groups: int | None = opt(None, "Key/value head groups for grouped-query attention.")
    seq_length: int = opt(256, "Sequence length of a training sample.")
    max_position_embeddings: int | None = opt(None, "Largest position the model supports (default --seq-length).")
    position_embedding_type: str = opt("learned_absolute", "Position embedding.", choices=["learned_absolute", "rope"])
    rotary_base: int = opt(10000, "Base of the rotary embedding frequencies.")
    rotary_percent: float = opt(1.0, "Fraction of each head's dimensions that rotary embeddings rotate (the first "
                                "int(kv-channels x this); the rest pass through), as Megatron-LM.")
    normalization: str = opt("LayerNorm", "Normalization layer.", choices=["LayerNorm", "RMSNorm"])
    norm_epsilon: float = opt(1e-5, "Epsilon of the normalization layers.")
    post_norm: bool = opt(False, "Post-norm layers, x = norm(x + sublayer(x)), as the original Transformer and "
                          "BERT (and Hugging Face's BertModel): no final norm; BERT also normalises its embeddings. "
                          "Default pre-norm.")
    swiglu: bool = opt(False, "Use SwiGLU instead of GeLU in the MLP.")
    openai_gelu: bool = opt(False, "Use the tanh approximation of GeLU (GPT-2's gelu_new).")
    add_bias_linear: bool = opt(True, "Disable biases in the linear layers.", flag="--disable-bias-linear")
    add_qkv_bias: bool = opt(False, "Biases in the QKV projection only (Qwen2), also with --disable-bias-linear.")
    untie_embeddings_and_output_weights: bool = opt(False, "Give the output layer its own weight.")
    hidden_dropout: float = opt(0.1, "Dropout on the residual branches and embeddings.")
    attention_dropout: float = opt(0.1, "Dropout on the attention probabilities.")
    init_method_std: float = opt(0.02, "Std of the normal initialisation.")
    make_vocab_size_divisible_by: int = opt(128, "Pad the vocabulary to a multiple of this x TP.")
    # fused kernels (megatron/core/fusions): each flag forces the plain-torch path of one op
    attention_backend: str = opt(
        "auto", "Core attention: auto (flash-attn, else Transformer Engine, else torch SDPA, whichever is "
        "installed and fits), flash, te (Transformer Engine), fused (Transformer Engine's fused attention; without "
        "it, torch SDPA with its cuDNN backend first), sdpa, or local or unfused (explicit scores and the "
        "masked-softmax kernel).",
        choices=["auto", "flash", "fused", "te", "sdpa", "local", "unfused"])
    attention_softmax_in_fp32: bool = opt(
        False, "With bf16 / fp16, compute the unfused attention's torch softmax in fp32 (the fused softmax "
        "kernels, SDPA and flash-attn accumulate in fp32 already).")
    transformer_impl: str = opt(
        "local", "Layer implementation: local (this project's layers) or transformer_engine (attention through "
        "Transformer Engine; needs it installed and CUDA).", choices=["local", "transformer_engine"])
    masked_softmax_fusion: bool = opt(True, "Use torch's softmax instead of a fused masked-softmax kernel "
                                      "(unfused attention).", flag="--no-masked-softmax-fusion")
    bias_gelu_fusion: bool = opt(True, "Use torch for bias + GeLU instead of a fused kernel.",
                                 flag="--no-bias-gelu-fusion")
    bias_swiglu_fusion: bool = opt(True, "Use torch for bias + SwiGLU instead of a fused kernel.",
                                   flag="--no-bias-swiglu-fusion")
    norm_fusion: bool = opt(True, "Use torch for LayerNorm / RMSNorm instead of a fused kernel (ours or apex).",
                            flag="--no-norm-fusion")
    apply_rope_fusion: bool = opt(True, "Use torch for the rotary embedding instead of a fused kernel.",
                                  flag="--no-rope-fusion")
    bias_dropout_fusion: bool = opt(
        True, "Megatron-LM's fused bias-dropout-add; here the row-parallel bias is added inside its GEMM and the "
        "dropout-add is torch's either way: --no-bias-dropout-fusion is accepted, no effect.",
        flag="--no-bias-dropout-fusion")
    residual_norm_fusion: bool = opt(
        False, "This project's (not in Megatron-LM): in a pre-norm layer, add the attention's output to the residual "
        "and apply the MLP's norm in one torch.compile'd kernel (CUDA with triton; elsewhere the add, then the norm): "
        "one pass over the activations less forward, two backward. Off by default until a GPU measures it.")
    cross_entropy_loss_fusion: bool = opt(
        False, "Fuse the vocabulary-parallel cross entropy: read the logits once per pass in chunks of tokens, "
        "no fp32 copy of [tokens, vocab], the gradient written over the logits (Megatron-LM's flag; off by "
        "default, as there).")
    fused_kernels: str = opt(
        "auto", "This project's (not in Megatron-LM): where no --no-*-fusion flag is given, auto runs our csrc "
        "kernel for an op only where a GPU measurement on file shows it faster than eager torch and "
        "torch.compile on this GPU model (megatron/core/fusions/kernel_table.json, or the table "
        "$MEGATRON_KERNEL_TABLE names), torch otherwise; csrc runs our kernels wherever they can run. The "
        "start-up log says which each op runs and why.", choices=["auto", "csrc"])
    # activation recompute (Korthikanti et al. 2022)
    recompute_granularity: str | None = opt(
        None, "Recompute activations in the backward pass instead of keeping them: full (whole layers, only "
        "their inputs are kept) or selective (the attention core only: its s x s scores).",
        choices=["full", "selective"])
    recompute_method: str | None = opt(
        None, "With full recompute: uniform (checkpoint chunks of --recompute-num-layers layers; default) or "
        "block (checkpoint the first --recompute-num-layers layers of each pipeline stage, the rest not).",
        choices=["uniform", "block"])
    recompute_num_layers: int | None = opt(
        None, "Layers per recomputed chunk (uniform, default 1) or recomputed layers per stage (block).")
    # the tokenizer's vocabulary, unpadded (resolve(vocab_size=tokenizer.vocab_size)); not the CLI's
    # --vocab-size, which sizes the NullTokenizer (TrainingConfig.null_vocab_size)
    vocab_size: int | None = dataclasses.field(default=None, metadata={"cli": False})

    # sizes that something divides by or allocates: checked positive before anything else
    SIZES = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "num_layers", "hidden_size",
             "num_attention_heads", "seq_length", "ffn_hidden_size", "kv_channels", "num_query_groups",
             "max_position_embeddings", "make_vocab_size_divisible_by", "vocab_size",
             "virtual_pipeline_model_parallel_size", "num_layers_per_virtual_pipeline_stage",
             "context_parallel_size", "moe_ffn_hidden_size", "moe_shared_expert_intermediate_size")

    def __post_init__(self):
        if self.num_query_groups is None or not self.group_query_attention:
            self.num_query_groups = self.num_attention_heads
        if self.kv_channels is None and self.num_attention_heads > 0:
            self.kv_channels = self.hidden_size // self.num_attention_heads
        if self.ffn_hidden_size is None:
            # SwiGLU has 3 matrices instead of 2: keep the parameter count of a 4h GeLU MLP
            self.ffn_hidden_size = (int(8 * self.hidden_size / 3 / 64) * 64 or 64) if self.swiglu \
                else 4 * self.hidden_size
        if self.max_position_embeddings is None:
            self.max_position_embeddings = self.seq_length

    @property
    def padded_vocab_size(self) -> int:
        """Vocabulary padded to a multiple of make_vocab_size_divisible_by x TP. Computed, not stored:
        a checkpoint loaded at another TP size pads to that size's multiple."""
        multiple = self.make_vocab_size_divisible_by * self.tensor_model_parallel_size
        return -(-self.vocab_size // multiple) * multiple

    @property
    def rotary_dim(self) -> int:
        """Dimensions of each head that rope rotates (Megatron-LM: int(kv_channels x rotary_percent))."""
        return int(self.kv_channels * self.rotary_percent)

    def check_sizes(self) -> None:
        """ConfigError unless every size is a positive integer (None: not given, fine)."""
        config_checks.check_sizes(self)

    def resolve(self, vocab_size: int | None = None) -> "TransformerConfig":
        """Fill the derived values, once: the vocabulary (the tokenizer's, when given), the model
        chunks per pipeline rank from --num-layers-per-virtual-pipeline-stage (one chunk is plain 1F1B:
        None), the full-recompute defaults, and attention through Transformer Engine with
        --transformer-impl transformer_engine. Checks the sizes first. Returns self."""
        self.check_sizes()
        if vocab_size is not None:
            self.vocab_size = vocab_size
            self.check_sizes()
        chunks = self._chunks_from_layers_per_stage()
        if self.virtual_pipeline_model_parallel_size is None:
            self.virtual_pipeline_model_parallel_size = chunks
        if self.virtual_pipeline_model_parallel_size == 1 and chunks in (None, 1):
            self.virtual_pipeline_model_parallel_size = None
        resolve_options(self)  # --recompute-activations, the recomputed modules (model_options.py)
        self.resolve_moe()  # --moe-layer-freq given as a pattern (moe_config.py)
        self.resolve_mla()  # --rope-type's default under multi-latent attention (mla_config.py)
        if self.recompute_granularity == "full":
            self.recompute_method, self.recompute_num_layers = config_checks.recompute_defaults(self)
        if self.transformer_impl == "transformer_engine" and self.attention_backend == "auto":
            self.attention_backend = "te"  # what Transformer Engine layers would run; the rest stays ours
        return self

    def _chunks_from_layers_per_stage(self) -> int | None:
        """V implied by --num-layers-per-virtual-pipeline-stage, where it divides (validate() says why not)."""
        k, pp = self.num_layers_per_virtual_pipeline_stage, self.pipeline_model_parallel_size
        if k is None or self.num_layers % pp or (self.num_layers // pp) % k:
            return None
        return self.num_layers // pp // k

    def validate(self) -> None:
        """Check the (resolved) configuration; assigns nothing. Raises ConfigError (config_checks.py)."""
        config_checks.validate(self)
        check_options(self)
        check_fp8(self)
        check_window(self)
