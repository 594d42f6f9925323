"""Rows per local expert of an expert input sorted by expert, kept on the device.

Reading a count on the host (.tolist(), int()) makes the host wait until the GPU has caught up; at
small shapes that wait is most of the step. The grouped matmul takes its group offsets as a device
tensor, so the dropless one-process path never reads them; what must know sizes on the host (the
all-to-all's splits, slicing the kept pairs out of the dropped ones, a loop over experts) reads them
once, in one .tolist(), and hands them along here so that nothing reads them again.
"""
import torch


def tokens_per_expert(indices, num_experts):
    """indices [...] (int64 expert ids in [0, num_experts]) -> [num_experts] int64: how many name each.
    Id num_experts (a pair dropped over capacity) is counted nowhere. torch.bincount reads the ids'
    min and max on the host first on CUDA; a scatter-add does not."""
    flat = indices.reshape(-1)
    counts = torch.zeros(num_experts + 1, dtype=torch.int64, device=flat.device)
    return counts.scatter_add_(0, flat, torch.ones_like(flat))[:num_experts]


class TokenCounts:
    """How many rows of the expert input belong to each of G local experts, in order.

    ends: [G] int32 or int64 on the device, where each expert's rows end (a running sum; expert g has rows
    ends[g-1] .. ends[g]); sizes: the same as a list of G ints where the caller already holds them on
    the host, else None (read from `ends` on the first call of sizes(): one host sync)."""

    def __init__(self, ends, sizes=None, by_source=None):
        self.ends, self._sizes, self._groups, self._offsets = ends, sizes, None, None
        self.by_source = by_source  # per expert, its rows from each source rank (host ints), where known

    @classmethod
    def equal(cls, size, groups, device):
        """groups experts of `size` rows each (an input padded to capacity): nothing to read."""
        ends = torch.arange(size, size * groups + 1, size, device=device) if size else \
            torch.zeros(groups, dtype=torch.int64, device=device)
        return cls(ends, [size] * groups)

    @classmethod
    def of(cls, sizes, device):
        """From host sizes (a list of ints; a copy to the device: for callers outside the training step)."""
        sizes = [int(n) for n in sizes]
        ends = torch.tensor(sizes, dtype=torch.int64).cumsum(0).to(device)
        return cls(ends, sizes)

    def __len__(self):
        return self.ends.shape[0]

    def sizes(self):
        """The rows per expert as a list of ints (host)."""
        if self._sizes is None:
            ends = self.ends.tolist()
            self._sizes = [b - a for a, b in zip([0] + ends[:-1], ends)]
        return self._sizes

    def known(self):
        """Whether sizes() is free (already on the host)."""
        return self._sizes is not None

    def counts(self):
        """[G] on the device (ends' dtype): the rows per expert."""
        return torch.diff(self.ends, prepend=self.ends.new_zeros(1))

    def offsets(self):
        """[G] int32 on the device: torch._grouped_mm's offs (made once)."""
        if self._offsets is None:
            self._offsets = self.ends if self.ends.dtype == torch.int32 else self.ends.to(torch.int32)
        return self._offsets

    def groups(self, rows):
        """[rows] int64 on the device: the expert of each row (rows = the total, known to the caller)."""
        if self._groups is None:
            rows = torch.arange(rows, device=self.ends.device, dtype=self.ends.dtype)  # one dtype: CUDA's kernel
            self._groups = torch.searchsorted(self.ends, rows, right=True)
        return self._groups
