"""Megatron-LM's document-boundary options of a GPT sample (--eod-mask-loss, --reset-position-ids,
--reset-attention-mask), as its GPT dataset's _get_ltor_masks_and_position_ids computes them.

Several documents share a sample, each ended by the end-of-document token (EOD). For input tokens
[b, s]: --eod-mask-loss zeroes the loss where the INPUT token is EOD (the prediction made from it,
the next document's first token); --reset-position-ids restarts the positions at 0 after each EOD;
--reset-attention-mask lets no token attend to a token before the last EOD preceding it (the EOD
itself belongs to the document it ends). The batch carries that as segment ids [b, s] (document
number of each position, transformer/documents.py), never as an [s, s] mask.
"""
import dataclasses

import torch

from ..transformer.documents import segment_ids_from_eod


@dataclasses.dataclass(frozen=True)
class EodOptions:
    eod: int
    eod_mask_loss: bool = False
    reset_position_ids: bool = False
    reset_attention_mask: bool = False


def ltor_masks(tokens, opts):
    """tokens [b, s] (inputs) -> (loss_mask [b, s] fp32, position_ids [b, s] int64 or None when not
    reset, segment_ids [b, s] int64 (document number: attention is causal within a document) or
    None when not reset: the model's causal path)."""
    b, s = tokens.shape
    is_eod = tokens == opts.eod
    loss_mask = torch.ones(b, s, dtype=torch.float32, device=tokens.device)
    if opts.eod_mask_loss:
        loss_mask[is_eod] = 0.0
    positions = segments = None
    if opts.reset_position_ids:
        ar = torch.arange(s, device=tokens.device).expand(b, s)
        # each document's first position: the index after its previous EOD (0 for the first)
        starts = torch.where(is_eod, ar + 1, torch.zeros_like(ar)).cummax(dim=1).values
        starts = torch.cat([torch.zeros(b, 1, dtype=starts.dtype, device=starts.device), starts[:, :-1]], dim=1)
        positions = ar - starts
    if opts.reset_attention_mask:
        segments = segment_ids_from_eod(tokens, opts.eod)
    return loss_mask, positions, segments
