"""Checkpoint I/O of N ranks in one process: the real save (storage.py) and load (index_reader.py)
code driven for every simulated rank of a GPT-shaped layout, counting what each loading rank
opens and reads against the size of its shard (bench/checkpoint_scale.py, tests).

The model is GPT-shaped (per layer: two norms, QKV and FC1 column-parallel, proj and FC2
row-parallel, their biases; word and position embeddings on the first stage, the final norm on
the last; the output layer tied) at any hidden size. With the distributed optimizer each DP rank
holds a flat 1/DP range of every parameter's TP shard (the real one slices the flat buffer:
the ranges differ, the accounting does not); without it DP rank 0 writes the whole shard.
"""
import dataclasses
import math
import types

import torch

from ..parallel_layout import ParallelLayout
from ..tensor_parallel.initialization import take_shard
from ..tensor_parallel.param_meta import counted_once, set_init_key, set_tensor_parallel
from .index_reader import IndexedReader, placement_index, read_index
from .pieces import make_piece, param_rule
from .reading import read_metadata
from .storage import begin_save, commit, iter_dir, write_rank_file

STATES = ("param", "exp_avg", "exp_avg_sq")


@dataclasses.dataclass(frozen=True)
class Layout(ParallelLayout):
    """A simulated run: its ParallelLayout (TP, PP, and DP what the world leaves) and whether the optimizer
    state is distributed over DP."""
    distributed_optimizer: bool = True

    @classmethod
    def of(cls, tp: int, pp: int, dp: int, distributed_optimizer: bool = True) -> "Layout":
        return cls(tp * pp * dp, tp, pp=pp, distributed_optimizer=distributed_optimizer)

    def coords(self, rank):
        """(tp_rank, pp_rank, dp_rank) of a global rank."""
        p = self.position(rank)
        return p.tp, p.pp, p.dp


def gpt_tensors(layers, hidden, vocab, seq=2048, vocab_multiple=128):
    """[(key, global shape, split dim or None, stride, padded multiple, first layer or -1/-2)]:
    -1 for the first stage's embeddings, -2 for the last stage's final norm."""
    h, f = hidden, 4 * hidden
    out = [("embedding.word", [vocab, h], 0, 1, vocab_multiple, -1), ("embedding.position", [seq, h], None, 1, 0, -1),
           ("final_norm.weight", [h], None, 1, 0, -2)]
    for i in range(layers):
        out += [(f"layers.{i}.{name}", shape, dim, 1, 0, i) for name, shape, dim in (
            ("input_norm.weight", [h], None), ("qkv.weight", [3 * h, h], 0), ("qkv.bias", [3 * h], 0),
            ("proj.weight", [h, h], 1), ("proj.bias", [h], None), ("post_norm.weight", [h], None),
            ("fc1.weight", [f, h], 0), ("fc1.bias", [f], 0), ("fc2.weight", [h, f], 1), ("fc2.bias", [h], None))]
    return out


def _on_stage(where, layers, pp, pp_rank):
    if where == -1:
        return pp_rank == 0
    if where == -2:
        return pp_rank == pp - 1
    return where // (layers // pp) == pp_rank


def _param(key, shape, dim, stride, multiple, tp):
    """A parameter with the model's metadata, as a rank of TP size `tp` holds it (no storage)."""
    local = list(shape)
    if dim is not None:
        padded = -(-shape[dim] // (multiple * tp)) * multiple * tp if multiple else shape[dim]
        local[dim] = padded // tp
    p = torch.nn.Parameter(torch.empty(local, device="meta"))
    set_init_key(p, key)
    if dim is not None:
        set_tensor_parallel(p, dim, stride, shape[dim] if multiple else None)
    return p


def rank_params(tensors, layers, layout, rank):
    """[(key, param)] the simulated rank holds."""
    tp_rank, pp_rank, _ = layout.coords(rank)
    return [(k, _param(k, s, d, st, m, layout.tp)) for k, s, d, st, m, w in tensors
            if _on_stage(w, layers, layout.pp, pp_rank)]


def optimizer_range(layout, numel, dp_rank):
    """The flat range of a TP shard of `numel` elements whose optimizer state a DP rank holds."""
    if not layout.distributed_optimizer:
        return 0, numel
    return numel * dp_rank // layout.dp, numel * (dp_rank + 1) // layout.dp


def global_value(key, state, shape, seed=0):
    g = torch.Generator().manual_seed(hash((key, state, seed)) % (2 ** 31))
    return torch.randn(shape, generator=g)


def _padded_global(value, param, tp):
    shape, dim, _, padded = param_rule(param, 0, tp)
    if dim is None or padded == shape[dim]:
        return value
    extra = list(shape)
    extra[dim] = padded - shape[dim]
    return torch.cat([value, value.new_zeros(extra)], dim=dim)


def expected_shard(key, state, param, tp, tp_rank, shape):
    _, dim, stride, _ = param_rule(param, tp_rank, tp)
    full = _padded_global(global_value(key, state, shape), param, tp)
    return take_shard(full, dim, stride, tp_rank, tp) if dim is not None else full


def save(root, tensors, layers, layout, iteration=1):
    """Every simulated rank writes its rank file through storage.py; rank 0 commits."""
    shapes = {k: s for k, s, *_ in tensors}
    begin_save(root, iteration)
    for rank in range(layout.world):
        tp_rank, pp_rank, dp_rank = layout.coords(rank)
        pieces = []
        for key, p in rank_params(tensors, layers, layout, rank):
            grid = types.SimpleNamespace(tp_rank=tp_rank, pp_rank=pp_rank)
            if not counted_once(p, grid) or (not layout.distributed_optimizer and dp_rank):
                continue
            for state in STATES:
                flat = expected_shard(key, state, p, layout.tp, tp_rank, shapes[key]).reshape(-1)
                lo, hi = optimizer_range(layout, flat.numel(), dp_rank)
                pieces.append(make_piece(key, state, p, tp_rank, layout.tp, lo, hi, flat[lo:hi]))
        write_rank_file(root, iteration, rank, {"pieces": pieces, "rng": {"torch": torch.get_rng_state()}})
    commit(root, iteration, {"consumed_samples": 0, "args": {"model": {"num_layers": layers}, "training": {}},
                             "optimizer": None, "layout": {"tp": layout.tp, "pp": layout.pp, "dp": layout.dp,
                                                           "distributed_optimizer": layout.distributed_optimizer}},
           layout.world)
    return iter_dir(root, iteration)


@dataclasses.dataclass
class RankIO:
    rank: int
    shard_bytes: int       # what the rank needs: its param TP shards and its optimizer ranges (fp32)
    bytes_read: int        # data bytes read (the index comes on top: index_bytes)
    files_opened: int
    files_holding: int     # files holding any element it needs
    correct: bool          # every value read equals the saved one
    received: int = 0      # bytes a DP broadcast would bring instead (dp_broadcast)
    index_bytes: int = 0   # index bytes read (format 1: all of index.json; format 2: its tensors' entries)
    index_files: int = 0   # index files read (format 2: one per tensor it holds)


def load(path, tensors, layers, layout, index=None, check=True, dp_broadcast=False):
    """-> [RankIO] of every simulated loading rank of `layout` reading checkpoint `path`.

    dp_broadcast: the parameters of a DP group's shard are read by its DP rank 0 only and
    broadcast (counted as received); every rank reads its own optimizer ranges."""
    metadata = read_metadata(path)
    index = index or read_index(path, metadata)
    shapes = {k: s for k, s, *_ in tensors}
    out = []
    for rank in range(layout.world):
        tp_rank, _, dp_rank = layout.coords(rank)
        reader = IndexedReader(path, metadata, index)
        checker = IndexedReader(path, metadata, index)  # the files holding its pieces, counted apart
        io = RankIO(rank, 0, 0, 0, 0, True)
        holding = set()
        for key, p in rank_params(tensors, layers, layout, rank):
            numel = math.prod(p.shape)
            lo, hi = optimizer_range(layout, numel, dp_rank)
            for state in STATES:
                a, b = (0, numel) if state == "param" else (lo, hi)
                io.shard_bytes += (b - a) * 4
                if dp_broadcast and dp_rank > 0 and state == "param":
                    io.received += numel * 4
                    continue
                got = reader.shard(key, state, p, tp_rank, layout.tp, None if state == "param" else [(a, b)])
                holding |= _files_holding(checker, key, state, p, tp_rank, layout.tp, a, b)
                if check:
                    want = expected_shard(key, state, p, layout.tp, tp_rank, shapes[key]).reshape(-1)
                    io.correct = io.correct and torch.equal(got.reshape(-1)[a:b], want[a:b])
        reader.close()
        io.bytes_read, io.files_opened, io.files_holding = reader.bytes_read, len(reader.files_opened), len(holding)
        io.index_bytes = reader.index_bytes
        io.index_files = reader.index.files_read
        out.append(io)
    return out


def _files_holding(reader, key, state, param, tp_rank, tp, lo, hi):
    """The files with a piece sharing an element with [lo, hi) of this rank's shard (by a mask
    of the global tensor, independently of the reader's own piece lookup)."""
    shape, dim, stride, padded = param_rule(param, tp_rank, tp)
    wanted = placement_index(shape, dim, stride, padded, tp_rank, tp, lo, hi)
    mask = torch.zeros(math.prod(shape) + 1, dtype=torch.bool)  # the last one: padding (-1)
    mask[wanted] = True
    mask[-1] = False
    every = [e for rule, ranks in reader.index.rules(key, state) for r in ranks
             for e in reader.index.records(key, state, rule, r)]
    return {e["file"] for e in every
            if bool(mask[placement_index(e["shape"], e["dim"], e["stride"], e["padded"], e["tp_rank"],
                                         e["tp_size"], e["lo"], e["hi"])].any())}
