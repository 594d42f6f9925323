"""Packed documents under context parallelism: which keys a CP rank's queries may see.

Every CP rank keeps the whole (padded) sequence's segment ids [b, S] (batch_on_this_cp_rank: b x S
integers, no communication) and knows the global position of every rank's tokens (the 2C
load-balanced chunks, context_parallel.local_positions). A query sees a key when the key is not later
and both lie in one document. For a ring block (this rank's query rows against a source rank's key
columns) that is one of:
  skip    no query of any sample sees any key of the block (a document shorter than the distance
          between the chunks): the block is not computed, forward or backward, and is counted;
  full    every query sees every key (one document spans both, the keys earlier): the unmasked kernel;
  causal  the diagonal block within one document: the causal kernel;
  masked  anything else: the block's [b, 1, rows, cols] bool mask through the explicit kernel.
A sliding window (--window-size) narrows what a query sees the same way, so a window shorter than the
distance between two chunks skips their block.
"""
import torch

SKIP, FULL, CAUSAL, MASKED = "skip", "full", "causal", "masked"


class CPDocuments:
    """segment_ids [b, S] of the whole padded sequence; positions [C, S / C]: the global position of
    each CP rank's local tokens, in local order; window: how many earlier keys a query sees at most
    (--window-size; None: all of its document's)."""

    def __init__(self, segment_ids, positions, window=None):
        self.segment_ids, self.positions, self.window = segment_ids, positions, window

    def block_mask(self, q_rank, k_rank, rows=slice(None), cols=slice(None)):
        """[b, 1, rows, cols] bool: which of q_rank's query rows see which of k_rank's key columns."""
        qpos, kpos = self.positions[q_rank][rows], self.positions[k_rank][cols]
        qseg, kseg = self.segment_ids[:, qpos], self.segment_ids[:, kpos]
        seen = qpos[:, None] >= kpos[None, :]
        if self.window is not None:
            seen = seen & (qpos[:, None] - kpos[None, :] <= self.window)
        return (seen & (qseg[:, :, None] == kseg[:, None, :]))[:, None]

    def classify(self, q_rank, k_rank, rows, cols, causal_diagonal):
        """(kind, mask): kind one of SKIP, FULL, CAUSAL, MASKED for the block; mask only for MASKED."""
        mask = self.block_mask(q_rank, k_rank, rows, cols)
        if not mask.any():
            return SKIP, None
        if mask.all():
            return FULL, None
        if causal_diagonal and mask.shape[-1] == mask.shape[-2]:
            tril = torch.ones(mask.shape[-2:], dtype=torch.bool, device=mask.device).tril()
            if torch.equal(mask, tril.expand_as(mask)):
                return CAUSAL, None
        return MASKED, mask

    def gathered(self, order_positions):
        """Segment ids [b, n] of the tokens at global positions order_positions [n]."""
        return self.segment_ids[:, order_positions]


def ring_block_kinds(segment_ids, positions, plan):
    """{kind: count} over every (rank, step) block of a ring with these documents. plan(rank, src) ->
    (rows, cols, causal diagonal) of the block (ring_attention._plan): what the ring computes and skips."""
    docs = CPDocuments(segment_ids, positions)
    size = positions.shape[0]
    counts = {SKIP: 0, FULL: 0, CAUSAL: 0, MASKED: 0}
    for rank in range(size):
        for step in range(size):
            src = (rank - step) % size
            rows, cols, diagonal = plan(rank, src)
            counts[docs.classify(rank, src, rows, cols, diagonal)[0]] += 1
    return counts
