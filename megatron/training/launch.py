"""What the pretrain_*.py scripts share: bad input as one line and exit code 2, the checks and
start-up after the tokenizer exists, and the run itself."""
import os
import sys

from ..core.checkpointing import CheckpointError, find_checkpoint, same_dir
from ..core.config import ConfigError
from ..core.datasets import DatasetError
from ..core.parallel_state import ParallelConfigError
from .data import describe_datasets
from .initialize import initialize_distributed, shutdown, validate_config
from .log import print_rank_0
from .tokenizer import TokenizerError
from .training import pretrain

USER_ERRORS = (ConfigError, ParallelConfigError, DatasetError, TokenizerError, CheckpointError)


def print_first_rank(msg):
    """Print on global rank 0 before torch.distributed is up (reads RANK from torchrun)."""
    if os.environ.get("RANK", "0") == "0":
        print(msg, flush=True)


def user_error(e):
    """Bad input: one line, no traceback; the exit code."""
    print(f"error: {e}", file=sys.stderr)
    return 2


def start(model_cfg, train_cfg, tokenizer, build_datasets):
    """Validate, check --load, start torch.distributed, build the datasets
    (build_datasets(train_cfg, model_cfg, tokenizer) -> (train, valid, test)). -> (groups, device,
    datasets). Raises one of USER_ERRORS for bad input."""
    validate_config(model_cfg, train_cfg, tokenizer.vocab_size)
    if train_cfg.load:  # a missing, truncated or foreign checkpoint fails before any process group
        find_checkpoint(train_cfg.load, allow_empty=same_dir(train_cfg.load, train_cfg.save))
    groups, device = initialize_distributed(model_cfg, train_cfg)
    datasets = build_datasets(train_cfg, model_cfg, tokenizer)
    for line in describe_datasets(datasets):
        print_rank_0(line)
    return groups, device, datasets


def run_pretrain(model_cfg, train_cfg, groups, device, *args, **kwargs):
    """training.pretrain(...), then shut torch.distributed down. -> exit code (2 for a
    checkpoint that does not fit, found by every rank alike; rank 0 says why)."""
    try:
        pretrain(model_cfg, train_cfg, groups, device, *args, **kwargs)
    except CheckpointError as e:
        if groups.rank == 0:
            print(f"error: {e}", file=sys.stderr)
        return 2
    shutdown()
    return 0
