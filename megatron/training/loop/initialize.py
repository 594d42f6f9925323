"""Starting torch.distributed, building the rank grid, seeding."""
import datetime
import os
import socket

import torch
import torch.distributed as dist

from ...core import debug, watchdog
from ...core.config import ConfigError
from ...core.parallel_state import default_backend
from ...core.tensor_parallel.random import model_parallel_seed
from .elastic_restart import attempt_store


def world_size_from_env() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def initialize_distributed(layout, train_cfg):
    """Start the default group (torchrun env, or a 1-process group), build `layout`'s groups
    (ParallelLayout.build_groups), seed.

    Returns (ProcessGroups, device).
    """
    if "RANK" not in os.environ:  # plain `python pretrain_gpt.py`: a world of one
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(_free_port()))
    backend = train_cfg.distributed_backend or default_backend()
    if backend == "nccl" and not torch.cuda.is_available():
        raise ConfigError("--distributed-backend nccl needs CUDA GPUs; use gloo on CPU")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        # more ranks on a node than GPUs: they share them (gloo can; NCCL refuses two ranks on one device)
        gpus, local_ranks = torch.cuda.device_count(), int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        if local_ranks > gpus and backend == "nccl":
            raise ConfigError(f"{local_ranks} ranks per node share {gpus} GPU(s): NCCL refuses two ranks on one "
                              "device; use --distributed-backend gloo or one rank per GPU")
        local_rank %= gpus
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    limit = debug.timeout_seconds(train_cfg.distributed_timeout_minutes)
    if not dist.is_initialized():
        # the group's own timeout a little later than the watchdog's (the backstop for waits it does not
        # arm), and never under a minute (start-up skew between ranks under a seconds-long test limit)
        timeout = datetime.timedelta(seconds=max(60.0, 1.05 * limit))
        store = attempt_store(timeout)  # under torchrun: this attempt's keys only (elastic_restart.py)
        where = {} if store is None else {"store": store, "rank": int(os.environ["RANK"]),
                                          "world_size": world_size_from_env()}
        dist.init_process_group(backend=backend, timeout=timeout, **where)
    if dist.get_world_size() > 1:
        watchdog.start(limit)
    groups = layout.build_groups()
    model_parallel_seed(train_cfg.seed, groups.tp_rank, groups.pp_rank, device)
    return groups, device


def shutdown():
    """Tear the groups down before exit: gloo's worker threads otherwise race the
    interpreter's teardown and can abort a finished run."""
    if dist.is_initialized():
        with watchdog.waiting("barrier (shutdown)"):
            dist.barrier()
        dist.destroy_process_group()
