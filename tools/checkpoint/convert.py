"""Convert checkpoints between HuggingFace and ours: GPT (GPT2LMHeadModel, LlamaForCausalLM)
and BERT (BertForPreTraining, or BertForMaskedLM for a model without the binary head).

    python tools/checkpoint/convert.py --model-type GPT --loader hf --saver megatron \
        --load-dir hf_model/ --save-dir ckpt/ --target-tensor-parallel-size 2
    python tools/checkpoint/convert.py --model-type BERT --loader megatron --saver hf \
        --load-dir ckpt/ --save-dir hf_model/

Our checkpoints are layout-free (global tensors keyed by init_key; any TP/PP/DP loads
them), so the target sizes are only recorded as the default layout in the saved
arguments. HF models are read from and written to local directories only (no downloads).
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from megatron.core.checkpointing import (
    CheckpointError,
    CheckpointReader,
    find_checkpoint,
    hf_bert,
    save_global_checkpoint,
    whole_piece,
)
from megatron.core.checkpointing import hf_conversion as hc

HF_TYPES = {"GPT": ("gpt2", "llama"), "BERT": ("bert",)}


def _transformers():
    try:
        import transformers
    except ImportError:
        raise CheckpointError("HuggingFace conversion needs transformers: pip install -e '.[hf]'") from None
    return transformers


def load_hf(path, model_type="GPT"):
    """-> (model args, {init_key: tensor}, HF model type) from a local HF model directory."""
    tf = _transformers()
    if not os.path.exists(os.path.join(path, "config.json")):
        raise CheckpointError(f"--load-dir {path}: no config.json, not a HuggingFace model directory")
    config = tf.AutoConfig.from_pretrained(path, local_files_only=True)
    if config.model_type not in HF_TYPES[model_type]:
        raise CheckpointError(f"HuggingFace model type {config.model_type!r} is not a --model-type {model_type} "
                              f"we convert ({', '.join(HF_TYPES[model_type])})")
    if model_type == "BERT":
        masked_lm_only = "BertForMaskedLM" in (config.architectures or [])
        cls = tf.BertForMaskedLM if masked_lm_only else tf.BertForPreTraining
        model = cls.from_pretrained(path, local_files_only=True, torch_dtype="auto")
        return (*hf_bert.bert_to_ours(config, model.state_dict()), config.model_type)
    convert = {"gpt2": hc.gpt2_to_ours, "llama": hc.llama_to_ours}[config.model_type]
    model = tf.AutoModelForCausalLM.from_pretrained(path, local_files_only=True, torch_dtype="auto")
    return (*convert(config, model.state_dict()), config.model_type)


def save_hf(path, args, tensors, model_type="GPT"):
    tf = _transformers()
    if model_type == "BERT":
        cfg, sd, binary = hf_bert.ours_to_bert(args, tensors)
        config, cls = tf.BertConfig(**cfg), tf.BertForPreTraining if binary else tf.BertForMaskedLM
        tied = ("cls.predictions.decoder.weight", "cls.predictions.decoder.bias")
    elif args["position_embedding_type"] == "rope":
        cfg, sd = hc.ours_to_llama(args, tensors)
        config, cls = tf.LlamaConfig(**cfg), tf.LlamaForCausalLM
        tied = ("lm_head.weight",)
    else:
        cfg, sd = hc.ours_to_gpt2(args, tensors)
        config, cls = tf.GPT2Config(**cfg), tf.GPT2LMHeadModel
        tied = ("lm_head.weight",)
    config.torch_dtype = next(iter(sd.values())).dtype
    model = cls(config).to(config.torch_dtype)
    missing, unexpected = model.load_state_dict(sd, strict=False)
    missing = [k for k in missing if k not in tied or not config.tie_word_embeddings]
    if missing or unexpected:
        raise CheckpointError(f"conversion bug: missing {missing}, unexpected {unexpected}")
    model.save_pretrained(path)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-type", default="GPT", choices=["GPT", "BERT"])
    p.add_argument("--loader", required=True, choices=["hf", "megatron"])
    p.add_argument("--saver", required=True, choices=["hf", "megatron"])
    p.add_argument("--load-dir", required=True)
    p.add_argument("--save-dir", required=True)
    p.add_argument("--target-tensor-parallel-size", type=int, default=1)
    p.add_argument("--target-pipeline-parallel-size", type=int, default=1)
    a = p.parse_args(argv)
    try:
        if a.loader == "hf":
            args, tensors, hf_type = load_hf(a.load_dir, a.model_type)
            training = {"tokenizer_type": "NullTokenizer", "vocab_size": args["vocab_size"], "hf_model_type": hf_type}
        else:
            reader = CheckpointReader(find_checkpoint(a.load_dir))
            args, training = reader.metadata["args"]["model"], reader.metadata["args"].get("training", {})
            tensors = {k: reader.global_tensor(k) for k in reader.keys("param")}
        if a.saver == "hf":
            save_hf(a.save_dir, args, tensors, a.model_type)
        else:
            args = dict(args, tensor_model_parallel_size=a.target_tensor_parallel_size,
                        pipeline_model_parallel_size=a.target_pipeline_parallel_size)
            save_global_checkpoint(a.save_dir, [whole_piece(k, "param", v) for k, v in tensors.items()],
                                   {"model": args, "training": training})
    except CheckpointError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"converted {a.loader} {a.load_dir} -> {a.saver} {a.save_dir} ({len(tensors)} tensors)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
