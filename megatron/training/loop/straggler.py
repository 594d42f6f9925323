"""--log-straggler (Megatron-Core's straggler detector flags; issue 41, item 5): every --log-interval iterations
the logging rank prints the slowest and the fastest ranks' step times and their ratio.

What is timed: each rank's forward-backward (the schedule's microbatches) in the CPU time of its main thread
(time.thread_time), averaged over the interval. A rank blocked in a collective or a pipeline receive waits on
a condition, which costs no CPU time, so a rank that waits for a slow peer does not look slow itself, whatever
the layout (wall time would not do: every rank of a group waits for its slowest, and all look alike). On a CUDA
device this is the host's share (launches, Python); device-side slowness shows only where the host waits for
the device. One all-gather of two numbers per rank per interval (the host names once). Megatron-LM's run-time
toggle server (--straggler-ctrlr-port) is not built; with --disable-straggler-on-startup there is then no report.
"""
import socket
import time

import torch.distributed as dist

from ...core.debug import fault_point
from ..observability.log import print_rank_last


class StragglerReport:
    def __init__(self, train_cfg, groups):
        self.count, self.groups = train_cfg.straggler_minmax_count, groups
        self.total, self.steps, self.first = 0.0, 0, None
        self.hosts = [None] * groups.world_size
        dist.all_gather_object(self.hosts, socket.gethostname())

    @classmethod
    def of(cls, train_cfg, groups):
        """The run's report (its start-up line printed), or None without --log-straggler."""
        if not train_cfg.log_straggler or train_cfg.disable_straggler_on_startup:
            return None
        print_rank_last(f"> straggler report (--log-straggler): every {train_cfg.log_interval} iterations, each "
                        f"rank's forward-backward CPU time, the {train_cfg.straggler_minmax_count} slowest and fastest "
                        "ranks and their ratio")
        return cls(train_cfg, groups)

    def timed(self, forward_backward, iteration):
        """forward_backward, its time on this rank recorded (fault point `train.forward_backward` first: a drill's
        `slow` action delays this rank)."""
        def run(*args, **kwargs):
            start = time.thread_time()
            fault_point("train.forward_backward", iteration, self.groups.rank)
            try:
                return forward_backward(*args, **kwargs)
            finally:
                self.total += time.thread_time() - start
                self.steps += 1
                self.first = self.first or iteration
        return run

    def report(self, iteration):
        """Collective (every rank, at each log line): the interval's line on the logging rank."""
        mine = [self.total / max(self.steps, 1), float(self.steps)]
        every = [None] * self.groups.world_size
        dist.all_gather_object(every, mine)
        first, self.total, self.steps, self.first = self.first, 0.0, 0, None
        order = sorted(range(len(every)), key=lambda r: every[r][0], reverse=True)

        def name(ranks):
            return ", ".join(f"rank {r} ({self.hosts[r]}) {every[r][0] * 1e3:.1f} ms" for r in ranks)

        slow, fast = every[order[0]][0], every[order[-1]][0]
        ratio = slow / fast if fast > 0 else float("inf")
        print_rank_last(f" straggler report, iterations {first}-{iteration}: forward-backward CPU time per iteration: "
                        f"slowest {name(order[:self.count])}; fastest {name(order[::-1][:self.count])}; "
                        f"slowest / fastest {ratio:.2f}")
