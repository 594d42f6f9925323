"""--rerun-mode and --check-for-spiky-loss (Megatron-Core's rerun state machine, its flags and defaults; issue 41,
item 5): an iteration whose gradients or loss are not finite, or whose loss spikes, is re-run once from the
same state before the optimizer step, and the two runs tell a faulty device from the data or the model.

    validate_results (default)  after the forward-backward, before the gradients are reduced: every rank checks
                                its own gradients (so the rank is named) and the last stage the loss; one
                                all-reduce over the world. On a finding every rank re-runs the forward-backward
                                of the same batches from the same RNG states:
                                - the finding again (reproducible): the data or the model. A NaN goes on to the
                                  step and the NaN check stops the run there as before (nan_check.py, exit 17);
                                  a spike is one warning line and training goes on (Megatron-LM: not fatal);
                                - gone (not reproducible): a faulty device. The run stops before the step, nothing
                                  of the iteration applied or saved, with one line naming the rank and its host,
                                  exit code 16 (Megatron-LM's "resume to disambiguate": on another device).
    report_stats                every iteration is re-run once; the losses of the two runs are compared and the
                                count reproduced bitwise and the largest relative difference are logged at the end.
    disabled                    no check, no re-run.

The NaN check is part of --check-for-nan-in-loss-and-grad (Megatron-LM's rule); fp16 gradients are not checked
(an overflow there is the loss scaler's). Spike: the loss above 10x the largest of the last 100 iterations'
(Megatron-LM's SPIKY_LOSS_FACTOR). Injected faults (core/debug.py): `train.grads` in the first run,
`train.grads.rerun` in the re-run, action nan: this rank's gradients turned into NaN.
"""
import math
import socket

import torch
import torch.distributed as dist

from ...core.debug import fault_point
from ...core.tensor_parallel.random import get_rng_tracker
from ..observability.log import print_rank_0
from .nan_check import NonFiniteError

SPIKY_LOSS_FACTOR, SPIKE_WINDOW = 10.0, 100
EXIT_DEVICE_FAULT = 16  # Megatron-LM's EXIT_CODE_RESUME_TO_DISAMBIGUATE


class DeviceFaultError(NonFiniteError):
    """A finding the re-run did not reproduce; every rank raises it at the same iteration."""

    exit_code = EXIT_DEVICE_FAULT


class RerunCheck:
    def __init__(self, train_cfg, model_cfg, groups, ddp, device):
        self.mode, self.groups, self.ddp, self.device = train_cfg.rerun_mode, groups, ddp, device
        self.nan = train_cfg.check_for_nan_in_loss_and_grad
        self.spiky = train_cfg.check_for_spiky_loss
        # gradients are read before their reduction; an fp16 overflow is the loss scaler's, and sharded gradients
        # reduced during the backward are gone by then
        self.grads = self.nan and not train_cfg.fp16 and not (ddp.config.shards_grads and ddp.overlap_grad_reduce)
        self.history, self.reruns, self.exact, self.max_rel = [], 0, 0, 0.0

    @classmethod
    def of(cls, train_cfg, model_cfg, groups, ddp, device):
        """The run's check (its start-up line printed), or None when it has nothing to do."""
        check = cls(train_cfg, model_cfg, groups, ddp, device)
        if check.mode == "disabled" or (check.mode == "validate_results" and not (check.nan or check.spiky)):
            return None
        what = [w for w, on in (("non-finite gradients (per rank) and loss", check.nan),
                                (f"a loss over {SPIKY_LOSS_FACTOR:g}x the last {SPIKE_WINDOW} iterations'",
                                 check.spiky)) if on]
        print_rank_0(f"> rerun check (--rerun-mode {check.mode}): " + (
            "every iteration re-run once, the losses compared" if check.mode == "report_stats" else
            " and ".join(what) + " re-run the iteration once from the same state: reproducible means the data or "
            "the model, not reproducible a faulty device (exit code 16)"))
        return check

    def _snapshot(self):
        cuda = torch.cuda.get_rng_state(self.device) if self.device.type == "cuda" else None
        return torch.get_rng_state(), get_rng_tracker().get_states(), cuda

    def _restore(self, snap):
        torch.set_rng_state(snap[0])
        get_rng_tracker().set_states(snap[1])
        if snap[2] is not None:
            torch.cuda.set_rng_state(snap[2], self.device)

    def _loss(self, losses):
        """The loss (the terms' means added) as a 0-dim tensor on the last stage, else None: no host read."""
        if not (self.groups.is_last_stage and losses):
            return None
        return torch.stack([total / count for total, count in losses.values()]).sum()

    def _findings(self, iteration, losses, point, params):
        """One all-reduce (world) and one host read: -> (ranks with non-finite gradients, loss non-finite, loss
        spiky, the loss as a float (only where --check-for-spiky-loss or report_stats need it, else None))."""
        if fault_point(point, iteration, self.groups.rank) == "nan":  # a drill: this rank's gradients
            self.ddp.main_grad(next(p for p in params if p.requires_grad)).fill_(math.nan)
        world, rank = self.groups.world_size, self.groups.rank
        flags = torch.zeros(world + 2, device=self.device)
        if self.grads:
            bad = [~torch.isfinite(self.ddp.main_grad(p)).all() for p in params if p.requires_grad]
            if bad:
                flags[rank] = torch.stack(bad).any().float()
        loss = self._loss(losses)
        if loss is not None:
            if self.nan:
                flags[world] = (~torch.isfinite(loss)).float()
            if self.spiky and self.history:
                flags[world + 1] = (torch.isfinite(loss) & (loss > SPIKY_LOSS_FACTOR * max(self.history))).float()
        if world > 1:
            dist.all_reduce(flags)
        values = flags.tolist()
        needs = self.spiky or self.mode == "report_stats"
        value = float(loss) if loss is not None and needs else None
        return [r for r in range(world) if values[r] > 0], values[world] > 0, values[world + 1] > 0, value

    def validate(self, iteration, losses, rerun):
        """After the forward-backward of `iteration` (collective). rerun() runs it again (the DDP step restarted)
        -> its losses. Returns the losses to go on with; raises DeviceFaultError for a finding not reproduced."""
        snap, params = self._snapshot_before, list(self.ddp.module.parameters())
        first = self._findings(iteration, losses, "train.grads", params)
        found = bool(first[0]) or first[1] or first[2]
        if self.mode == "validate_results" and not found:
            self._remember(first[3])
            return losses
        self._restore(snap)
        again_losses = rerun()
        again = self._findings(iteration, again_losses, "train.grads.rerun", params)
        if self.mode == "report_stats":
            self._compare(first[3], again[3])
        if found and not (again[0] or again[1] or again[2]):
            self._device_fault(iteration, first)
        if again[2]:
            print_rank_0(f"> warning: iteration {iteration}: loss {again[3]} spikes over {SPIKY_LOSS_FACTOR:g}x the "
                         "last iterations' and the re-run from the same state reproduces it: the data or the model, "
                         "not a device (--check-for-spiky-loss); training goes on")
        self._remember(again[3])
        return again_losses

    def before(self):
        """Before the forward-backward: the RNG states a re-run starts from."""
        self._snapshot_before = self._snapshot()

    def _remember(self, loss):
        if loss is not None and math.isfinite(loss):
            self.history = (self.history + [loss])[-SPIKE_WINDOW:]

    def _compare(self, a, b):
        self.reruns += 1
        if a is None or b is None:
            return
        self.exact += a == b
        if math.isfinite(a) and math.isfinite(b):
            self.max_rel = max(self.max_rel, abs(a - b) / max(abs(a), 1e-30))

    def _device_fault(self, iteration, first):
        hosts = [None] * self.groups.world_size
        dist.all_gather_object(hosts, socket.gethostname())
        if first[0]:
            who = ", ".join(f"rank {r} (host {hosts[r]})" for r in first[0])
            what = f"{who} computed non-finite gradients"
        else:
            what = f"the loss was {'not finite' if first[1] else f'a spike ({first[3]})'} on the last pipeline stage"
        raise DeviceFaultError(
            f"iteration {iteration}: {what}, but the iteration re-run from the same state did not: not reproducible, "
            f"so a faulty device is suspected (silent data corruption); nothing of this iteration was applied or "
            f"saved; resume from the last checkpoint on other devices (--rerun-mode validate_results, exit code 16)",
            first[0][0] if first[0] else 0)

    def summary(self):
        """report_stats' end-of-run line, or None."""
        g = self.groups
        writer = g.is_last_stage and g.tp_rank == 0 and g.dp_rank == 0 and g.cp_rank == 0
        if self.mode != "report_stats" or not writer:
            return None
        return (f"> rerun stats (--rerun-mode report_stats): {self.reruns} iterations re-run, the loss reproduced "
                f"bitwise in {self.exact}, largest relative difference {self.max_rel:.3e}")


def run_checked(check, iteration, forward_backward, restart):
    """forward_backward() -> losses, validated by `check` (a RerunCheck, or None: no check); restart() makes the
    step's gradient and router-loss accounting start afresh before a re-run."""
    if check is None:
        return forward_backward()
    check.before()
    return check.validate(iteration, forward_backward(), lambda: (restart(), forward_backward())[-1])
