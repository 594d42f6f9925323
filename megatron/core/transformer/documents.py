"""Document boundaries of a packed micro-batch (--reset-attention-mask, --dataloader-inter-document-masking).

A sample packs several documents; a token attends causally to the tokens of its own document only.
The batch carries segment_ids [b, s] (document number of each position: equal ids in one contiguous
run are one document) and never an [s, s] mask: the attention front (fusions/document_attention.py)
runs each document's block on its own. Documents is what the layers receive in place of a mask; it
derives the per-document facts once per micro-batch, however many layers (and recomputes) read them.
"""
import functools

import torch


class Documents:
    """segment_ids [b, s] (integer) -> the documents of each sample, as contiguous runs of equal ids.

    Flat offsets count over the sample-major flattening [b * s] of the micro-batch (sample i's
    position j is i * s + j), the layout varlen kernels take.
    """

    def __init__(self, segment_ids):
        if segment_ids.dim() != 2:
            raise ValueError(f"segment_ids must be [b, s], got shape {tuple(segment_ids.shape)}")
        self.segment_ids = segment_ids

    @property
    def shape(self):
        return self.segment_ids.shape

    @functools.cached_property
    def _runs(self):
        """(flat start offsets, lengths) of every document, sample-major, as int64 tensors."""
        b, s = self.segment_ids.shape
        # a sample's first run must not merge with the previous sample's last one: offset the ids per sample
        ids = self.segment_ids.long() - self.segment_ids.long().min()
        span = int(ids.max()) + 1 if ids.numel() else 1
        flat = (ids + torch.arange(b, device=ids.device)[:, None] * span).reshape(-1)
        _, lengths = torch.unique_consecutive(flat, return_counts=True)
        return torch.cumsum(lengths, 0) - lengths, lengths

    @functools.cached_property
    def lengths(self):
        """Every document's length, sample-major (a python list: read once per micro-batch)."""
        return self._runs[1].tolist()

    @functools.cached_property
    def by_length(self):
        """[(length L, flat start offsets [n] int64)]: the documents grouped by length, so that one
        attention call serves all n documents of length L."""
        starts, lengths = self._runs
        groups = []
        for length in sorted(set(self.lengths)):
            groups.append((length, starts[lengths == length]))
        return groups

    @functools.cached_property
    def cu_seqlens(self):
        """int32 [n + 1]: cumulative document lengths over the flattened micro-batch (varlen kernels)."""
        lengths = self._runs[1]
        return torch.cat([lengths.new_zeros(1), torch.cumsum(lengths, 0)]).to(torch.int32)

    @property
    def max_length(self):
        return max(self.lengths)

    def dense_mask(self):
        """[b, 1, s, s] bool (True = may attend): causal within each document. Only for
        --attention-backend unfused and for tests: the O(s^2) tensor the document path avoids."""
        s = self.segment_ids.shape[1]
        causal = torch.ones(s, s, dtype=torch.bool, device=self.segment_ids.device).tril()
        same = self.segment_ids[:, :, None] == self.segment_ids[:, None, :]
        return (causal & same)[:, None]


def segment_ids_from_eod(tokens, eod):
    """tokens [b, s] -> document number of each position [b, s] int64: the count of end-of-document
    tokens strictly before it (the EOD belongs to the document it ends, as Megatron-LM's mask)."""
    is_eod = (tokens == eod).long()
    return torch.cumsum(is_eod, dim=1) - is_eod
