"""The global batch size as a function of the samples consumed: constant, Megatron-LM's step schedule
(--step-batch-size-schedule) or its older ramp (--rampup-batch-size).

Each iteration takes batch_size(consumed) samples, then consumed grows by that many; the learning-rate
schedule advances by the same number (it counts samples), as Megatron-LM's training loop does
(update_num_microbatches before the step, opt_param_scheduler.step(increment=batch) after it).

--step-batch-size-schedule "0:16 2.4B:320 ...": from THRESHOLD on, the batch is BS. Thresholds count
tokens and become samples by integer division by --seq-length (Megatron-Core's
StepBatchsizeNumMicroBatchesCalculator, seq_length given); K/M/B/T suffixes multiply by 1e3..1e12.
--train-samples with a schedule: iterations run while consumed < train-samples (the last batch whole).

--rampup-batch-size START INCREMENT SAMPLES (Megatron-LM before April 2026; main now ignores it): the
batch starts at START and grows by INCREMENT every SAMPLES / ((GBS - START) / INCREMENT) samples, then
stays at --global-batch-size once more than SAMPLES were consumed. --train-iters then comes from
--train-samples as Megatron-LM counted it: iterations while consumed <= SAMPLES (and <= train-samples),
then (train-samples - consumed) // GBS more.
"""
from ...core.errors import ConfigError

_SUFFIX = {"K": 10 ** 3, "M": 10 ** 6, "B": 10 ** 9, "T": 10 ** 12}


def _number(text):
    """'2.4B' -> 2400000000 (Megatron-Core's rule: int(float(digits) x suffix))."""
    text = text.strip().upper()
    scale = _SUFFIX.get(text[-1:], 1)
    digits = text[:-1] if text[-1:] in _SUFFIX else text
    try:
        return int(float(digits) * scale)
    except ValueError:
        raise ConfigError(f"--step-batch-size-schedule: {text!r} is not a number (suffixes K, M, B, T)") from None


class StepSchedule:
    """steps: [(first consumed sample, batch size)], thresholds increasing from 0."""

    def __init__(self, steps):
        self.steps = steps
        self.final = steps[-1][1]

    def batch_size(self, consumed):
        size = self.steps[0][1]
        for threshold, batch in self.steps:
            if consumed < threshold:
                break
            size = batch
        return size

    def sizes(self):
        return [batch for _, batch in self.steps]

    def train_iters(self, train_samples):
        iters = consumed = 0
        while consumed < train_samples:
            consumed += self.batch_size(consumed)
            iters += 1
        return iters


class Rampup:
    """Megatron-LM's RampupBatchsizeNumMicroBatchesCalculator, same float arithmetic."""

    def __init__(self, start, increment, samples, final):
        self.start, self.increment, self.samples, self.final = start, increment, samples, final
        self.per_increment = samples / ((final - start) // increment) if final > start else None

    def batch_size(self, consumed):
        if self.per_increment is None or consumed > self.samples:
            return self.final
        return self.start + int(consumed / self.per_increment) * self.increment

    def sizes(self):
        return list(range(self.start, self.final + 1, self.increment))

    def train_iters(self, train_samples):
        iters = consumed = 0
        while consumed <= self.samples and consumed <= train_samples:
            consumed += self.batch_size(consumed)
            iters += 1
        return iters + max(0, train_samples - consumed) // self.final


class Constant:
    def __init__(self, size):
        self.final = size

    def batch_size(self, consumed):
        return self.final

    def sizes(self):
        return [self.final]

    def train_iters(self, train_samples):
        return train_samples // self.final


def parse_steps(text, seq_length):
    """'0:16 2.4B:320' (commas also separate) -> StepSchedule in samples; ConfigError naming what is wrong."""
    steps = []
    for entry in str(text).replace(",", " ").split():
        if ":" not in entry:
            raise ConfigError(f"--step-batch-size-schedule entry {entry!r} is not THRESHOLD:BATCH_SIZE")
        threshold, batch = entry.split(":", 1)
        steps.append((_number(threshold) // seq_length, _number(batch)))
    steps.sort(key=lambda step: step[0])
    if not steps or steps[0][0] != 0:
        raise ConfigError("--step-batch-size-schedule must start at threshold 0 (e.g. '0:16 2.4B:320')")
    for (a, x), (b, y) in zip(steps, steps[1:]):
        if b <= a:
            raise ConfigError(f"--step-batch-size-schedule thresholds must increase ({a} then {b} samples, at "
                              f"--seq-length {seq_length})")
        if y < x:
            raise ConfigError(f"--step-batch-size-schedule batch sizes must not decrease ({x} then {y})")
    if any(batch < 1 for _, batch in steps):
        raise ConfigError("--step-batch-size-schedule batch sizes must be positive")
    return StepSchedule(steps)


def build(train_cfg, seq_length):
    """The batch-size schedule of the resolved train_cfg: StepSchedule, Rampup or Constant."""
    t = train_cfg
    if t.step_batch_size_schedule is not None:
        return parse_steps(t.step_batch_size_schedule, seq_length)
    if t.rampup_batch_size is not None:
        return Rampup(*t.rampup_batch_size, t.global_batch_size)
    return Constant(t.global_batch_size)


def resolve(train_cfg, seq_length, dp_size):
    """Fill --global-batch-size (a step schedule's last size; else micro batch x DP) and, with
    --train-samples, --train-iters as Megatron-LM counts them for the schedule. Raises ConfigError."""
    t = train_cfg
    if t.step_batch_size_schedule is not None and t.rampup_batch_size is not None:
        raise ConfigError("give --step-batch-size-schedule or --rampup-batch-size (its older form), not both")
    if t.step_batch_size_schedule is not None:
        final = parse_steps(t.step_batch_size_schedule, seq_length).final
        if t.global_batch_size not in (None, final):
            # Megatron-LM refuses --global-batch-size with a schedule; its own GPT-3 recipe gives the last size
            raise ConfigError(f"--global-batch-size {t.global_batch_size} differs from the last batch size of "
                              f"--step-batch-size-schedule ({final}); drop --global-batch-size")
        t.global_batch_size = final
    elif t.global_batch_size is None:
        t.global_batch_size = t.micro_batch_size * dp_size
    if t.rampup_batch_size is not None:
        _check_rampup(t)
    if t.train_samples is not None and t.train_iters is None:
        t.train_iters = build(t, seq_length).train_iters(t.train_samples)
        if t.train_iters < 1:
            raise ConfigError(f"--train-samples ({t.train_samples}) is less than one global batch "
                              f"({t.global_batch_size} samples)")


def _check_rampup(t):
    start, increment, samples = t.rampup_batch_size
    final = t.global_batch_size
    if start < 1 or increment < 1 or samples < 0:
        raise ConfigError("--rampup-batch-size START INCREMENT SAMPLES needs START, INCREMENT >= 1, SAMPLES >= 0")
    if t.train_samples is None:
        raise ConfigError("--rampup-batch-size counts samples: give --train-samples (and the --lr-*-samples "
                          "flags), as Megatron-LM requires")
    if final < start or (final - start) % increment:
        raise ConfigError(f"--rampup-batch-size: --global-batch-size ({final}) minus the start ({start}) must be "
                          f"a non-negative multiple of the increment ({increment})")


def check(train_cfg, seq_length, dp_size, pipeline_chunks=None):
    """Every batch size the schedule reaches splits into micro batches over DP (and, with the interleaved
    schedule, into a multiple of --pipeline-model-parallel-size micro batches). pipeline_chunks: (P, V)."""
    t = train_cfg
    if t.step_batch_size_schedule is None and t.rampup_batch_size is None:
        return
    per_step = t.micro_batch_size * dp_size
    for size in build(t, seq_length).sizes():
        if size % per_step:
            raise ConfigError(f"batch size {size} of the batch-size schedule is not divisible by --micro-batch-size "
                              f"({t.micro_batch_size}) x data-parallel size ({dp_size}) = {per_step}")
        if pipeline_chunks and (size // per_step) % pipeline_chunks[0]:
            raise ConfigError(f"batch size {size} of the batch-size schedule gives {size // per_step} micro "
                              "batches, not a multiple of --pipeline-model-parallel-size "
                              f"({pipeline_chunks[0]}) as the interleaved schedule needs")


def describe(train_cfg, seq_length):
    """' (after the batch-size schedule: ...)' for the start-up batch line, or '' with a constant batch."""
    schedule = build(train_cfg, seq_length)
    if isinstance(schedule, StepSchedule):
        steps = ", ".join(f"{b} from sample {s}" for s, b in schedule.steps)
        return f" after the step schedule ({steps}; --step-batch-size-schedule)"
    if isinstance(schedule, Rampup):
        return (f" after the ramp from {schedule.start} by {schedule.increment} over {schedule.samples} samples "
                "(--rampup-batch-size)")
    return ""
