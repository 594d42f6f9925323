"""Tensor parallelism against its dense single-process equivalent: outputs and gradients.

Every case runs on 4 real gloo processes, once with TP=2 (so DP=2: two independent TP
groups, which catches code that talks to the world instead of its TP group) and once
with TP=4. All cases of one TP size share one spawned run (module fixture `tp_run`), and
each case is then its own parametrised test. A case is a generator run on every rank: it
yields `(what, passed, detail)` for each comparison instead of raising, so every rank keeps
issuing the same collectives; the test asserts them all. An unexpected exception aborts the
run and fails every test of that TP size with the traceback.

References are computed with plain torch ops on the full tensors, and the expected shard
of a full tensor is taken with `_shard` below, written independently of the library's
`take_shard` (which is itself checked against it).
"""
import dataclasses
import functools
import zlib

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from megatron.core.config import TransformerConfig
from megatron.core.models.gpt import GPTModel
from megatron.core.parallel_layout import ParallelLayout
from megatron.core.tensor_parallel import (
    ColumnParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
    copy_to_tensor_model_parallel_region,
    gather_from_sequence_parallel_region,
    gather_from_tensor_model_parallel_region,
    get_rng_tracker,
    model_parallel_seed,
    reduce_from_tensor_model_parallel_region,
    reduce_scatter_to_sequence_parallel_region,
    scatter_to_sequence_parallel_region,
    scatter_to_tensor_model_parallel_region,
    vocab_parallel_cross_entropy,
)
from megatron.core.tensor_parallel.initialization import full_shape, init_full_tensor, initialize_parameters, take_shard
from megatron.core.tensor_parallel.param_meta import param_meta
from megatron.core.transformer.attention import SelfAttention
from megatron.core.transformer.layer import hidden_dropout
from tests.harness import spawn

WORLD = 4
TP_SIZES = (2, 4)
DT = torch.float64  # layer-level checks: exact enough to use tight tolerances

# ----------------------------------------------------------------------------- helpers


def _rand(*shape, seed, dtype=DT):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def _shard(full, dim, r, tp, stride=1):
    """Rows of `full` along dim held by TP rank r: each of `stride` blocks split tp ways."""
    n = full.shape[dim]
    assert n % (stride * tp) == 0, (n, stride, tp)
    block, per = n // stride, n // stride // tp
    idx = [b * block + r * per + i for b in range(stride) for i in range(per)]
    return full.index_select(dim, torch.tensor(idx))


def _pad_rows(t, rows, dim=0):
    """t zero-padded along dim to `rows`."""
    pad = list(t.shape)
    pad[dim] = rows - t.shape[dim]
    return torch.cat([t, t.new_zeros(pad)], dim=dim)


def _true(what, cond, detail=""):
    """One comparison's record, (what, passed, detail): a condition evaluated on this rank."""
    return what, bool(cond), detail or "condition is false"


def _close(what, actual, expected, rtol=1e-10, atol=1e-12, elementwise=False):
    """(what, passed, detail) for |a - e| <= atol + rtol * scale, scale = max|e| (or |e| per element)."""
    if actual is None:
        return what, False, "got None (missing gradient?)"
    if tuple(actual.shape) != tuple(expected.shape):
        return what, False, f"shape {tuple(actual.shape)} != expected {tuple(expected.shape)}"
    a, e = actual.detach().double(), expected.detach().double()
    if not torch.isfinite(a).all():
        return what, False, "non-finite values"
    err = (a - e).abs()
    tol = atol + rtol * (e.abs() if elementwise else e.abs().max())
    if bool((err <= tol).all()):
        return what, True, ""
    i = int((err - tol).flatten().argmax())
    return what, False, (f"max |err| {err.max().item():.3e} (allowed {atol:.1e} + {rtol:.1e} * scale), "
                         f"worst at flat index {i}: got {a.flatten()[i].item():.8g}, "
                         f"expected {e.flatten()[i].item():.8g}")


def _equal(what, actual, expected):
    return _close(what, actual, expected, rtol=0.0, atol=0.0)


class Ctx:
    """Per-rank state shared by the cases."""

    def __init__(self, groups):
        self.groups = groups
        self.tp, self.r, self.group = groups.tp_size, groups.tp_rank, groups.tp
        # one 1-rank group per rank, for the one-process reference models (a layout of one rank). new_group
        # is collective: every rank creates every group, in the same order.
        singles = [dist.new_group([k]) for k in range(groups.world_size)]
        self.single = dataclasses.replace(ParallelLayout(1).plan_groups(0), tp=singles[groups.rank])

    def all_gather(self, t):
        out = [torch.empty_like(t) for _ in range(self.tp)]
        dist.all_gather(out, t.contiguous(), group=self.group)
        return out

    def tp_sum(self, t):
        t = t.clone()
        dist.all_reduce(t, group=self.group)
        return t


S, B, H = 8, 3, 12  # [s, b, h] activations; s and h divisible by every TP size

# ----------------------------------------------------------------------------- mappings


def _map_copy_to(c):
    X = _rand(S, B, H, seed=1)
    Gs = [_rand(S, B, H, seed=100 + k) for k in range(c.tp)]
    x = X.clone().requires_grad_()
    y = copy_to_tensor_model_parallel_region(x, c.group)
    yield _equal("forward is the identity", y, X)
    y.backward(Gs[c.r].clone())
    yield _close("backward sums the gradient over the TP group", x.grad, sum(Gs))
    # the incoming gradient may be shared with another consumer of the same tensor
    # (here a residual-style `b + copy_to(b)`): it must not be reduced in place
    a = X.clone().requires_grad_()
    b = a * 2.0
    (b + copy_to_tensor_model_parallel_region(b, c.group)).backward(Gs[c.r].clone())
    yield _close("shared incoming gradient not corrupted", a.grad, 2.0 * (Gs[c.r] + sum(Gs)))


def _map_reduce_from(c):
    Xs = [_rand(S, B, H, seed=10 + k) for k in range(c.tp)]
    G = _rand(S, B, H, seed=100 + c.r)
    x = Xs[c.r].clone().requires_grad_()
    y = reduce_from_tensor_model_parallel_region(x, c.group)
    yield _close("forward sums over the TP group", y, sum(Xs))
    yield _equal("forward leaves its input unchanged", x.detach(), Xs[c.r])
    y.backward(G.clone())
    yield _equal("backward is the identity", x.grad, G)
    # input saved for backward by the op that produced it (exp saves its output)
    a = Xs[c.r].clone().requires_grad_()
    reduce_from_tensor_model_parallel_region(torch.exp(a), c.group).backward(G.clone())
    yield _close("gradient through exp -> reduce_from", a.grad, G * torch.exp(Xs[c.r]))


def _map_scatter_to(c):
    X = _rand(S, B, H, seed=2)
    Gs = [_rand(S, B, H // c.tp, seed=200 + k) for k in range(c.tp)]
    x = X.clone().requires_grad_()
    y = scatter_to_tensor_model_parallel_region(x, c.group)
    yield _equal("forward keeps this rank's last-dim slice", y, _shard(X, -1, c.r, c.tp))
    y.backward(Gs[c.r].clone())
    yield _equal("backward all-gathers along the last dim", x.grad, torch.cat(Gs, dim=-1))


def _map_gather_from(c):
    Xs = [_rand(S, B, H // c.tp, seed=20 + k) for k in range(c.tp)]
    G = _rand(S, B, H, seed=300 + c.r)  # rank-specific: backward must use its own
    x = Xs[c.r].clone().requires_grad_()
    y = gather_from_tensor_model_parallel_region(x, c.group)
    yield _equal("forward all-gathers along the last dim", y, torch.cat(Xs, dim=-1))
    y.backward(G.clone())
    yield _equal("backward keeps this rank's last-dim slice", x.grad, _shard(G, -1, c.r, c.tp))


def _map_scatter_to_sequence(c):
    X = _rand(S, B, H, seed=3)
    Gs = [_rand(S // c.tp, B, H, seed=400 + k) for k in range(c.tp)]
    x = X.clone().requires_grad_()
    y = scatter_to_sequence_parallel_region(x, c.group)
    yield _equal("forward keeps this rank's sequence slice", y, _shard(X, 0, c.r, c.tp))
    y.backward(Gs[c.r].clone())
    yield _equal("backward all-gathers along the sequence", x.grad, torch.cat(Gs, dim=0))


def _map_gather_from_sequence(c):
    Xs = [_rand(S // c.tp, B, H, seed=30 + k) for k in range(c.tp)]
    Gs = [_rand(S, B, H, seed=500 + k) for k in range(c.tp)]
    for partial in (True, False):
        x = Xs[c.r].clone().requires_grad_()
        y = gather_from_sequence_parallel_region(x, c.group, tensor_parallel_output_grad=partial)
        yield _equal(f"[partial={partial}] forward all-gathers along the sequence", y, torch.cat(Xs, dim=0))
        y.backward(Gs[c.r].clone())
        want = _shard(sum(Gs), 0, c.r, c.tp) if partial else _shard(Gs[c.r], 0, c.r, c.tp)
        yield _close(f"[partial={partial}] backward " + ("reduce-scatters" if partial else "splits"),
                     x.grad, want)


def _map_reduce_scatter_to_sequence(c):
    Xs = [_rand(S, B, H, seed=40 + k) for k in range(c.tp)]
    Gs = [_rand(S // c.tp, B, H, seed=600 + k) for k in range(c.tp)]
    x = Xs[c.r].clone().requires_grad_()
    y = reduce_scatter_to_sequence_parallel_region(x, c.group)
    yield _close("forward reduce-scatters along the sequence", y, _shard(sum(Xs), 0, c.r, c.tp))
    yield _equal("forward leaves its input unchanged", x.detach(), Xs[c.r])
    y.backward(Gs[c.r].clone())
    yield _equal("backward all-gathers along the sequence", x.grad, torch.cat(Gs, dim=0))


def _map_explicit_group_and_errors(c):
    # the group as a positional argument
    Xs = [_rand(4, c.tp * 2, seed=50 + k) for k in range(c.tp)]
    y = reduce_from_tensor_model_parallel_region(Xs[c.r].clone(), c.group)
    yield _close("reduce_from with explicit group", y, sum(Xs))
    y = gather_from_tensor_model_parallel_region(Xs[c.r].clone(), c.group)
    yield _equal("gather_from with explicit group", y, torch.cat(Xs, dim=-1))
    for what, fn, shape in [("scatter_to", scatter_to_tensor_model_parallel_region, (4, c.tp + 1)),
                            ("scatter_to_sequence", scatter_to_sequence_parallel_region, (c.tp + 1, 4))]:
        try:
            fn(torch.zeros(shape, dtype=DT), c.group)
        except ValueError:
            yield _true(f"{what} rejects an indivisible size", True)
        else:
            yield _true(f"{what} rejects an indivisible size", False, "no ValueError")

# ----------------------------------------------------------------------------- layers


def _column_parallel_linear(c):
    IN, OUT = 6, 16
    X = _rand(S, B, IN, seed=60)
    W, bvec = _rand(OUT, IN, seed=61), _rand(OUT, seed=62)
    G = _rand(S, B, OUT, seed=63)
    cases = [dict(gather_output=False, stride=1, sequence_parallel=False, bias=True, skip_bias_add=False),
             dict(gather_output=True, stride=1, sequence_parallel=False, bias=True, skip_bias_add=False),
             dict(gather_output=False, stride=2, sequence_parallel=False, bias=True, skip_bias_add=False),
             dict(gather_output=False, stride=1, sequence_parallel=True, bias=True, skip_bias_add=False),
             dict(gather_output=False, stride=2, sequence_parallel=True, bias=False, skip_bias_add=False),
             dict(gather_output=False, stride=1, sequence_parallel=False, bias=True, skip_bias_add=True)]
    for case in cases:
        tag = "[" + ",".join(f"{k}={v}" for k, v in case.items()) + "]"
        stride, sp, gather = case["stride"], case["sequence_parallel"], case["gather_output"]
        # dense reference
        Xd, Wd = X.clone().requires_grad_(), W.clone().requires_grad_()
        bd = bvec.clone().requires_grad_() if case["bias"] else None
        Y = F.linear(Xd, Wd, bd)
        (Y * G).sum().backward()
        # TP layer with the matching shards
        layer = ColumnParallelLinear(IN, OUT, group=c.group, params_dtype=DT, **case)
        yield _true(f"{tag} weight shape", tuple(layer.weight.shape) == (OUT // c.tp, IN), str(layer.weight.shape))
        meta = param_meta(layer.weight)
        yield _true(f"{tag} weight TP attributes",
                    meta.tensor_parallel and meta.partition_dim == 0 and meta.partition_stride == stride)
        with torch.no_grad():
            layer.weight.copy_(_shard(W, 0, c.r, c.tp, stride))
            if case["bias"]:
                layer.bias.copy_(_shard(bvec, 0, c.r, c.tp, stride))
        x = (_shard(X, 0, c.r, c.tp) if sp else X).clone().requires_grad_()
        y, out_bias = layer(x)
        if case["skip_bias_add"]:
            yield _true(f"{tag} returns its bias for the caller to add", out_bias is layer.bias)
            y_plus = y + out_bias
        else:
            yield _true(f"{tag} returns no bias", out_bias is None)
            y_plus = y
        if gather:
            yield _close(f"{tag} output", y_plus, Y)
            (y_plus * G).sum().backward()
        else:
            yield _close(f"{tag} output shard", y_plus, _shard(Y, -1, c.r, c.tp, stride))
            (y_plus * _shard(G, -1, c.r, c.tp, stride)).sum().backward()
        yield _close(f"{tag} input grad", x.grad, _shard(Xd.grad, 0, c.r, c.tp) if sp else Xd.grad)
        yield _close(f"{tag} weight grad shard", layer.weight.grad, _shard(Wd.grad, 0, c.r, c.tp, stride))
        if case["bias"]:
            yield _close(f"{tag} bias grad shard", layer.bias.grad, _shard(bd.grad, 0, c.r, c.tp, stride))
        else:
            yield _true(f"{tag} no bias parameter", layer.bias is None)


def _row_parallel_linear(c):
    IN, OUT = 16, 6
    X = _rand(S, B, IN, seed=70)
    W, bvec = _rand(OUT, IN, seed=71), _rand(OUT, seed=72)
    G = _rand(S, B, OUT, seed=73)
    cases = [dict(input_is_parallel=True, sequence_parallel=False, bias=True, skip_bias_add=False),
             dict(input_is_parallel=False, sequence_parallel=False, bias=True, skip_bias_add=False),
             dict(input_is_parallel=True, sequence_parallel=True, bias=True, skip_bias_add=False),
             dict(input_is_parallel=True, sequence_parallel=False, bias=False, skip_bias_add=False),
             dict(input_is_parallel=True, sequence_parallel=False, bias=True, skip_bias_add=True)]
    for case in cases:
        tag = "[" + ",".join(f"{k}={v}" for k, v in case.items()) + "]"
        sp, par = case["sequence_parallel"], case["input_is_parallel"]
        Xd, Wd = X.clone().requires_grad_(), W.clone().requires_grad_()
        bd = bvec.clone().requires_grad_() if case["bias"] else None
        Y = F.linear(Xd, Wd, bd)
        (Y * G).sum().backward()
        layer = RowParallelLinear(IN, OUT, group=c.group, params_dtype=DT, **case)
        yield _true(f"{tag} weight shape", tuple(layer.weight.shape) == (OUT, IN // c.tp), str(layer.weight.shape))
        yield _true(f"{tag} weight TP attributes",
                    param_meta(layer.weight).tensor_parallel and param_meta(layer.weight).partition_dim == 1)
        with torch.no_grad():
            layer.weight.copy_(_shard(W, 1, c.r, c.tp))
            if case["bias"]:
                layer.bias.copy_(bvec)
        x = (_shard(X, -1, c.r, c.tp) if par else X).clone().requires_grad_()
        y, out_bias = layer(x)
        if case["skip_bias_add"]:
            yield _true(f"{tag} returns its bias for the caller to add", out_bias is layer.bias)
            y = y + out_bias
        else:
            yield _true(f"{tag} returns no bias", out_bias is None)
        yield _close(f"{tag} output", y, _shard(Y, 0, c.r, c.tp) if sp else Y)
        (y * (_shard(G, 0, c.r, c.tp) if sp else G)).sum().backward()
        yield _close(f"{tag} input grad", x.grad, _shard(Xd.grad, -1, c.r, c.tp) if par else Xd.grad)
        yield _close(f"{tag} weight grad shard", layer.weight.grad, _shard(Wd.grad, 1, c.r, c.tp))
        if case["bias"]:
            yield _true(f"{tag} bias.sequence_parallel marks a partial grad",
                        param_meta(layer.bias).sequence_parallel is sp)
            # a partial (sequence-parallel) bias grad is summed over TP by finalize_model_grads
            grad = c.tp_sum(layer.bias.grad) if sp else layer.bias.grad
            yield _close(f"{tag} bias grad", grad, bd.grad)
        else:
            yield _true(f"{tag} no bias parameter", layer.bias is None)


def _vocab_parallel_embedding(c):
    HID = 5
    # (vocab, padded): 10 in 32 leaves some ranks with only padding rows
    for vocab, padded, rs in [(10, 32, False), (10, 32, True), (29, 32, False), (29, 32, True)]:
        tag = f"[vocab={vocab},padded={padded},reduce_scatter={rs}]"
        ids = torch.randint(0, vocab, (S, B), generator=torch.Generator().manual_seed(80 + vocab))
        ids[0, 0], ids[-1, -1] = 0, vocab - 1
        E = _rand(vocab, HID, seed=81)
        G = _rand(S, B, HID, seed=82)
        Ed = E.clone().requires_grad_()
        Y = F.embedding(ids, Ed)
        (Y * G).sum().backward()
        layer = VocabParallelEmbedding(padded, HID, group=c.group, unpadded_vocab_size=vocab,
                                       reduce_scatter_embeddings=rs, params_dtype=DT)
        per = padded // c.tp
        yield _true(f"{tag} vocab range", (layer.vocab_start, layer.vocab_end) == (c.r * per, (c.r + 1) * per),
                    f"{(layer.vocab_start, layer.vocab_end)}")
        # padding rows hold garbage here: they must never be looked up
        table = torch.cat([E, torch.full((padded - vocab, HID), 1e3, dtype=DT)])
        with torch.no_grad():
            layer.weight.copy_(_shard(table, 0, c.r, c.tp))
        y = layer(ids)
        yield _close(f"{tag} output", y, _shard(Y, 0, c.r, c.tp) if rs else Y)
        (y * (_shard(G, 0, c.r, c.tp) if rs else G)).sum().backward()
        yield _close(f"{tag} weight grad shard (padding rows zero)", layer.weight.grad,
                     _shard(_pad_rows(Ed.grad, padded), 0, c.r, c.tp))


def _vocab_parallel_cross_entropy(c):
    Sx, Bx = 6, 2
    # (vocab, padded, vocab_size argument, dtype); 10 in 512: at TP=4 ranks 1-3 (at TP=2
    # rank 1) hold only padding columns
    cases = [(37, 40, 37, torch.float32), (10, 512, 10, torch.float32), (48, 48, None, torch.float32),
             (10, 512, 10, torch.float64), (37, 40, 37, torch.bfloat16)]
    for vocab, padded, vocab_arg, dtype in cases:
        tag = f"[vocab={vocab},padded={padded},vocab_size={vocab_arg},{dtype}]"
        gen = torch.Generator().manual_seed(90 + vocab)
        logits = (3 * torch.randn(Sx, Bx, padded, generator=gen)).to(dtype)
        logits[..., vocab:] = 30.0  # would dominate the softmax if padding were not ignored
        target = torch.randint(0, vocab, (Sx, Bx), generator=gen)
        target[0, 0], target[-1, -1] = 0, vocab - 1
        w = torch.rand(Sx, Bx, generator=gen, dtype=torch.float64)
        Ld = logits[..., :vocab].double().requires_grad_()
        loss_d = F.cross_entropy(Ld.reshape(-1, vocab), target.reshape(-1), reduction="none").view(Sx, Bx)
        (loss_d * w).sum().backward()
        local = _shard(logits, -1, c.r, c.tp)
        x = local.clone().requires_grad_()
        loss = vocab_parallel_cross_entropy(x, target, vocab_arg, c.group)
        yield _true(f"{tag} loss is fp32", loss.dtype == torch.float32, str(loss.dtype))
        yield _close(f"{tag} per-token loss", loss, loss_d, rtol=1e-5, atol=0.0, elementwise=True)
        yield _equal(f"{tag} logits not modified", x.detach(), local)
        (loss * w.float()).sum().backward()
        yield _true(f"{tag} grad dtype", x.grad is not None and x.grad.dtype == dtype)
        tol = dict(rtol=1e-2, atol=0.0) if dtype == torch.bfloat16 else dict(rtol=1e-5, atol=0.0)
        yield _close(f"{tag} logits grad shard", x.grad, _shard(_pad_rows(Ld.grad, padded, dim=-1), -1, c.r, c.tp),
                     **tol)
        cols = torch.arange(c.r * (padded // c.tp), (c.r + 1) * (padded // c.tp))
        yield _true(f"{tag} padding columns get exactly zero grad",
                    x.grad is not None and bool((x.grad[..., cols >= vocab] == 0).all()))
    # explicit group argument
    logits = _rand(Sx, Bx, 8 * c.tp, seed=95).float()
    target = torch.randint(0, 8 * c.tp, (Sx, Bx), generator=torch.Generator().manual_seed(96))
    loss = vocab_parallel_cross_entropy(_shard(logits, -1, c.r, c.tp), target, None, c.group)
    yield _close("explicit group", loss, F.cross_entropy(logits.view(-1, 8 * c.tp), target.view(-1),
                                                         reduction="none").view(Sx, Bx), rtol=1e-5, elementwise=True)

# ----------------------------------------------------------------------------- RNG


def _rng_tracker(c):
    tracker = get_rng_tracker()
    ones = torch.ones(4096)

    def drop():
        return F.dropout(ones, 0.5, True)

    model_parallel_seed(1234, c.r, 0, "cpu")
    outside = drop()
    with tracker.fork():
        inside = drop()
    with tracker.fork():
        inside2 = drop()
    after = drop()
    # the default generator is untouched by fork(): same stream as without the forks
    torch.manual_seed(1234)
    ref_first, ref_second = drop(), drop()
    yield _equal("default RNG stream unaffected by fork", torch.stack([outside, after]),
                 torch.stack([ref_first, ref_second]))
    yield _true("fork state advances between forks", not torch.equal(inside, inside2))
    outs, ins = c.all_gather(outside), c.all_gather(inside)
    for k in range(c.tp):
        yield _equal(f"dropout outside fork identical on TP rank {k}", outs[k], outside)
        for j in range(k):
            yield _true(f"dropout inside fork differs between TP ranks {j} and {k}", not torch.equal(ins[j], ins[k]))
    # the same TP rank in another data-parallel replica draws the same TP-region mask
    other = [torch.empty_like(inside) for _ in range(c.groups.dp_size)]
    dist.all_gather(other, inside, group=c.groups.dp)
    for k in range(c.groups.dp_size):
        yield _equal(f"fork dropout identical across DP replica {k}", other[k], inside)
    # get_states / set_states replay
    saved = tracker.get_states()
    with tracker.fork():
        first = drop()
    tracker.set_states(saved)
    with tracker.fork():
        again = drop()
    yield _equal("set_states replays the fork stream", again, first)
    # hidden_dropout: replicated activations use the default RNG, sequence-parallel shards the TP RNG
    model_parallel_seed(99, c.r, 0, "cpu")
    rep = hidden_dropout(ones, 0.5, True, sequence_parallel=False)
    spd = hidden_dropout(ones, 0.5, True, sequence_parallel=True)
    reps, sps = c.all_gather(rep), c.all_gather(spd)
    yield _true("hidden_dropout (replicated) identical across TP", all(torch.equal(t, rep) for t in reps))
    yield _true("hidden_dropout (sequence parallel) differs across TP",
                all(not torch.equal(sps[j], sps[k]) for k in range(c.tp) for j in range(k)))
    yield _true("hidden_dropout is the identity in eval mode",
                torch.equal(hidden_dropout(ones, 0.5, False, sequence_parallel=True), ones))
    # attention dropout acts on TP-split heads: it must draw from the tracker, leaving the
    # default generator (shared by the TP ranks) untouched
    cfg = TransformerConfig(tensor_model_parallel_size=c.tp, num_layers=1, hidden_size=32, num_attention_heads=4,
                            seq_length=S, attention_dropout=0.5, hidden_dropout=0.0)
    attn = SelfAttention(cfg, c.group)
    with torch.no_grad():
        for i, p in enumerate(attn.parameters()):
            p.copy_(_rand(*p.shape, seed=120 + i, dtype=p.dtype) * 0.3)
    x = _rand(S, B, 32, seed=130, dtype=torch.float32)
    model_parallel_seed(7, c.r, 0, "cpu")
    default_before, tracker_before = torch.get_rng_state(), tracker.get_states()
    y_train = attn.train()(x)
    yield _true("attention dropout leaves the default RNG untouched",
                torch.equal(torch.get_rng_state(), default_before))
    yield _true("attention dropout advances the TP RNG state",
                not all(torch.equal(v, tracker.get_states()[k]) for k, v in tracker_before.items()))
    yield _true("attention dropout is applied in training", not torch.equal(y_train, attn.eval()(x)))

# ----------------------------------------------------------------------------- models


def _config(tp, sp, *, vocab, heads, gqa, pos, norm, swiglu, bias, untie, divisible_by=128, **kw):
    return TransformerConfig(
        tensor_model_parallel_size=tp, sequence_parallel=sp, num_layers=2, hidden_size=32,
        num_attention_heads=heads, group_query_attention=gqa is not None, num_query_groups=gqa,
        seq_length=8, position_embedding_type=pos, normalization=norm, swiglu=swiglu,
        add_bias_linear=bias, untie_embeddings_and_output_weights=untie, hidden_dropout=0.0,
        attention_dropout=0.0, make_vocab_size_divisible_by=divisible_by, vocab_size=vocab, **kw)


def _expected_shard(dense, p, c, vocab):
    """This rank's expected value of TP parameter p, from the TP=1 model's `dense` tensor."""
    meta = param_meta(p)
    if meta.unpadded_size is not None:  # vocab-padded table: paddings differ by TP
        dense = _pad_rows(dense[:vocab], full_shape(p, c.tp)[meta.partition_dim], dim=meta.partition_dim)
    if meta.tensor_parallel:
        return _shard(dense, meta.partition_dim, c.r, c.tp, meta.partition_stride)
    return dense


def _take_shard_matches_reference(c):
    full = _rand(24, 5, seed=110)
    for dim, stride in [(0, 1), (0, 2), (1, 1)]:
        t = full if dim == 0 else full.t().contiguous()
        if t.shape[dim] % (stride * c.tp):
            continue
        yield _equal(f"take_shard dim={dim} stride={stride}", take_shard(t, dim, stride, c.r, c.tp),
                     _shard(t, dim, c.r, c.tp, stride))


def _init_layout_free(c):
    seed, vocab = 1234, 10
    cfg = _config(c.tp, False, vocab=vocab, heads=8, gqa=max(2, c.tp), pos="learned_absolute",
                  norm="LayerNorm", swiglu=True, bias=True, untie=True)
    cfg.validate()
    cfg1 = dataclasses.replace(cfg, tensor_model_parallel_size=1)
    yield _true("vocab padding differs between TP=1 and this TP", cfg1.padded_vocab_size != cfg.padded_vocab_size)
    dense_model, model = GPTModel(cfg1, c.single), GPTModel(cfg, c.groups)
    initialize_parameters(dense_model, seed, 0, 1)
    initialize_parameters(model, seed, c.r, c.tp)
    dense = dict(dense_model.named_parameters())
    params = dict(model.named_parameters())
    yield _true("same parameter names", sorted(dense) == sorted(params), f"{sorted(dense)} vs {sorted(params)}")
    for name, p in params.items():
        if name not in dense:
            continue
        if param_meta(p).unpadded_size is not None:
            yield _true(f"{name}: TP=1 padding rows are zero", bool((dense[name][vocab:] == 0).all()))
        yield _equal(f"{name}: shard of the TP=1 parameter", p.detach(),
                     _expected_shard(dense[name].detach(), p, c, vocab))
        full = init_full_tensor(p, seed, c.tp)
        yield _true(f"{name}: init_full_tensor has the full shape",
                    list(full.shape) == full_shape(p, c.tp), f"{list(full.shape)} vs {full_shape(p, c.tp)}")
        if param_meta(p).tensor_parallel:
            yield _equal(f"{name}: shard of init_full_tensor", p.detach(),
                         _shard(full, param_meta(p).partition_dim, c.r, c.tp, param_meta(p).partition_stride))
    # guards against a vacuous pass: distinct keys draw distinct values, stds are as configured
    qkv = [dense[f"decoder.layers.{i}.self_attention.linear_qkv.weight"] for i in (0, 1)]
    yield _true("layers draw different values", not torch.equal(qkv[0], qkv[1]))
    yield _true("linear_qkv std ~ init_method_std", abs(qkv[0].std().item() - 0.02) < 0.003, f"{qkv[0].std().item()}")
    proj = dense["decoder.layers.0.self_attention.linear_proj.weight"]
    yield _true("linear_proj std ~ init_method_std / sqrt(2 L)", abs(proj.std().item() - 0.01) < 0.002,
                f"{proj.std().item()}")
    yield _true("LayerNorm weight is ones", bool((dense["decoder.layers.0.input_layernorm.weight"] == 1).all()))
    other = GPTModel(cfg1, c.single)
    initialize_parameters(other, seed + 1, 0, 1)
    yield _true("another seed gives other values",
                not torch.equal(other.word_embeddings.weight, dense["word_embeddings.weight"]))
    # a later pipeline stage (layer_offset 1) gets the same layer parameters as the full model
    stage = GPTModel(cfg, c.groups, pre_process=False, post_process=True, num_layers=1, layer_offset=1)
    initialize_parameters(stage, seed, c.r, c.tp)
    for name, p in stage.named_parameters():
        if name.startswith("decoder.layers.0."):
            ref = dense[name.replace("decoder.layers.0.", "decoder.layers.1.")]
            yield _equal(f"stage layer {name}: shard of TP=1 layer 2", p.detach(),
                         _expected_shard(ref.detach(), p, c, vocab))


MODEL_CONFIGS = {
    "abs_layernorm_gelu_bias_tied": dict(vocab=50, heads=4, gqa=None, pos="learned_absolute", norm="LayerNorm",
                                         swiglu=False, bias=True, untie=False, divisible_by=8),
    "rope_rmsnorm_swiglu_gqa_nobias_untied": dict(vocab=10, heads=8, gqa=2, pos="rope", norm="RMSNorm",
                                                  swiglu=True, bias=False, untie=True),
    "rope_layernorm_swiglu_gqa_bias_tied": dict(vocab=10, heads=8, gqa=2, pos="rope", norm="LayerNorm",
                                                swiglu=True, bias=True, untie=False),
    "abs_rmsnorm_gelu_nobias_untied": dict(vocab=50, heads=4, gqa=None, pos="learned_absolute", norm="RMSNorm",
                                           swiglu=False, bias=False, untie=True, divisible_by=8),
    # Qwen3: per-head q/k norms (each TP rank's heads: partial grads, SP or not), kv-channels != hidden / heads
    "qwen3_qk_norm": dict(vocab=10, heads=8, gqa=2, pos="rope", norm="RMSNorm", swiglu=True, bias=False,
                          untie=True, qk_layernorm=True, kv_channels=6),
}


def _model_parity(c, spec, sp):
    seed, Bm = 4321, 2
    spec = dict(spec)
    if spec["gqa"] is not None:
        spec["gqa"] = max(spec["gqa"], c.tp)  # query groups must be a multiple of TP
    cfg = _config(c.tp, sp, **spec)
    cfg.validate()
    cfg1 = dataclasses.replace(cfg, tensor_model_parallel_size=1, sequence_parallel=False)
    vocab = cfg.vocab_size
    gen = torch.Generator().manual_seed(77)
    ids = torch.randint(0, vocab, (Bm, cfg.seq_length), generator=gen)
    labels = torch.randint(0, vocab, (Bm, cfg.seq_length), generator=gen)
    labels[0, 0], ids[-1, -1] = vocab - 1, vocab - 1
    w = torch.rand(Bm, cfg.seq_length, generator=gen)

    dense_model, model = GPTModel(cfg1, c.single), GPTModel(cfg, c.groups)
    initialize_parameters(dense_model, seed, 0, 1)
    initialize_parameters(model, seed, c.r, c.tp)
    # shake off the init's zero biases / unit norms so their gradients and effects matter
    with torch.no_grad():
        dense = dict(dense_model.named_parameters())
        for name, p in model.named_parameters():
            p1 = dense[name]
            if param_meta(p1).init_method != "normal":
                p1.add_(_rand(*p1.shape, seed=zlib.crc32(name.encode()), dtype=p1.dtype) * 0.1)
                p.copy_(_expected_shard(p1, p, c, vocab))

    loss1 = dense_model(ids, labels)
    loss = model(ids, labels)
    yield _true("loss shape [b, s]", tuple(loss.shape) == (Bm, cfg.seq_length), str(tuple(loss.shape)))
    yield _close("per-token loss", loss, loss1, rtol=1e-5, atol=0.0, elementwise=True)
    (loss1 * w).sum().backward()
    (loss * w).sum().backward()
    dense = dict(dense_model.named_parameters())
    for name, p in model.named_parameters():
        g = p.grad
        if g is not None and param_meta(p).sequence_parallel:
            g = c.tp_sum(g)  # partial over the sequence shards or the heads (finalize_model_grads sums it)
        d = dense[name]
        if param_meta(p).unpadded_size is not None:
            yield _true(f"{name}: TP=1 padding rows get zero grad", bool((d.grad[vocab:] == 0).all()))
        yield _close(f"grad {name}", g, _expected_shard(d.grad, p, c, vocab), rtol=2e-5, atol=0.0)
    with torch.no_grad():
        logits1, logits = dense_model(ids), model(ids)
    yield _close("logits shard", logits, _expected_shard(logits1.transpose(0, -1), model.output_weight(), c,
                                                         vocab).transpose(0, -1), rtol=1e-5, atol=0.0)


# ----------------------------------------------------------------------------- driver


CASES = {
    "map_copy_to": _map_copy_to,
    "map_reduce_from": _map_reduce_from,
    "map_scatter_to": _map_scatter_to,
    "map_gather_from": _map_gather_from,
    "map_scatter_to_sequence": _map_scatter_to_sequence,
    "map_gather_from_sequence": _map_gather_from_sequence,
    "map_reduce_scatter_to_sequence": _map_reduce_scatter_to_sequence,
    "map_explicit_group_and_errors": _map_explicit_group_and_errors,
    "column_parallel_linear": _column_parallel_linear,
    "row_parallel_linear": _row_parallel_linear,
    "vocab_parallel_embedding": _vocab_parallel_embedding,
    "vocab_parallel_cross_entropy": _vocab_parallel_cross_entropy,
    "rng_tracker": _rng_tracker,
    "take_shard_matches_reference": _take_shard_matches_reference,
    "init_layout_free": _init_layout_free,
    **{f"gpt_parity_{name}" + ("_sp" if sp else ""): functools.partial(_model_parity, spec=spec, sp=sp)
       for name, spec in MODEL_CONFIGS.items() for sp in (False, True)},
}


def _run_cases(groups):
    """Runs on every rank, every case in the same order: {case: [(what, passed, detail), ...]}."""
    torch.manual_seed(0)
    ctx = Ctx(groups)
    return {name: list(case(ctx)) for name, case in CASES.items()}


@pytest.fixture(scope="module", params=TP_SIZES, ids=lambda tp: f"tp{tp}")
def tp_run(request):
    tp = request.param
    return tp, spawn(WORLD, _run_cases, tp=tp, timeout=300)


@pytest.mark.parametrize("case", list(CASES))
def test_tensor_parallel(tp_run, case):
    tp, per_rank = tp_run
    assert all(results[case] for results in per_rank), f"TP={tp} {case}: compared nothing"
    failures = [f"rank {rank}: {what}: {detail}"
                for rank, results in enumerate(per_rank) for what, passed, detail in results[case] if not passed]
    assert not failures, f"TP={tp} {case}: {len(failures)} failed comparison(s)\n" + "\n".join(failures[:40])
