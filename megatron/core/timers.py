"""Per-phase wall-clock timers: Megatron-LM's --timing-log-level, --timing-log-option and
--no-barrier-with-level-1-timing, with its timer names.

Each timer has a level. Level 1 marks phases that run about once per iteration (forward-backward,
the gradient reductions, the optimizer and its parts), level 2 phases that run per microbatch
(batch generation, forward and backward compute, pipeline sends and receives). A timer above the
configured level is one shared no-op object: no clock read, no device synchronisation, so the
default level 0 costs nothing per iteration. An enabled timer synchronises the device at its start
and stop, so that it measures the phase and not the launch of its kernels; a level-1 timer also
waits at its start for every rank (a barrier over the world), unless barrier_with_l1 is off.

Code that may run without timers takes `timers=None` and asks phase(timers, name, level).
"""
import time

import torch
import torch.distributed as dist

LEVELS = (0, 1, 2)
OPTIONS = ("max", "minmax", "all")
# what each level reports, in Megatron-LM's order (its training_log's lists)
LEVEL_NAMES = {
    1: ("forward-backward", "layernorm-grads-all-reduce", "embedding-grads-all-reduce", "all-grads-sync",
        "params-all-gather", "optimizer-copy-to-main-grad", "optimizer-unscale-and-check-inf",
        "optimizer-clip-main-grad", "optimizer-count-zeros", "optimizer-inner-step",
        "optimizer-copy-main-to-model-params", "optimizer"),
    2: ("batch-generator", "forward-compute", "backward-compute", "forward-recv", "forward-send", "backward-recv",
        "backward-send", "forward-send-forward-recv", "forward-send-backward-recv", "backward-send-forward-recv",
        "backward-send-backward-recv", "forward-backward-send-forward-backward-recv"),
}


class _NullTimer:
    """A disabled timer: every call does nothing."""

    def start(self):
        pass

    def stop(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


NULL_TIMER = _NullTimer()


class Timer:
    """Accumulates seconds between start() and stop() (also as a context manager)."""

    def __init__(self, sync, barrier):
        self.elapsed, self._sync, self._barrier, self._t0 = 0.0, sync, barrier, None

    def start(self):
        if self._barrier:
            dist.barrier()
        self._sync()
        self._t0 = time.perf_counter()

    def stop(self):
        self._sync()
        self.elapsed += time.perf_counter() - self._t0

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()
        return False


class Timers:
    """The run's timers up to log_level; timers(name, level) is the timer (NULL_TIMER above the level).

    log_option: how log() reports each timer over the ranks: "max", "minmax" or "all" (every rank).
    device: whose queue an enabled timer synchronises (CUDA only; CPU work is synchronous).
    """

    def __init__(self, log_level=0, log_option="minmax", device=None, barrier_with_l1=True):
        if log_level not in LEVELS or log_option not in OPTIONS:
            raise ValueError(f"timing level {log_level} / option {log_option!r}: levels {LEVELS}, options {OPTIONS}")
        self.log_level, self.log_option = log_level, log_option
        self.barrier_with_l1 = barrier_with_l1
        on_cuda = device is not None and torch.device(device).type == "cuda"
        self._sync = (lambda: torch.cuda.synchronize(device)) if on_cuda else (lambda: None)
        self._device = device if on_cuda else torch.device("cpu")
        self._timers = {}

    def __call__(self, name, log_level):
        if log_level > self.log_level:
            return NULL_TIMER
        timer = self._timers.get(name)
        if timer is None:
            barrier = log_level == 1 and self.barrier_with_l1 and dist.is_initialized() and dist.get_world_size() > 1
            timer = self._timers[name] = Timer(self._sync, barrier)
        return timer

    def names(self):
        """The timers log() reports at this level: Megatron-LM's lists, then any other enabled timer."""
        fixed = [n for level in range(1, self.log_level + 1) for n in LEVEL_NAMES[level]]
        return fixed + sorted(set(self._timers) - set(fixed))

    def gather(self, normalizer=1.0, reset=True):
        """{name: [milliseconds on rank r for r in ranks]} per timer that ran on some rank, each
        divided by normalizer (the iterations of the interval). Collective over the world, when the
        level reports timers (every rank calls it with the same level); {} at level 0."""
        names = self.names()
        if not names:
            return {}
        local = torch.tensor([self._timers[n].elapsed if n in self._timers else 0.0 for n in names],
                             dtype=torch.float64, device=self._device)
        if reset:
            for timer in self._timers.values():
                timer.elapsed = 0.0
        world = dist.get_world_size() if dist.is_initialized() else 1
        rows = [torch.empty_like(local) for _ in range(world)]
        if world > 1:
            dist.all_gather(rows, local)
        else:
            rows = [local]
        table = torch.stack(rows).cpu() * (1000.0 / normalizer)
        return {n: table[:, i].tolist() for i, n in enumerate(names) if (table[:, i] > 0).any()}

    def report(self, times):
        """The text Megatron-LM prints for gather()'s result under log_option; None when empty."""
        if not times:
            return None
        if self.log_option == "all":
            lines = ["times across ranks (ms):"]
            for name, per_rank in times.items():
                lines.append(f"  {name}:")
                lines += [f"     rank {r:2d}: {t:.2f}" for r, t in enumerate(per_rank) if t > 0]
            return "\n".join(lines)
        ran = {name: [t for t in per_rank if t > 0] for name, per_rank in times.items()}
        if self.log_option == "max":
            return "\n".join(["max time across ranks (ms):"] +
                             [f"    {(name + ' ').ljust(48, '.')}: {max(ts):.2f}" for name, ts in ran.items()])
        return "\n".join(["(min, max) time across ranks (ms):"] +
                         [f"    {(name + ' ').ljust(48, '.')}: ({min(ts):.2f}, {max(ts):.2f})"
                          for name, ts in ran.items()])


def phase(timers, name, log_level):
    """timers(name, log_level), or the no-op timer when there are no timers."""
    return NULL_TIMER if timers is None else timers(name, log_level)
