"""TensorBoard (--tensorboard-dir) and Weights & Biases (--wandb-project): the same scalars to both,
from the last rank, as Megatron-LM writes them.

TensorBoard gets each scalar at its iteration and, where Megatron-LM also plots it against the
consumed samples, as "NAME vs samples" at that count. W&B gets the scalars of each iteration in one
wandb.log(..., step=iteration) call (no "vs samples" copies). wandb is an optional extra: it is
imported only when --wandb-project is given (logging_options.check_logging refuses the flag without it).
"""
import dataclasses
import os
import resource

import torch
import torch.distributed as dist

from ...core.errors import ConfigError


class ScalarWriters:
    """The writers of this rank (TensorBoard, W&B, both or none: only the last rank has any)."""

    def __init__(self, tensorboard=None, wandb_run=None):
        self.tensorboard, self.wandb_run = tensorboard, wandb_run
        self._pending = {}  # W&B: {step: {name: value}} until commit()

    @property
    def active(self):
        return self.tensorboard is not None or self.wandb_run is not None

    def add(self, name, value, step, samples=None):
        """One scalar at iteration `step`; samples: the consumed samples then (TensorBoard's "vs samples")."""
        value = float(value)
        if self.tensorboard is not None:
            self.tensorboard.add_scalar(name, value, step)
            if samples is not None:
                self.tensorboard.add_scalar(f"{name} vs samples", value, samples)
        if self.wandb_run is not None:
            self._pending.setdefault(step, {})[name] = value

    def commit(self):
        """Send W&B the scalars added so far, one call per iteration in order (W&B's steps only grow)."""
        for step in sorted(self._pending):
            self.wandb_run.log(self._pending[step], step=step)
        self._pending = {}

    def close(self):
        if self.wandb_run is not None:
            self.commit()
            self.wandb_run.finish()
        if self.tensorboard is not None:
            self.tensorboard.close()
        self.tensorboard = self.wandb_run = None


def open_writers(train_cfg, model_cfg, is_writer, world_size):
    """The writers for this rank: TensorBoard and W&B where the flags ask and is_writer (the last
    rank). Collective over the world when --wandb-project is given: every rank raises the same
    ConfigError when W&B cannot start on the writer."""
    tensorboard = wandb_run = None
    if is_writer and train_cfg.tensorboard_dir:
        from torch.utils.tensorboard import SummaryWriter
        tensorboard = SummaryWriter(log_dir=train_cfg.tensorboard_dir, max_queue=train_cfg.tensorboard_queue_size)
    if not train_cfg.wandb_project:
        return ScalarWriters(tensorboard)
    error = [None]
    if is_writer:
        try:
            wandb_run = _start_wandb(train_cfg, model_cfg)
        except Exception as e:  # wandb's own errors (no API key online, a bad entity, ...) have no common base
            error[0] = f"{type(e).__name__}: {e}".splitlines()[0]
    if world_size > 1:
        dist.broadcast_object_list(error, src=world_size - 1)
    if error[0]:
        raise ConfigError(f"--wandb-project {train_cfg.wandb_project}: W&B did not start ({error[0]}); check the "
                          "W&B flags and login, or set WANDB_MODE=offline to write the run to --wandb-save-dir only")
    return ScalarWriters(tensorboard, wandb_run)


def _start_wandb(train_cfg, model_cfg):
    import wandb
    save_dir = train_cfg.wandb_save_dir or os.path.join(train_cfg.save, "wandb")
    os.makedirs(save_dir, exist_ok=True)
    config = {k: v if isinstance(v, (int, float, str, bool, list, type(None))) else str(v)
              for cfg in (model_cfg, train_cfg) for k, v in dataclasses.asdict(cfg).items()}
    kwargs = dict(dir=save_dir, name=train_cfg.wandb_exp_name, project=train_cfg.wandb_project, config=config)
    if train_cfg.wandb_entity:
        kwargs["entity"] = train_cfg.wandb_entity
    return wandb.init(**kwargs)


# torch.cuda.memory_stats() keys -> Megatron-LM's --log-memory-to-tensorboard names
CUDA_MEMORY = {"reserved_bytes.all.current": "mem-reserved-bytes", "allocated_bytes.all.current": "mem-allocated-bytes",
               "allocated_bytes.all.peak": "mem-max-allocated-bytes", "allocation.all.current": "mem-allocated-count"}


def memory_scalars(device, cuda_stats=None):
    """{name: value} of this rank's memory now: the CUDA allocator's statistics on a GPU (cuda_stats:
    torch.cuda.memory_stats(device) by default), else the process's resident set (current and peak).
    Host calls only: no device synchronisation."""
    if device.type == "cuda" or cuda_stats is not None:
        stats = torch.cuda.memory_stats(device) if cuda_stats is None else cuda_stats
        return {name: stats.get(key, 0) for key, name in CUDA_MEMORY.items()}
    if os.path.exists("/proc/self/status"):  # Linux: the resident set and its high-water mark, in kB
        with open("/proc/self/status") as f:
            kb = {k: int(v.split()[0]) for k, _, v in (line.partition(":") for line in f) if k in ("VmRSS", "VmHWM")}
        return {"mem-host-rss-bytes": kb["VmRSS"] * 1024, "mem-host-max-rss-bytes": kb["VmHWM"] * 1024}
    return {"mem-host-max-rss-bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}  # bytes on macOS
