"""Pretrain a GPT model.

    python pretrain_gpt.py                      # embedded recipe: small GPT on stdlib source, CPU or GPU
    python pretrain_gpt.py --data-path data/my-corpus_text_document --tokenizer-type GPT2BPETokenizer \
        --vocab-file vocab.json --merge-file merges.txt ...
    torchrun --nproc-per-node 4 pretrain_gpt.py --tensor-model-parallel-size 2 --mock-data \
        --tokenizer-type NullTokenizer --vocab-size 1024 ...
"""
import functools
import os
import sys

from megatron.core.models.gpt import GPTModel
from megatron.core.pipeline_parallel.losses import TOKEN_LOSS
from megatron.core.transformer import mtp
from megatron.core.transformer.documents import Documents
from megatron.training.config.arguments import parse_args
from megatron.training.config.yaml_config import yaml_cfg_first
from megatron.training.data.embedded import EMBEDDED, embedded_recipe
from megatron.training.data.loader import build_datasets, collate_gpt, gpt_collate
from megatron.training.loop.launch import USER_ERRORS, configure, print_first_rank, run_pretrain, start, user_error
from megatron.training.loop.model_spec import ModelSpec
from megatron.training.planner.auto_parallel import choose_and_parse


def model_provider(config, groups, device, pre_process=True, post_process=True, vp_stage=None):
    """One model chunk: this pipeline rank's layers of virtual stage vp_stage (all of them
    without pipelining); the embedding where pre_process, output layer and loss where post_process."""
    return GPTModel(config, groups, pre_process=pre_process, post_process=post_process, device=device,
                    vp_stage=vp_stage)


def forward_step(model, batch):
    """-> {"lm loss": (per-token loss [b, s], loss mask [b, s])} on the last pipeline stage, with
    --mtp-num-layers also "mtp_1 loss" ... (transformer/mtp.py); earlier stages return their hidden
    states [s(/TP), b, h] to send on. A batch with segment_ids (packed documents) attends within each
    document (transformer/documents.py); every stage reads them from its own micro-batch."""
    inputs = mtp.mtp_inputs(batch, model.config)
    documents = Documents(batch["segment_ids"]) if "segment_ids" in batch else None
    out = model(batch["tokens"], labels=batch["labels"], position_ids=batch.get("position_ids"),
                attention_mask=documents, mtp_inputs=inputs)
    if not model.post_process:
        return out
    if inputs is None:
        return {"lm loss": (out, batch["loss_mask"])}
    loss, mtp_losses = out
    return {"lm loss": (loss, batch["loss_mask"]), **mtp.loss_terms(mtp_losses, batch, model.config)}


def model_spec(model_cfg, train_cfg, tokenizer):
    """The ModelSpec of a GPT; multi-token prediction adds its loss terms and the shifted inputs to each batch."""
    collate = gpt_collate(train_cfg, tokenizer)
    if not model_cfg.mtp_num_layers:
        return ModelSpec(model_provider, forward_step, collate=collate)
    base, depth = collate or collate_gpt, model_cfg.mtp_num_layers

    def with_mtp(samples, device):
        return mtp.add_mtp_inputs(base(samples, device), depth)
    return ModelSpec(model_provider, forward_step, loss_terms={**TOKEN_LOSS, **mtp.loss_declaration(model_cfg)},
                     collate=with_mtp)


def main(argv=None):
    argv = yaml_cfg_first(sys.argv[1:] if argv is None else argv)  # the command line overrides the file
    try:
        argv = embedded_recipe(argv, [EMBEDDED], log=print_first_rank)  # no data flags: the stdlib corpus
        # --auto-parallel: the planner's layout flags join the command line before anything is resolved
        (model_cfg, train_cfg, _), lines = choose_and_parse(argv, functools.partial(parse_args, extra=[EMBEDDED]),
                                                            [EMBEDDED], "pretrain_gpt.py")
        for line in lines:
            print_first_rank(line)
        tokenizer, layout = configure(model_cfg, train_cfg)
        groups, device, datasets = start(model_cfg, train_cfg, layout, tokenizer, build_datasets)
    except USER_ERRORS as e:
        return user_error(e)
    spec = model_spec(model_cfg, train_cfg, tokenizer)
    return run_pretrain(model_cfg, train_cfg, groups, device, spec, datasets, type(tokenizer).__name__)


if __name__ == "__main__":
    code = main()
    # everything is written and the groups are destroyed: skip the interpreter teardown, where
    # gloo's threads can still abort a finished run ("terminate called without an active exception")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
