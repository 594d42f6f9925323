"""--profile on the ranks of --profile-ranks (default all), as Megatron-LM does it.

With --use-pytorch-profiler: torch.profiler records iterations --profile-step-start to
--profile-step-end - 1 (one iteration of warm-up before them) and writes a Chrome trace that
Perfetto (ui.perfetto.dev) and chrome://tracing open, torch_profile/rank-R.json.gz beside the
TensorBoard folder (paths.profile_dir). Megatron-LM counts these steps from the start of the process;
here they are the iterations' own numbers, so a resumed run profiles the same iterations.

Without it: the CUDA profiler API's capture range for nsys (`nsys profile --capture-range=cudaProfilerApi`),
from the start of iteration start + 1 to the end of iteration end, Megatron-LM's range.
"""
import os

import torch

from ..config.output_paths import profile_dir


class StepProfiler:
    """Call before(i) at the start of iteration i, after(i) at its end, close() when training ends."""

    def __init__(self, cfg, rank, loaded_iteration, device):
        """cfg: the logging flags (TrainingConfig); loaded_iteration: the iteration this run resumes after."""
        self.cfg, self.rank, self.prof, self.nsys, self.capturing = cfg, rank, None, False, False
        if not cfg.profile or (cfg.profile_ranks and rank not in cfg.profile_ranks):
            return
        if not cfg.use_pytorch_profiler:
            self.nsys = True
            return
        first = max(cfg.profile_step_start, loaded_iteration + 1)
        if cfg.profile_step_end <= first:
            return  # the iterations to profile ran before this run resumed
        self.path = os.path.join(profile_dir(cfg.tensorboard_dir), f"rank-{rank}.json.gz")
        self.span = (first, cfg.profile_step_end - 1)
        activities = [torch.profiler.ProfilerActivity.CPU]
        if device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        # prof.step() at the start of iteration i makes it step i - loaded_iteration: wait until one step
        # before `first`, warm up for that one, record through end - 1, then hand the trace to _write
        self.prof = torch.profiler.profile(
            activities=activities, record_shapes=cfg.pytorch_profiler_collect_shapes,
            with_stack=cfg.pytorch_profiler_collect_callstack, on_trace_ready=self._write,
            schedule=torch.profiler.schedule(wait=first - loaded_iteration - 1, warmup=1,
                                             active=cfg.profile_step_end - first, repeat=1))
        self.prof.start()

    def _write(self, prof):
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        prof.export_chrome_trace(self.path)
        print(f"> rank {self.rank}: wrote the torch.profiler trace of iterations {self.span[0]}-{self.span[1]} "
              f"to {self.path}", flush=True)

    def before(self, iteration):
        if self.prof is not None:
            self.prof.step()
        elif self.nsys and iteration - 1 == self.cfg.profile_step_start:
            torch.cuda.check_error(torch.cuda.cudart().cudaProfilerStart())
            self.capturing = True

    def after(self, iteration):
        if iteration == self.cfg.profile_step_end:
            self.close()

    def close(self):
        """Stop: a trace still recording (training ended inside the window) is written now."""
        if self.prof is not None:
            self.prof.stop()
            self.prof = None
        if self.capturing:
            torch.cuda.check_error(torch.cuda.cudart().cudaProfilerStop())
            self.capturing = False


def describe(cfg):
    """The start-up line's words for --profile, or None without it."""
    if not cfg.profile:
        return None
    ranks = "all ranks" if not cfg.profile_ranks else "ranks " + ",".join(map(str, cfg.profile_ranks))
    if cfg.use_pytorch_profiler:
        return (f"torch.profiler, iterations {cfg.profile_step_start}-{cfg.profile_step_end - 1} on {ranks} -> "
                f"{profile_dir(cfg.tensorboard_dir)}")
    return f"nsys capture range (cudaProfilerStart/Stop), iterations {cfg.profile_step_start + 1}-" \
           f"{cfg.profile_step_end} on {ranks}"

