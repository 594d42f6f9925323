"""What the pretrain_*.py scripts share: bad input as one line and exit code 2, resolving and
checking the configuration, start-up, and the run itself."""
import os
import sys
import time

import torch.distributed as dist

from ...core import watchdog
from ...core.checkpointing import finishing_saves
from ...core.errors import MegatronUserError
from ..checkpointing.load_args import check_load
from ..config.output_paths import check_outputs
from ..config.resolve import resolve, validate
from ..config.yaml_config import log_configuration
from ..data.loader import describe_datasets
from ..observability.log import print_rank_0
from .initialize import initialize_distributed, shutdown, world_size_from_env
from .nan_check import NonFiniteError
from .training import pretrain

USER_ERRORS = MegatronUserError  # every error a user's input causes (megatron/core/errors.py)


def print_first_rank(msg):
    """Print on global rank 0 before torch.distributed is up (reads RANK from torchrun)."""
    if os.environ.get("RANK", "0") == "0":
        print(msg, flush=True)


RANK0_GRACE_SECONDS = 15


def user_error(e):
    """Bad input: one line, no traceback, printed once; the exit code, 2 on every rank. Before
    torch.distributed starts, by global rank 0 (every rank runs the same checks); after, by the first
    rank that finds it (core/watchdog.claim_user_error), whichever it is."""
    if dist.is_initialized():
        if watchdog.claim_user_error():
            print(f"error: {e}", file=sys.stderr, flush=True)
        return 2
    if os.environ.get("RANK", "0") == "0":
        print(f"error: {e}", file=sys.stderr, flush=True)
    else:
        # torchrun stops every rank as soon as one exits: a rank that found the error first must not
        # end rank 0 before it has printed the line (when rank 0 exits first, this wait is cut short)
        time.sleep(RANK0_GRACE_SECONDS)
    return 2


def configure(model_cfg, train_cfg):
    """Resolve the configs once for this launch's world size (torchrun's WORLD_SIZE), then check
    them. -> (the tokenizer, the ParallelLayout). Raises one of USER_ERRORS for bad input."""
    world_size = world_size_from_env()
    log_configuration(model_cfg, train_cfg, print_first_rank)  # with --yaml-cfg: what the file and flags set
    tokenizer = resolve(model_cfg, train_cfg, world_size)
    return tokenizer, validate(model_cfg, train_cfg, world_size)


def start(model_cfg, train_cfg, layout, tokenizer, build_datasets):
    """Check --load, start torch.distributed and build `layout`'s groups, build the datasets
    (build_datasets(train_cfg, model_cfg, tokenizer) -> (train, valid, test)) for configs that configure()
    resolved and checked. -> (groups, device, datasets). Raises one of USER_ERRORS for bad input."""
    check_outputs(train_cfg)  # an unwritable --save fails now, not at the first save
    # a missing, truncated or foreign checkpoint, or one of other model flags, fails before any process group
    check_load(model_cfg, train_cfg)
    groups, device = initialize_distributed(layout, train_cfg)
    datasets = build_datasets(train_cfg, model_cfg, tokenizer)
    for line in describe_datasets(datasets):
        print_rank_0(line)
    return groups, device, datasets


def run_pretrain(model_cfg, train_cfg, groups, device, spec, datasets, tokenizer_name):
    """training.pretrain(...) of spec (a model_spec.ModelSpec), then shut torch.distributed down.
    -> exit code (2 for bad input found now, e.g. a checkpoint that does not fit, a damaged shard, a full
    disk: the first rank that finds it says why; 17 for a NaN loss or grad norm, nan_check.py; 3 for a peer
    that hangs, core/watchdog.py)."""
    try:
        with finishing_saves():  # --async-save: a save in flight commits before any exit path
            pretrain(model_cfg, train_cfg, groups, device, spec, datasets, tokenizer_name)
    except USER_ERRORS as e:  # a checkpoint that does not fit or is damaged, a full disk, an unwritable file
        return user_error(e)
    except NonFiniteError as e:  # every rank stops at the same iteration; nothing of it was saved
        if groups.rank == e.printer:
            print(f"error: {e}", file=sys.stderr, flush=True)
        shutdown()
        return e.exit_code
    except RuntimeError as e:
        watchdog.unarmed_failure(e, groups.rank)  # a peer hung: one line, exit; else re-raised
        raise
    shutdown()
    return 0
