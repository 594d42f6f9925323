"""What the pretrain_*.py scripts share: bad input as one line and exit code 2, resolving and
checking the configuration, start-up, and the run itself."""
import os
import sys

from ..core.checkpointing import CheckpointError, find_checkpoint, same_dir
from ..core.errors import MegatronUserError
from .data import describe_datasets
from .initialize import initialize_distributed, shutdown, world_size_from_env
from .log import print_rank_0
from .resolve import resolve, validate
from .training import pretrain

USER_ERRORS = MegatronUserError  # every error a user's input causes (megatron/core/errors.py)


def print_first_rank(msg):
    """Print on global rank 0 before torch.distributed is up (reads RANK from torchrun)."""
    if os.environ.get("RANK", "0") == "0":
        print(msg, flush=True)


def user_error(e):
    """Bad input: one line, no traceback, printed once (by global rank 0: every rank runs the same
    checks, and rank 0 builds every dataset); the exit code, 2 on every rank."""
    if os.environ.get("RANK", "0") == "0":
        print(f"error: {e}", file=sys.stderr)
    return 2


def configure(model_cfg, train_cfg):
    """Resolve the configs once for this launch's world size (torchrun's WORLD_SIZE), then check
    them. -> the tokenizer. Raises one of USER_ERRORS for bad input."""
    world_size = world_size_from_env()
    tokenizer = resolve(model_cfg, train_cfg, world_size)
    validate(model_cfg, train_cfg, world_size)
    return tokenizer


def start(model_cfg, train_cfg, tokenizer, build_datasets):
    """Check --load, start torch.distributed, build the datasets (build_datasets(train_cfg,
    model_cfg, tokenizer) -> (train, valid, test)) for configs that configure() resolved and checked.
    -> (groups, device, datasets). Raises one of USER_ERRORS for bad input."""
    if train_cfg.load:  # a missing, truncated or foreign checkpoint fails before any process group
        find_checkpoint(train_cfg.load, allow_empty=same_dir(train_cfg.load, train_cfg.save))
    groups, device = initialize_distributed(model_cfg, train_cfg)
    datasets = build_datasets(train_cfg, model_cfg, tokenizer)
    for line in describe_datasets(datasets):
        print_rank_0(line)
    return groups, device, datasets


def run_pretrain(model_cfg, train_cfg, groups, device, spec, datasets, tokenizer_name):
    """training.pretrain(...) of spec (a model_spec.ModelSpec), then shut torch.distributed down.
    -> exit code (2 for a checkpoint that does not fit, found by every rank alike; rank 0 says why)."""
    try:
        pretrain(model_cfg, train_cfg, groups, device, spec, datasets, tokenizer_name)
    except CheckpointError as e:
        if groups.rank == 0:
            print(f"error: {e}", file=sys.stderr)
        return 2
    shutdown()
    return 0
