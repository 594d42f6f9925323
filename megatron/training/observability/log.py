"""Megatron-style progress lines, TensorBoard scalars, and the start-up summary."""
import logging
import math
import sys
import time

import torch.distributed as dist

from ...core import fusions
from ...core.fp8.describe import describe as fp8_describe
from ...core.pipeline_parallel import ReducedLosses, default_schedule, loss_means, stage_layers
from ...core.transformer import context_parallel
from ...core.transformer.moe.describe import describe as moe_describe
from ..config import fsdp_flags as fsdp_options
from ..config import no_effect_flags as no_effect
from ..config.logging_flags import LoggingOptions
from ..loop import batch_schedule
from .flops import peak_tflops_per_gpu
from .scalar_writers import ScalarWriters, memory_scalars


def is_logging_rank():
    """The last rank prints iteration lines: it is on the last pipeline stage, where the loss is."""
    return dist.get_rank() == dist.get_world_size() - 1


def print_rank_0(msg):
    if dist.get_rank() == 0:
        print(msg, flush=True)


def print_rank_last(msg):
    if is_logging_rank():
        print(msg, flush=True)


def _fmt_time(seconds):
    seconds = int(max(seconds, 0))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class EvalProgress:
    """A progress line for an evaluation that runs long (a large --eval-iters): at most one every `every`
    seconds, so a short evaluation prints none (Megatron-LM's prints nothing unless verbose)."""

    def __init__(self, total, every=30.0, clock=time.monotonic):
        self.total, self.every, self.clock = total, every, clock
        self.start = self.last = clock()

    def after(self, done):
        """The line to print after `done` of `total` evaluation iterations, or None."""
        now = self.clock()
        if now - self.last < self.every or done >= self.total:
            return None
        self.last = now
        rate = done / max(now - self.start, 1e-9)
        return (f" evaluating: iteration {done:8d}/{self.total:8d} | {rate:.2f} iterations/s |"
                f" ETA {_fmt_time((self.total - done) / rate)} |")


class TrainingLogger:
    """Accumulates metrics between log lines; writes the text (last rank), the timers' report and the
    scalars (scalar_writers: TensorBoard and W&B) as Megatron-LM's training_log does."""

    def __init__(self, train_iters, writers=None, peak_tflops=None, options=None, timers=None):
        """writers: scalar_writers.ScalarWriters (None: no scalars); peak_tflops: this GPU's peak
        TFLOP/s (flops.peak_tflops_per_gpu; None: no MFU column); options: the logging flags
        (logging_options.LoggingOptions: the TrainingConfig; None: their defaults); timers: core.timers.Timers."""
        self.train_iters, self.peak_tflops = train_iters, peak_tflops
        self.writers = writers or ScalarWriters()
        self.options, self.timers = options or LoggingOptions(), timers
        self.start = time.perf_counter()
        self.interval_start = self.start
        self.iters_done, self.iters_in_interval = 0, 0
        self.losses, self.nan_iters = [], 0  # losses: per iteration (skipped ones too), {term: mean tensor}
        self.names = []  # the loss terms, known also when every iteration of an interval was skipped
        self.skipped, self.grad_norm, self.stats = 0, None, {}
        self.records = []  # per-iteration scalars (device tensors) held until the next log line's host sync

    def add_iteration(self, losses: ReducedLosses, grad_norm, updated, iteration=None, consumed=None, lr=None,
                      batch_size=None, loss_scale=1.0, stats=None, device=None):
        """Record one iteration's {term: (sum, count)} (train_step). The loss of a skipped one
        (fp16 overflow: its gradients overflowed, its loss is finite) enters the average too.
        With writers, every --tensorboard-log-interval-th iteration's scalars are kept for them:
        lr, batch_size, loss_scale, stats (step_stats: params norm, zeros) and the memory of `device`."""
        self.iters_in_interval += 1
        self.names = list(losses)
        means = loss_means(losses)
        self.losses.append(means)
        self.stats = stats or {}
        if updated:
            self.grad_norm = grad_norm
        else:
            self.skipped += 1
        o = self.options
        if not self.writers.active or iteration is None or iteration % o.tensorboard_log_interval:
            return
        scalars = {"learning-rate": lr, "batch-size": batch_size, **means}
        if o.log_loss_scale_to_tensorboard:
            scalars["loss-scale"] = loss_scale
        if o.log_world_size_to_tensorboard:
            scalars["world-size"] = dist.get_world_size() if dist.is_initialized() else 1
        if updated:
            scalars["grad-norm"] = grad_norm
        scalars.update(self.stats)
        memory = memory_scalars(device) if o.log_memory_to_tensorboard and device is not None else {}
        self.records.append((iteration, consumed, scalars, memory))

    def _write_records(self):
        for iteration, consumed, scalars, memory in self.records:  # the host sync of held tensors, here
            for name, value in scalars.items():
                if value is not None:
                    self.writers.add(name, value, iteration, consumed)
            for name, value in memory.items():
                self.writers.add(name, value, iteration)
        self.records = []

    def log(self, iteration, consumed, lr, global_batch, flops_per_iter, world_size, loss_scale=None):
        """Print one line averaging each loss term's per-iteration means over the interval, then
        the timers' report. Every rank calls it (the timers are gathered over the world)."""
        now = time.perf_counter()
        n = self.iters_in_interval
        per_iter = (now - self.interval_start) / max(n, 1)
        self.iters_done += n
        names = self.names
        # the host sync happens here only; an iteration is finite when all its terms are
        rows = [[float(x[k]) for k in names] for x in self.losses]
        finite = [r for r in rows if all(math.isfinite(v) for v in r)]
        self.nan_iters += len(rows) - len(finite)  # NaN losses only: a skipped fp16 step has a finite one
        means = {k: sum(r[i] for r in finite) / len(finite) if finite else float("nan")
                 for i, k in enumerate(names)}
        tflops = flops_per_iter / per_iter / world_size / 1e12
        eta = (now - self.start) / self.iters_done * (self.train_iters - iteration)
        gn = float(self.grad_norm) if self.grad_norm is not None else float("nan")
        o = self.options
        throughput = ""
        if o.log_throughput:
            mfu = f" MFU: {100 * tflops / self.peak_tflops:.1f}% |" if self.peak_tflops else ""
            throughput = f" throughput per GPU (TFLOP/s/GPU): {tflops:.1f} |{mfu}"
        scale = f" loss scale: {loss_scale:.1f} |" if loss_scale is not None else ""
        terms = "".join(f" {k}: {v:.6E} |" for k, v in means.items())
        stats = "".join(f" num zeros: {int(v)} |" if k == "num-zeros" else f" params norm: {float(v):.3f} |"
                        for k, v in sorted(self.stats.items()))
        print_rank_last(
            f" iteration {iteration:8d}/{self.train_iters:8d} | consumed samples: {consumed:12d} |"
            f" elapsed time per iteration (ms): {per_iter * 1000:.1f} |{throughput} learning rate: {lr:.6E} |"
            f" global batch size: {global_batch:5d} |{terms}{scale} grad norm: {gn:.3f} |{stats}"
            f" number of skipped iterations: {self.skipped:3d} | number of nan iterations: {self.nan_iters:3d} |"
            f" ETA {_fmt_time(eta)} |")
        self._write_records()
        self.writers.add("number of skipped iterations", self.skipped, iteration)
        if o.log_timers_to_tensorboard:
            self.writers.add("iteration-time", per_iter, iteration)
            if o.log_throughput:
                self.writers.add("throughput", tflops, iteration)
                if self.peak_tflops:
                    self.writers.add("mfu", tflops / self.peak_tflops, iteration)
        self._log_timers(iteration, n)
        self.writers.commit()
        self.losses, self.interval_start, self.iters_in_interval, self.skipped = [], time.perf_counter(), 0, 0

    def _log_timers(self, iteration, iterations):
        """The timers' report (min/max or every rank, per iteration of the interval) on the last rank's
        "megatron" logger; their max over the ranks as NAME-time with --log-timers-to-tensorboard."""
        if self.timers is None:
            return
        times = self.timers.gather(normalizer=max(iterations, 1))
        report = self.timers.report(times)
        if report and is_logging_rank():
            logging.getLogger("megatron").info(report)
        if self.options.log_timers_to_tensorboard:
            for name, per_rank in times.items():
                self.writers.add(f"{name}-time", max(per_rank), iteration)

    def reset_timer(self):
        self.interval_start = time.perf_counter()

    def log_validation(self, iteration, losses: dict[str, float], split=None, consumed=None):
        """losses: {term: mean loss} (training.evaluate). split: None during training; "validation"
        or "test" after it (Megatron-LM's "... on test set" line). consumed: the samples trained on."""
        self._write_records()  # W&B's steps only grow: this iteration's training scalars first
        line = f" validation loss at iteration {iteration}{f' on {split} set' if split else ''} |"
        for name, value in losses.items():
            line += f" {name} value: {value:.6E} |"
            self.writers.add(f"{name} {split or 'validation'}", value, iteration, consumed)
            if name == "lm loss":  # a perplexity means something for the token loss only
                # clamped against overflow as Megatron-LM does; a NaN (or inf) loss stays NaN (inf)
                ppl = math.exp(min(20.0, value)) if math.isfinite(value) else value
                line += f" {name} PPL: {ppl:.6E} |"
                if self.options.log_validation_ppl_to_tensorboard:
                    self.writers.add(f"{name} {split or 'validation'} ppl", ppl, iteration, consumed)
        self.writers.commit()
        print_rank_last("-" * len(line) + "\n" + line + "\n" + "-" * len(line))

    def close(self):
        self._write_records()
        self.writers.close()


def pipeline_summary(model_cfg, layout, schedule_flag=None):
    """One line: the schedule and which layers (numbered from 1) each stage's chunks hold (layout: the
    ParallelLayout)."""
    pp, vpp = layout.pp, layout.chunks
    split = [[stage_layers(model_cfg, layout, p, v) for v in range(vpp)] for p in range(pp)]
    stages = " | ".join(f"stage {p}: " + ", ".join(f"{o + 1}" if n == 1 else f"{o + 1}-{o + n}" for o, n in chunks)
                        for p, chunks in enumerate(split))
    name = schedule_flag or default_schedule(pp, vpp)
    where = "on stage 0 (a V: chunk 1 comes back)" if layout.v_shape else "on the last"
    return (f"> pipeline: {name}, {pp} stages x {vpp} model chunk(s); layers {stages}"
            f" (embedding on stage 0, output layer and loss {where})")


def _no_peak_reason(device):
    return "CPU" if device.type != "cuda" else "GPU not in the peak table"


def startup_summary(model, model_cfg, train_cfg, groups, device, tokenizer_name, memory):
    """Layout, parameters and bytes per rank, and which implementation each op uses (rank 0
    prints). memory: this rank's (parameter, gradient, optimizer-state) bytes."""
    count = sum(p.numel() for p in model.parameters())
    counts = [None] * dist.get_world_size()
    dist.all_gather_object(counts, (groups.tp_rank, groups.dp_rank, groups.pp_rank, count, memory))
    if dist.get_rank() != 0:
        return
    peak = peak_tflops_per_gpu(device, model_cfg.params_dtype, model_cfg.fp8_format is not None,
                               model_cfg.fp8_output_layer)
    lines = [
        "> parallel layout: " + groups.describe(),
        f"> sequence parallel: {model_cfg.sequence_parallel} | device: {device} | backend: {dist.get_backend()}",
        f"> model: {model_cfg.num_layers} layers, hidden {model_cfg.hidden_size}, {model_cfg.num_attention_heads} heads"
        f" ({model_cfg.num_query_groups} query groups), ffn {model_cfg.ffn_hidden_size}, seq {model_cfg.seq_length},"
        f" vocab {model_cfg.vocab_size} padded to {model_cfg.padded_vocab_size} ({tokenizer_name})",
        "> implementations: " + " | ".join(f"{op}={impl}" for op, impl in fusions.describe(model_cfg, device))
        + " | optimizer=torch.optim.AdamW (fused; clip coefficient inside the step)",
        f"> fused kernels (csrc): {fusions.kernels_status()}",
        *(f"> kernel choice: {op}={impl} ({why})" for op, impl, why in fusions.explain(model_cfg, device)),
        f"> activation recompute: {_recompute(model_cfg)}",
        f"> MFU: {peak[0] if peak else 'n/a (' + _no_peak_reason(device) + ')'}",
        f"> batch: micro {train_cfg.micro_batch_size} x DP {groups.dp_size} x accumulation "
        f"{train_cfg.global_batch_size // (train_cfg.micro_batch_size * groups.dp_size)}"
        f" = global {train_cfg.global_batch_size}" + batch_schedule.describe(train_cfg, model_cfg.seq_length),
        f"> precision: {'bf16' if train_cfg.bf16 else 'fp16' if train_cfg.fp16 else 'fp32'}"
        f" | DDP buckets: overlap grad reduce {train_cfg.overlap_grad_reduce}"
        f" | distributed optimizer {train_cfg.ddp_config().shards_optimizer}",
    ]
    lines += [x for x in (fp8_describe(model_cfg, device), fsdp_options.describe(train_cfg),
                          no_effect.line(model_cfg, train_cfg, device)) if x]
    if groups.pp_size > 1:
        lines.append(pipeline_summary(model_cfg, groups.layout, train_cfg.pipeline_schedule))
    if groups.cp_size > 1:
        lines.append(context_parallel_summary(model_cfg, train_cfg, groups))
    if model_cfg.num_experts:
        lines.append(moe_describe(model_cfg, groups.tp_size, groups.cp_size))
    lines.append("> parameters per rank (tp, dp, pp: count):")
    lines += [f"    rank {r:3d} (tp {t}, dp {d}, pp {p}): {n:,} | bytes: params {m[0]:,} grads {m[1]:,}"
              f" optimizer {m[2]:,} (total {sum(m) / 2**20:.1f} MiB)" for r, (t, d, p, n, m) in enumerate(counts)]
    print("\n".join(lines), flush=True)
    sys.stdout.flush()


def context_parallel_summary(model_cfg, train_cfg, groups):
    """One line: CP size and attention, tokens per rank, and the estimated saved activations per layer."""
    c, cp = model_cfg, groups.cp_size
    multiple = groups.layout.sequence_multiple
    padded = -(-c.seq_length // multiple) * multiple
    act = context_parallel.activation_bytes_per_layer(
        padded, train_cfg.micro_batch_size, c.hidden_size, c.num_attention_heads, groups.tp_size,
        c.sequence_parallel, cp, c.params_dtype.itemsize)
    return (f"> context parallel: CP {cp}, --cp-comm-type {c.cp_comm_type}, sequence {c.seq_length}"
            + (f" (padded to {padded} with loss-masked tokens)" if padded != c.seq_length else "")
            + f" -> {padded // cp} tokens per rank; saved activations about {act:,} bytes per layer per microbatch"
            " per rank")


def _recompute(model_cfg):
    if model_cfg.recompute_granularity == "full":
        return f"full, {model_cfg.recompute_method}, {model_cfg.recompute_num_layers} layer(s)"
    if model_cfg.recompute_granularity == "selective":
        return f"selective ({', '.join(model_cfg.recompute_modules or ['core_attn'])})"
    return model_cfg.recompute_granularity or "none"
