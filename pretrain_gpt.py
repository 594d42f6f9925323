"""Pretrain a GPT model.

    python pretrain_gpt.py                      # embedded default: small GPT on stdlib source, CPU or GPU
    python pretrain_gpt.py --data-path data/my-corpus_text_document --tokenizer-type GPT2BPETokenizer \
        --vocab-file vocab.json --merge-file merges.txt ...
    torchrun --nproc-per-node 4 pretrain_gpt.py --tensor-model-parallel-size 2 --mock-data \
        --tokenizer-type NullTokenizer --vocab-size 1024 ...
"""
import os
import sys

from megatron.core.checkpointing import CheckpointError, find_checkpoint, same_dir
from megatron.core.config import ConfigError
from megatron.core.datasets import DatasetError
from megatron.core.models.gpt import GPTModel
from megatron.core.parallel_state import ParallelConfigError
from megatron.training.arguments import parse_args
from megatron.training.data import build_datasets, describe_datasets
from megatron.training.embedded import prepare_embedded_data
from megatron.training.initialize import initialize_distributed, shutdown, validate_config
from megatron.training.log import print_rank_0
from megatron.training.tokenizer import TokenizerError, build_tokenizer
from megatron.training.training import pretrain

USER_ERRORS = (ConfigError, ParallelConfigError, DatasetError, TokenizerError, CheckpointError)


def model_provider(config, groups, device, pre_process=True, post_process=True, vp_stage=None):
    """One model chunk: this pipeline rank's layers of virtual stage vp_stage (all of them
    without pipelining); the embedding where pre_process, output layer and loss where post_process."""
    return GPTModel(config, groups, pre_process=pre_process, post_process=post_process, device=device,
                    vp_stage=vp_stage)


def forward_step(model, batch):
    """-> (per-token loss [b, s], loss mask [b, s]) on the last pipeline stage; earlier
    stages return their hidden states [s, b, h] in place of the loss."""
    return model(batch["tokens"], labels=batch["labels"]), batch["loss_mask"]


def _print_first_rank(msg):
    if os.environ.get("RANK", "0") == "0":
        print(msg, flush=True)


def main(argv=None):
    try:
        model_cfg, train_cfg = parse_args(argv)
        train_cfg.validate(1)  # tokenizer choice; re-checked with the real DP size below
        if train_cfg.uses_embedded_corpus:  # built once per machine, then cached
            prepare_embedded_data(train_cfg, log=_print_first_rank)
        tokenizer = build_tokenizer(train_cfg)
        validate_config(model_cfg, train_cfg, tokenizer.vocab_size)
        if train_cfg.load:  # a missing, truncated or foreign checkpoint fails before any process group
            find_checkpoint(train_cfg.load, allow_empty=same_dir(train_cfg.load, train_cfg.save))
        groups, device = initialize_distributed(model_cfg, train_cfg)
        datasets = build_datasets(train_cfg, model_cfg, tokenizer)
        for line in describe_datasets(datasets):
            print_rank_0(line)
    except USER_ERRORS as e:  # bad input: one line, no traceback
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        pretrain(model_cfg, train_cfg, groups, device, model_provider, forward_step, datasets,
                 type(tokenizer).__name__)
    except CheckpointError as e:  # found by every rank alike (e.g. a shape mismatch)
        if groups.rank == 0:
            print(f"error: {e}", file=sys.stderr)
        return 2
    shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
