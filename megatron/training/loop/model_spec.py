"""What pretrain() needs to know about a model: how to build a chunk, run a microbatch, and
which losses that run returns (torchtitan's ModelSpec, cut to what this trainer uses)."""
import dataclasses
from collections.abc import Callable

from ...core.pipeline_parallel.losses import TOKEN_LOSS, LossDeclaration


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """model_provider(config, groups, device, pre_process, post_process, vp_stage) -> one model
    chunk: the embedding where pre_process, the output layer and loss where post_process.
    forward_step(chunk, batch) -> pipeline_parallel.LossTerms on the last pipeline stage,
    the hidden states [s(/TP), b, h] to send on elsewhere.
    loss_terms: the terms forward_step returns, {name: batch key of its mask or None}.
    collate(samples, device) -> batch dict (None: GPT's tokens / labels / loss_mask, training/data/loader.py).
    """
    model_provider: Callable
    forward_step: Callable
    loss_terms: LossDeclaration = dataclasses.field(default_factory=lambda: dict(TOKEN_LOSS))
    collate: Callable | None = None
