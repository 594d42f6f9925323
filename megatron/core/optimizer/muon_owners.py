"""Muon under a sharded optimizer (ZeRO-1/2/3): whole matrices to their owners and back.

The distributed optimizer's pieces are each DP rank's slice of every DDP bucket, so a matrix lies in
pieces on consecutive ranks. Momentum is elementwise and stays in those pieces (the same state layout as
Adam's, so checkpoints and every sharding strategy work unchanged); only Newton-Schulz needs the whole
matrix. So each matrix has one owner among its buffer's DP ranks (groups.dp_cp, or groups.edp for
experts), chosen to balance the Newton-Schulz FLOPs (longest first, to the least loaded rank; ties to the
rank that holds most of it): before Newton-Schulz each rank sends its pieces of the momentum to their
owners, after it each owner sends every rank its piece of the update (one all-to-all per buffer each
way). No matrix is orthogonalised in pieces.

Every rank of a DP group sees the same buffers, buckets and shapes, so all compute the same owners
without talking; TP (and expert-TP) peers share their DP rank, so they own the same matrices and meet
in the same TP collectives in the same order.
"""
import torch

from .. import comm


def segments(off, n, start, end, d):
    """[(lo, hi)] per rank of a group of d: the flat range of a parameter of n elements at buffer offset
    `off` inside each rank's shard of the bucket [start, end) (padded to a multiple of d)."""
    k = (end - start) // d
    out = []
    for r in range(d):
        lo, hi = start + r * k, start + (r + 1) * k
        lo, hi = max(lo, off) - off, min(hi, off + n) - off
        out.append((lo, hi) if lo < hi else (0, 0))
    return out


def balance(costs, held, d):
    """The owner of each matrix: longest processing time first onto the least loaded of d ranks.
    held[i][r]: elements of matrix i on rank r (a tie goes to the rank holding most, then the lowest)."""
    load, owners = [0.0] * d, [0] * len(costs)
    for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        owners[i] = min(range(d), key=lambda r: (load[r], -held[i][r], r))
        load[owners[i]] += costs[i]
    return owners


def exchange_elements(mats, d, costs, rank=0):
    """(elements `rank` sends gathering momentum to the owners, elements it sends scattering their updates)
    for matrices of `mats` ([segments] of each, buffer order) with Newton-Schulz costs `costs`: what
    MatrixOwners moves, for the planner (whose estimate is a DP rank 0's)."""
    owners = balance(costs, [[hi - lo for lo, hi in segs] for segs in mats], d)
    gather = sum(segs[rank][1] - segs[rank][0] for segs, o in zip(mats, owners) if o != rank)
    scatter = sum(hi - lo for segs, o in zip(mats, owners) if o == rank
                  for r, (lo, hi) in enumerate(segs) if r != rank)
    return gather, scatter


class _Plan:
    """The Muon matrices of one DDP buffer: [(param, segments)] in buffer order, their owners, the group."""

    def __init__(self, buf, is_muon, cost):
        self.group = buf.buckets[0].group
        self.d, self.me = comm.world(self.group), comm.rank(self.group)
        self.mats = [(p, segments(buf.offset(p), p.numel(), b.start, b.end, self.d))
                     for b in buf.buckets for p in b.params if is_muon(p)]
        held = [[hi - lo for lo, hi in segs] for _, segs in self.mats]
        self.owners = balance([cost(p) for p, _ in self.mats], held, self.d)

    def owned(self):
        return [i for i, o in enumerate(self.owners) if o == self.me]


class MatrixOwners:
    """Owners of the Muon matrices of `ddp`'s sharded buffers (is_muon(param), cost(param): NS FLOPs)."""

    def __init__(self, ddp, is_muon, cost):
        self.plans = [_Plan(buf, is_muon, cost) for buf in ddp.buffers if buf.buckets]
        self.plans = [pl for pl in self.plans if pl.mats]
        self.device = ddp.buffers[0].params[0].device

    def _cat(self, tensors):
        if not tensors:
            return torch.empty(0, dtype=torch.float32, device=self.device)
        return torch.cat([t.reshape(-1) for t in tensors])

    def owned_params(self):
        """The parameters this rank orthogonalises, plan (buffer) by plan, in buffer order."""
        return [pl.mats[i][0] for pl in self.plans for i in pl.owned()]

    def gather(self, pieces):
        """pieces: {id(param): this rank's flat piece of its momentum} -> {id(param): the whole flat
        momentum} of the matrices this rank owns. Collective over each buffer's DP group."""
        out = {}
        for pl in self.plans:
            me = pl.me
            send, send_sizes = [], []
            for o in range(pl.d):
                mine = [pieces[id(p)] for (p, segs), w in zip(pl.mats, pl.owners) if w == o and segs[me][1] > 0]
                send += mine
                send_sizes.append(sum(t.numel() for t in mine))
            owned = pl.owned()
            recv_sizes = [sum(pl.mats[i][1][s][1] - pl.mats[i][1][s][0] for i in owned) for s in range(pl.d)]
            got = comm.all_to_all_uneven(self._cat(send), send_sizes, recv_sizes, pl.group, tag="muon-gather")
            parts, pos = {i: [] for i in owned}, 0
            for s in range(pl.d):
                for i in owned:
                    lo, hi = pl.mats[i][1][s]
                    parts[i].append(got[pos:pos + hi - lo])
                    pos += hi - lo
            out.update({id(pl.mats[i][0]): torch.cat(parts[i]) for i in owned})
        return out

    def scatter(self, updates):
        """updates: {id(param): whole flat update} of the matrices this rank owns -> {id(param): this
        rank's piece of it} for every matrix it holds a piece of. Collective over each buffer's DP group."""
        out = {}
        for pl in self.plans:
            me, owned = pl.me, pl.owned()
            send, send_sizes = [], []
            for s in range(pl.d):
                mine = [updates[id(pl.mats[i][0])][slice(*pl.mats[i][1][s])] for i in owned]
                send += mine
                send_sizes.append(sum(t.numel() for t in mine))
            held = [i for i, (_, segs) in enumerate(pl.mats) if segs[me][1] > 0]
            recv_sizes = [sum(pl.mats[i][1][me][1] - pl.mats[i][1][me][0] for i in held if pl.owners[i] == o)
                          for o in range(pl.d)]
            got = comm.all_to_all_uneven(self._cat(send), send_sizes, recv_sizes, pl.group, tag="muon-scatter")
            pos = 0
            for o in range(pl.d):
                for i in held:
                    if pl.owners[i] == o:
                        n = pl.mats[i][1][me][1] - pl.mats[i][1][me][0]
                        out[id(pl.mats[i][0])] = got[pos:pos + n]
                        pos += n
        return out
