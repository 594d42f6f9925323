"""--log-metrics-jsonl (this project's flag): the run's figures at full precision, one JSON object
per line, for programs (the parity tests compare layouts with it) rather than people.

    {"type": "train", "iteration": 3, "consumed_samples": 24, "losses": {"lm loss": 6.90...},
     "grad_norm": 1.23..., "lr": 0.002, "skipped": false, "loss_scale": null}
    {"type": "validation", "iteration": 10, "losses": {"lm loss": 6.71...}}

Values are Python floats of the fp32 results (repr: exact); a non-finite one is written as NaN or
Infinity (Python's json reads them back); grad_norm is null for a skipped fp16 step. With
--log-params-norm / --log-num-zeros-in-grad the record has "params_norm" / "num_zeros" too. One rank
writes: the last pipeline stage's TP rank 0 and DP rank 0, which holds the losses. The file is
started afresh by a run from iteration 0 and appended to by a resumed one.
"""
import json

import torch
import torch.distributed as dist

from ...core.errors import ConfigError
from ...core.pipeline_parallel import ReducedLosses, loss_means


class MetricsLog:
    """Writes the JSON lines when path is given and this rank is the writer; otherwise a no-op."""

    def __init__(self, path, groups, resumed: bool, device):
        """Collective over the world group when path is given (every rank learns whether the
        writer could open the file, and all raise ConfigError alike if not)."""
        self.file = None
        if not path:
            return
        error = ""
        if groups.is_last_stage and groups.tp_rank == 0 and groups.dp_rank == 0 and groups.cp_rank == 0:
            try:
                self.file = open(path, "a" if resumed else "w", buffering=1)
            except OSError as e:
                error = e.strerror or str(e)
        failed = torch.tensor([float(bool(error))], device=device)
        if groups.world_size > 1:
            dist.all_reduce(failed, op=dist.ReduceOp.MAX)
        if failed.item():
            raise ConfigError(f"--log-metrics-jsonl {path}: cannot write it ({error or 'on the writing rank'}); "
                              "give a path in a writable directory")

    def _write(self, record):
        self.file.write(json.dumps(record) + "\n")

    def record(self, record):
        """One record of another kind (e.g. the flops profiler's), on the writer only."""
        if self.file is not None:
            self._write(record)

    def iteration(self, iteration, consumed, losses: ReducedLosses, grad_norm, lr, updated, loss_scale=None,
                  stats=None):
        """One training iteration: losses as train_step returns them, grad_norm a tensor or None;
        stats: step_stats' {"num-zeros": ..., "params-norm": ...}, written as num_zeros / params_norm."""
        if self.file is None:
            return
        self._write({"type": "train", "iteration": iteration, "consumed_samples": consumed,
                     "losses": {k: float(v) for k, v in loss_means(losses).items()},
                     "grad_norm": float(grad_norm) if grad_norm is not None else None,
                     "lr": float(lr), "skipped": not updated, "loss_scale": loss_scale,
                     **{k.replace("-", "_"): v.item() for k, v in (stats or {}).items()}})

    def validation(self, iteration, losses: dict[str, float], split=None):
        """One evaluation: {term: mean loss} (training.evaluate). split: None during training (type
        "validation"); "validation" or "test" for the evaluations after it (type "<split>_set")."""
        if self.file is not None:
            kind = "validation" if split is None else f"{split}_set"
            self._write({"type": kind, "iteration": iteration, "losses": dict(losses)})

    def close(self):
        if self.file is not None:
            self.file.close()
            self.file = None
