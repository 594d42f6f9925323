"""Pretrain a BERT model: masked LM plus a sentence-order (or next-sentence) binary head.

    python pretrain_bert.py                      # embedded recipe: small BERT on stdlib source lines
    python tools/preprocess_data.py --input corpus.jsonl --output-prefix data/my-corpus --split-sentences \
        --tokenizer-type BertWordPieceLowerCase --vocab-file vocab.txt
    python pretrain_bert.py --data-path data/my-corpus_text_sentence --tokenizer-type BertWordPieceLowerCase \
        --vocab-file vocab.txt ...
    torchrun --nproc-per-node 8 pretrain_bert.py --tensor-model-parallel-size 2 \
        --pipeline-model-parallel-size 2 ...
"""
import functools
import os
import sys

from megatron.core.config import ConfigError
from megatron.core.datasets.bert_dataset import collate_bert
from megatron.core.models.bert import BertModel
from megatron.training.config.arguments import parse_args
from megatron.training.config.training_config import BertOptions
from megatron.training.config.yaml_config import yaml_cfg_first
from megatron.training.data.embedded import EMBEDDED, embedded_recipe
from megatron.training.data.loader import build_bert_datasets_from_config
from megatron.training.loop.launch import USER_ERRORS, configure, print_first_rank, run_pretrain, start, user_error
from megatron.training.loop.model_spec import ModelSpec
from megatron.training.planner.auto_parallel import choose_and_parse

SPECIAL_TOKENS = ("cls", "sep", "mask", "pad")


def model_provider(config, groups, device, pre_process=True, post_process=True, vp_stage=None,
                   add_binary_head=True):
    """One model chunk (see pretrain_gpt.model_provider); the pooler and binary head go
    with the LM head on the last stage."""
    return BertModel(config, groups, pre_process=pre_process, post_process=post_process,
                     add_binary_head=add_binary_head, device=device, vp_stage=vp_stage)


def forward_step(model, batch, binary_name=None):
    """Last stage -> {'lm loss': (per-token loss [b, s], loss mask [b, s]), binary_name:
    (per-sample loss [b], ones [b])}; earlier stages -> hidden states [s(/TP), b, h].
    binary_name None: no binary head."""
    out = model(batch["tokens"], batch["padding_mask"], batch["types"], lm_labels=batch["labels"],
                binary_labels=batch["is_random"])
    if not model.post_process:
        return out
    lm_loss, binary_loss = out
    terms = {"lm loss": (lm_loss, batch["loss_mask"])}
    if binary_name is not None:
        terms[binary_name] = (binary_loss, binary_loss.new_ones(binary_loss.shape))
    return terms


def check_bert_config(model_cfg, train_cfg, bert, tokenizer):
    """BERT-only checks, before any process group (raises ConfigError)."""
    bert.validate()
    if model_cfg.position_embedding_type != "learned_absolute":
        raise ConfigError("BERT uses learned absolute positions: drop --position-embedding-type rope")
    if model_cfg.context_parallel_size > 1:
        raise ConfigError("--context-parallel-size > 1 serves GPT (causal) models; give BERT --context-parallel-size 1")
    if model_cfg.untie_embeddings_and_output_weights:
        raise ConfigError("BERT's LM head is tied to the word embedding: drop --untie-embeddings-and-output-weights")
    missing = [name for name in SPECIAL_TOKENS if getattr(tokenizer, name, None) is None]
    if missing and not train_cfg.mock_data:
        raise ConfigError(f"--tokenizer-type {train_cfg.tokenizer_type} has no {', '.join(missing)} token(s); BERT "
                          "needs a WordPiece vocabulary: use --tokenizer-type BertWordPieceLowerCase (or "
                          "BertWordPieceCase) --vocab-file vocab.txt")


def main(argv=None):
    argv = yaml_cfg_first(sys.argv[1:] if argv is None else argv)  # the command line overrides the file
    extra = [("BERT", BertOptions), EMBEDDED]
    try:
        argv = embedded_recipe(argv, extra, bert=True, log=print_first_rank)  # no data flags: the stdlib corpus
        # --auto-parallel: the planner's layout flags (priced as a GPT of the same sizes) join the command line
        (model_cfg, train_cfg, bert, _), lines = choose_and_parse(
            argv, functools.partial(parse_args, description="Pretrain a BERT model.", extra=extra), extra,
            "pretrain_bert.py")
        for line in lines:
            print_first_rank(line)
        tokenizer, layout = configure(model_cfg, train_cfg)
        check_bert_config(model_cfg, train_cfg, bert, tokenizer)
        build = functools.partial(build_bert_datasets_from_config, binary_head=bert.bert_binary_head,
                                  binary_head_task=bert.binary_head_task, masked_lm_prob=bert.mask_prob,
                                  short_seq_prob=bert.short_seq_prob)
        groups, device, datasets = start(model_cfg, train_cfg, layout, tokenizer, build)
    except USER_ERRORS as e:
        return user_error(e)
    terms = bert.loss_terms
    binary_name = next((name for name in terms if name != "lm loss"), None)
    spec = ModelSpec(functools.partial(model_provider, add_binary_head=bert.bert_binary_head),
                     functools.partial(forward_step, binary_name=binary_name), terms, collate_bert)
    return run_pretrain(model_cfg, train_cfg, groups, device, spec, datasets, type(tokenizer).__name__)


if __name__ == "__main__":
    code = main()
    # everything is written and the groups are destroyed: skip the interpreter teardown, where
    # gloo's threads can still abort a finished run ("terminate called without an active exception")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
