"""Pretrain a GPT model.

    python pretrain_gpt.py                      # embedded default: small GPT on stdlib source, CPU or GPU
    torchrun --nproc-per-node 4 pretrain_gpt.py --tensor-model-parallel-size 2 --mock-data \
        --tokenizer-type NullTokenizer --vocab-size 1024 ...
"""
import sys

from megatron.core.checkpointing import CheckpointError, find_checkpoint, same_dir
from megatron.core.config import ConfigError
from megatron.core.models.gpt import GPTModel
from megatron.core.parallel_state import ParallelConfigError
from megatron.training.arguments import parse_args
from megatron.training.data import build_datasets
from megatron.training.initialize import initialize_distributed, shutdown, validate_config
from megatron.training.tokenizer import build_tokenizer
from megatron.training.training import pretrain


def model_provider(config, groups, device):
    """The whole GPT on one stage (pipelining arrives with its own issue)."""
    return GPTModel(config, groups, pre_process=True, post_process=True, device=device)


def forward_step(model, batch):
    """-> (per-token loss [b, s], loss mask [b, s])."""
    return model(batch["tokens"], labels=batch["labels"]), batch["loss_mask"]


def main(argv=None):
    try:
        model_cfg, train_cfg = parse_args(argv)
        train_cfg.validate(1)  # tokenizer choice; re-checked with the real DP size below
        tokenizer = build_tokenizer(train_cfg)
        validate_config(model_cfg, train_cfg, tokenizer.vocab_size)
        if train_cfg.load:  # a missing, truncated or foreign checkpoint fails before any process group
            find_checkpoint(train_cfg.load, allow_empty=same_dir(train_cfg.load, train_cfg.save))
        groups, device = initialize_distributed(model_cfg, train_cfg)
        datasets = build_datasets(train_cfg, model_cfg, tokenizer)
    except (ConfigError, ParallelConfigError, CheckpointError) as e:
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
