"""The loss contract between forward_step, the pipeline executor and the training loop.

A model's losses are named terms. The script declares them once (LossDeclaration), its
forward_step returns them on the last pipeline stage (LossTerms), and forward_backward
hands back each term's masked sum and count over the global batch (ReducedLosses); the
caller divides (loss_means). For backward each term is averaged over its own global count
(--calculate-per-token-loss) or, as Megatron-LM by default, over each microbatch's count and then
over the microbatches (loss_divisors); the averages are summed, so adding a term (BERT's sentence-order loss, an MoE
auxiliary loss) needs a new entry in the declaration and in forward_step's result only.
"""
from collections.abc import Mapping, Sequence

import torch
import torch.distributed as dist

from ..watchdog import waiting

LossDeclaration = Mapping[str, str | None]
"""{term name: batch key of its mask [b, ...], or None to count one per sample}, in logging order."""

LossTerms = dict[str, tuple[torch.Tensor, torch.Tensor]]
"""forward_step's result on the last pipeline stage: {term name: (per-element losses, mask)},
the two of one shape (per token [b, s], per sample [b]); mask is 1 where the element counts."""

ReducedLosses = dict[str, tuple[torch.Tensor, torch.Tensor]]
"""forward_backward's result: {term name: (sum of loss x mask, count)}, fp32 scalars over the
global batch (all microbatches, all DP ranks). The sum is 0 off the last pipeline stage."""

TOKEN_LOSS: LossDeclaration = {"lm loss": "loss_mask"}
"""A language model's one term: the per-token loss over the batch's loss_mask."""


def _local_counts(batches, declared):
    """[microbatches, terms] fp32: the elements each term counts in each of this rank's microbatches."""
    def count(batch, key):
        if key is not None:
            return batch[key].float().sum()
        return torch.tensor(float(batch["tokens"].shape[0]), device=batch["tokens"].device)
    return torch.stack([torch.stack([count(b, key) for key in declared.values()]) for b in batches])


def loss_divisors(batches: Sequence[dict], groups, declared: LossDeclaration, per_token: bool) -> torch.Tensor:
    """What each microbatch's masked loss sum is divided by before backward.

    per_token (--calculate-per-token-loss): each term's count over the whole global batch ([terms],
    global_counts): the gradient is that of the mean over all its elements. Otherwise Megatron-LM's
    default: the microbatch's own count (summed over the CP ranks that hold its parts) times the number
    of microbatches in the global batch ([microbatches, terms]): the gradient is that of the mean over
    microbatches of each microbatch's mean. A microbatch that counts nothing adds nothing (its sum is 0).
    """
    if per_token:
        return global_counts(batches, groups, declared)
    counts = _local_counts(batches, declared)
    if groups.cp_size > 1:  # the CP ranks hold parts of the same microbatches
        with waiting("all-reduce (microbatch loss counts)", groups.cp):
            dist.all_reduce(counts, group=groups.cp)
    return counts.clamp(min=1.0) * (len(batches) * groups.dp_size)


def global_counts(batches: Sequence[dict], groups, declared: LossDeclaration) -> torch.Tensor:
    """Per declared term, the elements it averages over in the whole global batch: [terms] fp32.

    This rank's microbatches are summed, then all-reduced over groups.dp (the one collective
    of the count; it runs before the schedule, as backward needs the counts).
    """
    counts = _local_counts(batches, declared).sum(0)
    if groups.layout.dp_cp > 1:  # CP ranks hold parts of the same samples
        with waiting("all-reduce (loss counts)", groups.dp_cp):
            dist.all_reduce(counts, group=groups.dp_cp)
    return counts


def masked_sums(terms: LossTerms, names: Sequence[str]) -> torch.Tensor:
    """sum(loss x mask) per term, in the order of `names`: [terms] fp32."""
    if terms.keys() != set(names):
        raise ValueError(f"forward_step returned the loss terms {list(terms)}; the declaration names {list(names)}")
    return torch.stack([(terms[name][0].float() * terms[name][1]).sum() for name in names])


def loss_means(reduced: ReducedLosses) -> dict[str, torch.Tensor]:
    """{term name: sum / count}: each term's mean over its global batch (0 off the last stage)."""
    return {name: total / count for name, (total, count) in reduced.items()}
