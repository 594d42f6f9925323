"""Process-level switches of Megatron-LM's recipes, with its meanings (issue 31):

--manual-gc            Python's automatic garbage collector off for the run, a full collection at start-up,
                       every --manual-gc-interval iterations (0: never during training) and around each
                       evaluation (unless --no-manual-gc-eval: a full collection before, generation 0 after),
                       so that every rank collects at the same points (Megatron-LM's training loop).
--empty-unused-memory-level 1 | 2
                       torch.cuda.empty_cache() after each forward-backward and evaluation step (1), and also
                       after the optimizer step (2); nothing on a device without the CUDA allocator.
--disable-bf16-reduced-precision-matmul
                       with --bf16: torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
                       (what Megatron-Core's TransformerConfig sets).
"""
import gc

import torch


class ManualGC:
    """Garbage collection at fixed points (--manual-gc), or nothing. collector: the gc module (tests pass a fake)."""

    def __init__(self, train_cfg, collector=gc):
        self.on, self.interval, self.eval = train_cfg.manual_gc, train_cfg.manual_gc_interval, train_cfg.manual_gc_eval
        self.gc = collector

    def start(self):
        if self.on:
            self.gc.disable()
            self.gc.collect()

    def after_iteration(self, iteration):
        if self.on and self.interval and iteration % self.interval == 0:
            self.gc.collect()

    def before_evaluation(self):
        if self.on and self.eval:
            self.gc.collect()

    def after_evaluation(self):
        if self.on and self.eval:
            self.gc.collect(generation=0)

    def finish(self):
        """Automatic collection back on (the process may go on, e.g. a test or an embedding script)."""
        if self.on:
            self.gc.enable()


def empty_unused_memory(level, at_least, device, empty_cache=None):
    """torch.cuda.empty_cache() when --empty-unused-memory-level `level` >= `at_least` on a CUDA device."""
    if level >= at_least and device.type == "cuda":
        (empty_cache or torch.cuda.empty_cache)()


def set_matmul_precision(model_cfg, train_cfg, backends=torch.backends):
    """--disable-bf16-reduced-precision-matmul with --bf16: no reduced-precision reductions in bf16 GEMMs."""
    if model_cfg.disable_bf16_reduced_precision_matmul and train_cfg.bf16:
        backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
