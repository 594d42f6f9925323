"""The loss contract between forward_step, the pipeline executor and the training loop.

A model's losses are named terms. The script declares them once (LossDeclaration), its
forward_step returns them on the last pipeline stage (LossTerms), and forward_backward
hands back each term's masked sum and count over the global batch (ReducedLosses); the
caller divides (loss_means). Each term is averaged over its own global count and the
averages are summed for backward, so adding a term (BERT's sentence-order loss, an MoE
auxiliary loss) needs a new entry in the declaration and in forward_step's result only.
"""
from collections.abc import Mapping, Sequence
from typing import Optional

import torch
import torch.distributed as dist

from ..watchdog import waiting

LossDeclaration = Mapping[str, Optional[str]]
"""{term name: batch key of its mask [b, ...], or None to count one per sample}, in logging order."""

LossTerms = dict[str, tuple[torch.Tensor, torch.Tensor]]
"""forward_step's result on the last pipeline stage: {term name: (per-element losses, mask)},
the two of one shape (per token [b, s], per sample [b]); mask is 1 where the element counts."""

ReducedLosses = dict[str, tuple[torch.Tensor, torch.Tensor]]
"""forward_backward's result: {term name: (sum of loss x mask, count)}, fp32 scalars over the
global batch (all microbatches, all DP ranks). The sum is 0 off the last pipeline stage."""

TOKEN_LOSS: LossDeclaration = {"lm loss": "loss_mask"}
"""A language model's one term: the per-token loss over the batch's loss_mask."""


def global_counts(batches: Sequence[dict], groups, declared: LossDeclaration) -> torch.Tensor:
    """Per declared term, the elements it averages over in the whole global batch: [terms] fp32.

    This rank's microbatches are summed, then all-reduced over groups.dp (the one collective
    of the count; it runs before the schedule, as backward needs the counts).
    """
    def count(batch, key):
        if key is not None:
            return batch[key].float().sum()
        return torch.tensor(float(batch["tokens"].shape[0]), device=batch["tokens"].device)
    counts = torch.stack([torch.stack([count(b, key) for b in batches]).sum() for key in declared.values()])
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
