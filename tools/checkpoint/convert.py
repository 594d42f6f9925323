"""Convert checkpoints between HuggingFace and ours, for every model family of megatron/core/models/families/:
GPT (GPT2LMHeadModel, LlamaForCausalLM, Qwen3ForCausalLM for a model with --qk-layernorm) and BERT
(BertForPreTraining, or BertForMaskedLM for a model without the binary head); MoE GPT as MixtralForCausalLM,
or Qwen2MoeForCausalLM for a model with (gated) shared experts; a model with multi-latent attention as
DeepseekV3ForCausalLM (its router's e_score_correction_bias is our expert bias). A HuggingFace model's family
is its config.json's model_type; ours is the one whose layer switches the model has (families.for_model).

    python tools/checkpoint/convert.py --model-type GPT --loader hf --saver megatron \
        --load-dir hf_model/ --save-dir ckpt/
    python tools/checkpoint/convert.py --model-type BERT --loader megatron --saver hf \
        --load-dir ckpt/ --save-dir hf_model/
    python tools/checkpoint/convert.py --loader megatron --saver torch_dcp --load-dir ckpt/ --save-dir dcp/

Learned absolute positions become GPT-2, rope becomes Llama (Qwen3 with per-head q/k norms); tied or
untied output layers both convert. Every tensor of the source must be used (else one line naming the unused
ones), and a model no HF family holds is refused with one line saying what is supported.
The tokenizer files and the bos/eos/pad ids travel too (hf_tokenizer.py).
torch_dcp is a torch.distributed.checkpoint directory of the global tensors, keyed by our names,
with the saved arguments (megatron/core/checkpointing/dcp_interop.py); torch alone loads it.
The MoE routers' expert bias (--moe-router-enable-expert-bias, checkpoint state "buffer") travels
between ours and torch_dcp; no HF family here holds it, so --saver hf refuses a non-zero one (the
routing would change) and drops a zero one (the same model).

Our checkpoints are layout-free (global tensors keyed by init_key; any TP/PP/DP loads
them), so --target-tensor/pipeline-parallel-size need no resharding: they are accepted
for Megatron-LM command lines and recorded in the saved model args, and training or
generation loads the result at whatever sizes it is launched with. HF models are read
from and written to local directories only (no downloads).
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from megatron.core.checkpointing import (
    CheckpointError,
    CheckpointReader,
    find_checkpoint,
    save_global_checkpoint,
    whole_piece,
)
from megatron.core.checkpointing.dcp_interop import load_dcp, save_dcp, split_buffers
from megatron.core.checkpointing.hf_checks import with_whole_norm_weights
from megatron.core.checkpointing.hf_files import add_to_saved_files, read_config_json, read_state_dict
from megatron.core.errors import MegatronUserError
from megatron.core.models import families

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_tokenizer

EXPERT_BIAS = ".mlp.router.expert_bias"  # a buffer of ours that DeepSeek-V3's state dict holds beside the weights


def _transformers():
    try:
        import transformers
    except ImportError:
        raise CheckpointError("HuggingFace conversion needs transformers: pip install -e '.[hf]'") from None
    return transformers


def refuse_non_finite(tensors, source):
    """A weight holding NaN or inf (damaged bytes read as floats) would convert into a model that
    only produces NaN: refuse it, naming the first such tensor."""
    bad = sorted(k for k, v in tensors.items() if v.is_floating_point() and not torch.isfinite(v).all())
    if bad:
        raise CheckpointError(f"{source}: tensor {bad[0]} holds NaN or inf values ({len(bad)} such tensor"
                              f"{'s' if len(bad) > 1 else ''}): the weight files are damaged; restore them")


def load_hf(path, model_type="GPT"):
    """-> (model args, {init_key: tensor}, config.json dict) from a local HF model directory."""
    tf = _transformers()
    raw = read_config_json(path, {t: families.by_hf_type(t).hf_required_keys for t in families.hf_types(model_type)})
    try:
        config = tf.AutoConfig.from_pretrained(path, local_files_only=True)
    except Exception as e:  # transformers rejects bad values with several exception types
        raise CheckpointError(f"{path}/config.json: {type(e).__name__}: {str(e).splitlines()[0]}") from None
    sd = read_state_dict(path)
    refuse_non_finite(sd, path)  # under the file's own names
    try:
        args, tensors = families.by_hf_type(raw["model_type"]).to_ours(config, sd)
    except RuntimeError as e:  # a reshape of a tensor whose shape config.json does not describe
        raise CheckpointError(f"{path}: tensor shapes do not match config.json ({str(e).splitlines()[0]})") from None
    note = mtp_note(path, raw, args)
    if note:
        print(note)
    return args, tensors, raw


def mtp_note(path, raw, args):
    """The line saying that config.json promises multi-token prediction layers the files do not hold
    (transformers' save_pretrained writes none: its models have no MTP), so they are not converted; None
    when the files hold every one (a part of them is refused by the family's conversion)."""
    promised, held = raw.get("num_nextn_predict_layers") or 0, args.get("mtp_num_layers") or 0
    if promised <= held:
        return None
    return (f"> {path}/config.json names {promised} multi-token prediction layer(s) (num_nextn_predict_layers) that "
            "its files do not hold (transformers writes none): converted without them (no --mtp-num-layers); "
            "convert DeepSeek's own files to keep them")


def save_hf(path, args, tensors, training, model_type="GPT", buffers=None):
    tf = _transformers()
    tensors = with_whole_norm_weights(args, tensors)  # --apply-layernorm-1p stores w - 1
    family = families.for_model(args, model_type)
    buffers = dict(buffers or {})
    if not family.holds_expert_bias:
        refuse_nonzero_buffers(buffers)
    cfg, sd = family.to_hf(args, tensors, buffers)
    config = getattr(tf, family.hf_config_class)(**cfg)
    config.torch_dtype = next(iter(sd.values())).dtype
    model = getattr(tf, family.model_class(sd))(config).to(config.torch_dtype)
    outside = {k: sd.pop(k) for k in (family.hf_files_only(sd, cfg) if family.hf_files_only else ())}
    missing, unexpected = model.load_state_dict(sd, strict=False)
    missing = [k for k in missing if k not in family.hf_tied or not config.tie_word_embeddings]
    if missing or unexpected:
        raise CheckpointError(f"conversion bug: missing {missing}, unexpected {unexpected}")
    os.makedirs(path, exist_ok=True)
    special = hf_tokenizer.to_hf(training, path, args.get("vocab_size"))
    for k in hf_tokenizer.SPECIAL:
        setattr(config, k, special.get(k))
        if model.can_generate():  # encoders have no generation_config
            setattr(model.generation_config, k, special.get(k))
    model.save_pretrained(path)
    add_to_saved_files(path, outside)  # e.g. DeepSeek-V3's multi-token prediction layers: in its files only


def refuse_nonzero_buffers(buffers):
    """HF has no place for our non-trained state: dropping a non-zero expert bias changes the routing."""
    moved = sorted(k for k, v in buffers.items() if v.count_nonzero())
    if moved:
        raise CheckpointError(f"{moved[0]} ({len(moved)} such) is non-zero: the MoE expert bias of "
                              "--moe-router-enable-expert-bias has no HuggingFace counterpart for this model, and "
                              "dropping it changes which experts tokens go to; convert with --saver megatron or "
                              "torch_dcp")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-type", default="GPT", choices=["GPT", "BERT"])
    p.add_argument("--loader", required=True, choices=["hf", "megatron", "torch_dcp"])
    p.add_argument("--saver", required=True, choices=["hf", "megatron", "torch_dcp"])
    p.add_argument("--load-dir", required=True)
    p.add_argument("--save-dir", required=True)
    for kind in ("tensor", "pipeline"):
        p.add_argument(f"--target-{kind}-parallel-size", type=int, default=1,
                       help="--saver megatron: recorded only; our checkpoints are layout-free, so any "
                            f"{kind}-parallel size loads them without resharding")
    a = p.parse_args(argv)
    try:
        for kind in ("tensor", "pipeline"):
            size = getattr(a, f"target_{kind}_parallel_size")
            if size < 1 or (size != 1 and a.saver != "megatron"):
                raise CheckpointError(f"--target-{kind}-parallel-size {size}: needs >= 1, and goes with "
                                      "--saver megatron (a HuggingFace model has no parallel layout)")
        if a.loader == "hf":
            args, tensors, raw = load_hf(a.load_dir, a.model_type)
            training = dict(hf_tokenizer.from_hf(a.load_dir, a.save_dir, raw), hf_model_type=raw["model_type"])
            buffers = {k: tensors.pop(k) for k in [k for k in tensors if k.endswith(EXPERT_BIAS)]}
        elif a.loader == "torch_dcp":
            saved, tensors = load_dcp(a.load_dir)
            args, training = saved.get("model", {}), saved.get("training", {})
            tensors, buffers = split_buffers(saved, tensors)
        else:
            reader = CheckpointReader(find_checkpoint(a.load_dir))
            args, training = reader.metadata["args"]["model"], reader.metadata["args"].get("training", {})
            tensors = {k: reader.global_tensor(k) for k in reader.keys("param")}
            buffers = {k: reader.global_tensor(k, "buffer") for k in reader.keys("buffer")}
        if a.loader != "hf":
            refuse_non_finite(tensors, a.load_dir)
        if a.saver == "hf":
            save_hf(a.save_dir, args, tensors, training, a.model_type, buffers)
        elif a.saver == "torch_dcp":
            save_dcp(a.save_dir, tensors, {"model": args, "training": training}, buffers)
        else:
            args = dict(args, tensor_model_parallel_size=a.target_tensor_parallel_size,
                        pipeline_model_parallel_size=a.target_pipeline_parallel_size)
            pieces = [whole_piece(k, "param", v) for k, v in tensors.items()]
            save_global_checkpoint(a.save_dir, pieces + [whole_piece(k, "buffer", v) for k, v in buffers.items()],
                                   {"model": args, "training": training})
    except MegatronUserError as e:  # CheckpointError, TokenizerError
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"converted {a.loader} {a.load_dir} -> {a.saver} {a.save_dir} ({len(tensors)} tensors)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
