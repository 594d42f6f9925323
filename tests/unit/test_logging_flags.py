"""The logging, timing, W&B and profiler flags (logging_flags.py): Megatron-LM's names and defaults,
the checks that refuse what cannot work before anything runs, the memory scalars, the log level."""
import dataclasses
import importlib.util
import logging
import types

import pytest
import torch

from megatron.core.config import ConfigError
from megatron.core.timers import Timers
from megatron.training.config import logging_flags as logging_options
from megatron.training.config.arguments import parse_args
from megatron.training.config.resolve import resolve, validate
from megatron.training.observability.observers import startup_line
from megatron.training.observability.scalar_writers import CUDA_MEMORY, ScalarWriters, memory_scalars

MOCK = ["--mock-data", "--vocab-size", "100", "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
        "--seq-length", "16", "--micro-batch-size", "2", "--train-iters", "10", "--lr", "1e-3"]

# Megatron-LM's LoggerConfig and ProfilingConfig (megatron/training/config/{training,common}_config.py)
MEGATRON = dict(log_throughput=False, log_params_norm=False, log_num_zeros_in_grad=False, timing_log_level=0,
                timing_log_option="minmax", barrier_with_l1_time=True, tensorboard_log_interval=1,
                tensorboard_queue_size=1000, log_timers_to_tensorboard=False, log_loss_scale_to_tensorboard=True,
                log_validation_ppl_to_tensorboard=False, log_memory_to_tensorboard=False,
                log_world_size_to_tensorboard=False, logging_level=None, wandb_project=None, wandb_exp_name=None,
                wandb_save_dir=None, wandb_entity=None, profile=False, use_pytorch_profiler=False,
                profile_step_start=10, profile_step_end=12, pytorch_profiler_collect_shapes=False,
                pytorch_profiler_collect_callstack=False)


def _cfgs(args, world_size=1):
    model_cfg, train_cfg = parse_args(MOCK + args)
    resolve(model_cfg, train_cfg, world_size, lambda c: types.SimpleNamespace(vocab_size=c.null_vocab_size + 1))
    validate(model_cfg, train_cfg, world_size)
    return train_cfg


def test_defaults_are_megatron_lms():
    got = dataclasses.asdict(parse_args([])[1])
    assert {k: got[k] for k in MEGATRON} == MEGATRON
    assert got["profile_ranks"] is None  # Megatron-LM's [] : every rank


def test_megatron_recipe_spellings_parse():
    t = _cfgs(["--log-throughput", "--log-params-norm", "--log-num-zeros-in-grad", "--timing-log-level", "2",
               "--timing-log-option", "all", "--no-barrier-with-level-1-timing", "--log-timers-to-tensorboard",
               "--log-memory-to-tensorboard", "--log-validation-ppl-to-tensorboard", "--logging-level", "30",
               "--no-log-loss-scale-to-tensorboard", "--tensorboard-log-interval", "5", "--tensorboard-dir", "tb",
               "--profile", "--use-pytorch-profiler", "--profile-step-start", "3", "--profile-step-end", "5",
               "--profile-ranks", "0", "3"], world_size=4)
    assert (t.timing_log_level, t.timing_log_option, t.barrier_with_l1_time, t.logging_level) == (2, "all", False, 30)
    assert (t.profile_ranks, t.log_loss_scale_to_tensorboard, t.tensorboard_log_interval) == ([0, 3], False, 5)


@pytest.mark.parametrize("args,match", [
    (["--timing-log-level", "3"], "--timing-log-level"),
    (["--timing-log-option", "mean"], "--timing-log-option"),
    (["--tensorboard-log-interval", "0"], "--tensorboard-log-interval"),
    (["--wandb-project", "p"], r"--wandb-project needs a directory .*--wandb-save-dir"),
    (["--profile", "--use-pytorch-profiler", "--tensorboard-dir", "tb", "--profile-step-start", "5",
      "--profile-step-end", "5"], r"--profile-step-end \(5\) must be larger than --profile-step-start \(5\)"),
    (["--profile", "--use-pytorch-profiler", "--tensorboard-dir", "tb", "--profile-ranks", "0", "4"],
     r"--profile-ranks 4: not a rank of this run's 4 \(0 to 3\)"),
    (["--profile", "--use-pytorch-profiler"], "--use-pytorch-profiler writes its trace .*--tensorboard-dir"),
])
def test_what_cannot_work_is_refused_before_the_run(args, match):
    with pytest.raises(ConfigError, match=match):
        _cfgs(args, world_size=4)


def test_wandb_project_without_wandb_names_the_extra(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(ConfigError, match=r"needs the wandb package.*pip install -e '\.\[wandb\]'"):
        _cfgs(["--wandb-project", "p", "--wandb-save-dir", "w"])


def test_nsys_profiling_needs_a_gpu():
    t = parse_args(MOCK + ["--profile"])[1]
    with pytest.raises(ConfigError, match="CUDA profiler API, which needs a GPU; add --use-pytorch-profiler"):
        logging_options.check_logging(t, 1, cuda=False)
    logging_options.check_logging(t, 1, cuda=True)


def test_cuda_memory_scalars_are_megatrons_names_and_host_memory_on_cpu():
    stats = {"reserved_bytes.all.current": 4096, "allocated_bytes.all.current": 1024,
             "allocated_bytes.all.peak": 2048, "allocation.all.current": 7, "unrelated": 1}
    assert memory_scalars(torch.device("cpu"), cuda_stats=stats) == {
        "mem-reserved-bytes": 4096, "mem-allocated-bytes": 1024, "mem-max-allocated-bytes": 2048,
        "mem-allocated-count": 7}
    assert sorted(CUDA_MEMORY.values()) == ["mem-allocated-bytes", "mem-allocated-count", "mem-max-allocated-bytes",
                                            "mem-reserved-bytes"]
    host = memory_scalars(torch.device("cpu"))
    # 64 MiB, touched: above glibc's largest mmap threshold (32 MiB), so fresh pages, never a reused heap block
    big = torch.ones(64 * 2**20, dtype=torch.uint8)
    assert memory_scalars(torch.device("cpu"))["mem-host-rss-bytes"] >= host["mem-host-rss-bytes"] + 60 * 2**20
    assert host["mem-host-max-rss-bytes"] >= host["mem-host-rss-bytes"] > 0
    del big


def test_logging_level_from_the_flag_else_the_environment(monkeypatch):
    root = logging.getLogger().level
    try:
        monkeypatch.setenv("MEGATRON_LOGGING_LEVEL", "30")
        assert logging_options.configure_logging().getEffectiveLevel() == 30
        assert logging_options.configure_logging(10).getEffectiveLevel() == 10
        monkeypatch.delenv("MEGATRON_LOGGING_LEVEL")
        assert logging_options.configure_logging().getEffectiveLevel() == logging.INFO
    finally:
        logging.getLogger().setLevel(root)


def test_writers_add_vs_samples_to_tensorboard_and_one_wandb_call_per_step():
    added, logged = [], []
    writers = ScalarWriters(types.SimpleNamespace(add_scalar=lambda *a: added.append(a)),
                            types.SimpleNamespace(log=lambda d, step: logged.append((step, d))))
    writers.add("lm loss", torch.tensor(2.5), 3, samples=24)
    writers.add("grad-norm", 1.5, 3)
    writers.add("lm loss", 2.0, 4, samples=32)
    writers.commit()
    assert added == [("lm loss", 2.5, 3), ("lm loss vs samples", 2.5, 24), ("grad-norm", 1.5, 3),
                     ("lm loss", 2.0, 4), ("lm loss vs samples", 2.0, 32)]
    assert logged == [(3, {"lm loss": 2.5, "grad-norm": 1.5}), (4, {"lm loss": 2.0})]


def test_startup_line_names_what_is_logged_and_where():
    t = _cfgs(["--timing-log-level", "1", "--log-throughput", "--tensorboard-dir", "tb", "--log-memory-to-tensorboard",
               "--use-pytorch-profiler"])
    line = startup_line(t)
    assert line.startswith("> logging: timers level 1 (minmax, barrier at level 1) | in the iteration line: throughput")
    assert "TensorBoard tb every 1 iteration(s) with memory" in line
    assert "--use-pytorch-profiler has no effect without --profile" in line


def _logged(monkeypatch, capsys, args):
    """(iteration lines, {tag: steps}) of a TrainingLogger over 2 iterations and a validation, with the
    flags in args (one process, recording writers)."""
    from megatron.training.observability import log
    monkeypatch.setattr(log, "is_logging_rank", lambda: True)
    added = []
    writers = ScalarWriters(types.SimpleNamespace(add_scalar=lambda tag, v, step: added.append((tag, step))))
    t = _cfgs(args)
    logger = log.TrainingLogger(2, writers, 100.0, t, Timers(t.timing_log_level))
    for it in (1, 2):
        logger.add_iteration({"lm loss": (torch.tensor(2.0), torch.tensor(1.0))}, torch.tensor(1.0), True, it,
                             8 * it, 1e-3, 8, 1.0, {}, torch.device("cpu"))
    logger.log(2, 16, 1e-3, 8, flops_per_iter=1e12, world_size=1)
    logger.log_validation(2, {"lm loss": 2.0}, consumed=16)
    tags = {}
    for tag, step in added:
        tags.setdefault(tag, []).append(step)
    return capsys.readouterr().out, tags


def test_by_default_only_megatrons_default_scalars(monkeypatch, capsys):
    out, tags = _logged(monkeypatch, capsys, [])
    assert "TFLOP/s/GPU" not in out and "MFU" not in out and "time across ranks" not in out
    assert {t for t in tags if not t.endswith(" vs samples")} == {
        "learning-rate", "batch-size", "lm loss", "loss-scale", "grad-norm", "number of skipped iterations",
        "lm loss validation"}
    assert tags["lm loss"] == [1, 2] and tags["lm loss vs samples"] == [8, 16]  # every iteration, and per sample


def test_each_flag_adds_its_scalars(monkeypatch, capsys):
    out, tags = _logged(monkeypatch, capsys, ["--log-throughput", "--log-timers-to-tensorboard", "--timing-log-level",
                                              "1", "--log-memory-to-tensorboard", "--log-validation-ppl-to-tensorboard",
                                              "--log-world-size-to-tensorboard", "--no-log-loss-scale-to-tensorboard",
                                              "--tensorboard-log-interval", "2"])
    assert "| throughput per GPU (TFLOP/s/GPU): " in out and "| MFU: " in out
    assert tags["iteration-time"] == tags["throughput"] == tags["mfu"] == [2]
    assert tags["mem-host-rss-bytes"] == tags["world-size"] == tags["lm loss"] == [2]  # every 2nd iteration
    assert tags["lm loss validation ppl"] == [2] and "loss-scale" not in tags


def test_the_timers_report_is_logged_at_info(monkeypatch, capsys):
    from megatron.training.observability import log
    monkeypatch.setattr(log, "is_logging_rank", lambda: True)
    monkeypatch.delenv("MEGATRON_LOGGING_LEVEL", raising=False)
    root = logging.getLogger().level
    try:
        for level, shown in ((None, True), (30, False)):
            timers = Timers(1)
            logger = log.TrainingLogger(1, options=_cfgs([]), timers=timers)
            logging_options.configure_logging(level)
            with timers("optimizer", 1):
                pass
            logger.add_iteration({"lm loss": (torch.tensor(2.0), torch.tensor(1.0))}, torch.tensor(1.0), True)
            logger.log(1, 8, 1e-3, 8, flops_per_iter=1e12, world_size=1)
            out = capsys.readouterr().out
            assert ("(min, max) time across ranks (ms):\n    optimizer ...." in out) == shown, level
    finally:
        logging.getLogger().setLevel(root)
