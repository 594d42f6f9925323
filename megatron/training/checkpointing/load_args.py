"""Which checkpoint a run loads, and how its saved model arguments meet the command line's
(--ckpt-format, --auto-detect-ckpt-format, --pretrained-checkpoint, --use-checkpoint-args).

Our one format (megatron/core/checkpointing) is layout-free: each rank torch.saves its pieces of
the global tensors and any layout reads them. Of Megatron-LM's --ckpt-format names, torch_dist (its
default: sharded, resharded on load) is the one that means that; the others name files we neither
read nor write and are refused.

A checkpoint's weights fit a model only if the model's architecture is the saved one, so the flags
in ARCHITECTURE must equal the checkpoint's saved model arguments (metadata["args"]["model"]), or
--use-checkpoint-args takes them from it. The rest may differ: the parallel layout (TP, PP, VPP, DP,
sequence parallelism, the distributed optimizer; our checkpoints reshard), recompute, kernels and
fusions, the attention backend and the layer implementation (same maths), dropout (training noise,
not weights), --seq-length (the positions used, up to --max-position-embeddings, which is compared),
--make-vocab-size-divisible-by (padding rows; the tokenizer's vocabulary is compared), the
initialisation (overwritten by the load) and the dtype (fp32 master values are saved).
"""
import dataclasses
import os

from ...core.checkpointing import CheckpointError, find_checkpoint, read_metadata, same_dir
from ...core.config import ConfigError, TransformerConfig, flag_of

OUR_CKPT_FORMAT = "torch_dist"
MEGATRON_CKPT_FORMATS = ["torch", "torch_dist", "zarr", "torch_dcp", "fsdp_dtensor"]
ARCHITECTURE = (
    "num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size", "kv_channels", "group_query_attention",
    "num_query_groups", "max_position_embeddings", "position_embedding_type", "rotary_base", "rotary_percent",
    "normalization", "norm_epsilon", "post_norm", "swiglu", "openai_gelu", "add_bias_linear",
    "untie_embeddings_and_output_weights", "layernorm_zero_centered_gamma", "vocab_size")
# architecture flags added after checkpoints were written: a checkpoint without one was saved with this value
SAVED_BEFORE = {"layernorm_zero_centered_gamma": False}
# what --use-checkpoint-args takes from the checkpoint besides ARCHITECTURE (as Megatron-LM does;
# vocab_size is the tokenizer's, resolved later, and compared then)
ALSO_TAKEN = ("hidden_dropout", "attention_dropout")


def check_ckpt_format(train_cfg):
    """ConfigError unless --ckpt-format names our format."""
    # Megatron-FSDP's fsdp_dtensor is for reloading in any FSDP layout: ours is layout-free (fsdp_flags.py)
    if train_cfg.ckpt_format == "fsdp_dtensor" and train_cfg.use_megatron_fsdp:
        return
    if train_cfg.ckpt_format != OUR_CKPT_FORMAT:
        raise ConfigError(f"--ckpt-format {train_cfg.ckpt_format} is not supported: this project reads and writes "
                          f"only its own layout-free sharded format, --ckpt-format {OUR_CKPT_FORMAT} (the default)")


def _foreign_format(root):
    """Megatron-LM's name for the format of a checkpoint directory that is not ours, or None."""
    tracker = os.path.join(root, "latest_checkpointed_iteration.txt")
    if not os.path.isfile(tracker):
        return None
    text = open(tracker).read().strip()
    step = os.path.join(root, "release" if text == "release" else f"iter_{int(text):07d}" if text.isdigit() else "")
    if not os.path.isdir(step):
        return None
    names = os.listdir(step)
    if any(n.startswith("mp_rank_") for n in names):
        return "torch"
    if any(n.endswith(".distcp") for n in names) or "common.pt" in names:
        return "torch_dist or torch_dcp"
    return None


def find_source(train_cfg, report=None):
    """-> (directory of the checkpoint to load, whether as --pretrained-checkpoint), or (None, False)
    to start from scratch. --pretrained-checkpoint is used when --load holds none (Megatron-LM's rule).
    Raises CheckpointError for a missing, damaged or foreign checkpoint. Needs no process group."""
    t = train_cfg
    for flag, root in (("--load", t.load), ("--pretrained-checkpoint", t.pretrained_checkpoint)):
        if root and (fmt := _foreign_format(root)):
            raise CheckpointError(f"{flag} {root}: a Megatron-LM '{fmt}' checkpoint; this project reads only its "
                                  f"own layout-free format (--ckpt-format {OUR_CKPT_FORMAT}), convert it first")
    allow_empty = same_dir(t.load, t.save) or bool(t.pretrained_checkpoint)
    path = find_checkpoint(t.load, allow_empty=allow_empty, report=report) if t.load else None
    if path is not None or not t.pretrained_checkpoint:
        return path, False
    return find_checkpoint(t.pretrained_checkpoint, report=report), True


def _saved_model_args(path):
    saved = read_metadata(path).get("args", {}).get("model")
    if saved is None:
        raise CheckpointError(f"{path}: the checkpoint holds no saved model arguments")
    return saved


def apply_checkpoint_args(model_cfg, train_cfg):
    """--use-checkpoint-args: set the architecture flags (and dropout) of model_cfg in place from the
    --load checkpoint's saved model arguments; --seq-length too unless the command line gives another
    than the default. Without a checkpoint under --load the command line's are kept (as Megatron-LM)."""
    if not (train_cfg.use_checkpoint_args and train_cfg.load):
        return
    path, _ = find_source(dataclasses.replace(train_cfg, pretrained_checkpoint=None, save=train_cfg.load))
    if path is None:
        if os.environ.get("RANK", "0") == "0":
            print(f"> --use-checkpoint-args: no checkpoint in {train_cfg.load}; using the command line's "
                  "model arguments", flush=True)
        return
    saved = _saved_model_args(path)
    default_seq = TransformerConfig.__dataclass_fields__["seq_length"].default
    names = [n for n in ARCHITECTURE + ALSO_TAKEN if n != "vocab_size" and n in saved]
    names += ["seq_length"] if model_cfg.seq_length == default_seq and "seq_length" in saved else []
    for name in names:
        setattr(model_cfg, name, saved[name])


def check_checkpoint_args(model_cfg, path):
    """ConfigError naming the first flag of ARCHITECTURE whose resolved value differs from the
    saved model arguments of the checkpoint at `path`, with both values."""
    saved = {**SAVED_BEFORE, **_saved_model_args(path)}
    for name in ARCHITECTURE:
        if name in saved and saved[name] != getattr(model_cfg, name):
            flag = "the tokenizer's vocabulary size" if name == "vocab_size" else flag_of(TransformerConfig, name)
            here, there = getattr(model_cfg, name), saved[name]
            if isinstance(here, bool):  # a switch: say whether its flag is given
                default = TransformerConfig.__dataclass_fields__[name].default
                here, there = ("given" if v != default else "not given" for v in (here, there))
            raise ConfigError(f"{flag} is {here!r} here but {there!r} in the checkpoint {path}: give the "
                              "checkpoint's value, or --use-checkpoint-args to take the model flags from it")


def saved_optimizer(meta) -> str | None:
    """The --optimizer whose state a checkpoint's metadata holds (None: no optimizer state; checkpoints
    written before --optimizer existed hold AdamW's)."""
    state = meta.get("optimizer")
    return None if not state else state.get("optimizer", "adam")


def check_checkpoint_optimizer(train_cfg, path, pretrained=False):
    """ConfigError when the optimizer state that would be loaded from `path` is another optimizer's (Adam's
    moments for Muon, or the reverse): one line naming both and the way out, --no-load-optim."""
    if pretrained or train_cfg.finetune or train_cfg.no_load_optim:
        return
    saved = saved_optimizer(read_metadata(path))
    if saved is not None and saved != train_cfg.optimizer:
        raise ConfigError(f"--optimizer {train_cfg.optimizer} here but the checkpoint {path} holds {saved}'s "
                          f"optimizer state: give --optimizer {saved}, or --no-load-optim to start the "
                          f"{train_cfg.optimizer} state afresh from its weights")


def check_load(model_cfg, train_cfg):
    """Before any process group: the checkpoint to load exists, is ours, fits the model flags and holds
    this optimizer's state (or none is loaded)."""
    path, pretrained = find_source(train_cfg)
    if path is not None:
        check_checkpoint_args(model_cfg, path)
        check_checkpoint_optimizer(train_cfg, path, pretrained)
