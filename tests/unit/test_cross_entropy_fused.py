"""--cross-entropy-loss-fusion (tensor_parallel/cross_entropy_fused.py) against the unfused vocab-parallel
cross entropy: the loss and the gradient w.r.t. the logits, with vocabulary padding, at TP 1 and TP 2,
in fp32 and bf16; no fp32 copy of [tokens, vocab] and no clone of the logits (a dispatch-mode record)."""
import pytest
import torch
import torch.distributed as dist

from megatron.core.comm import PlanGroup
from megatron.core.tensor_parallel import cross_entropy_fused
from megatron.core.tensor_parallel.cross_entropy import vocab_parallel_cross_entropy
from megatron.core.tensor_parallel.cross_entropy_fused import fused_vocab_parallel_cross_entropy
from tests.harness import spawn
from tests.op_record import OpRecord

S, B, V_PADDED, VOCAB = 6, 3, 16, 13  # the last 3 columns are padding: all on TP rank 1 of 2
U = 2.0 ** -24  # fp32 unit roundoff


def _problem():
    g = torch.Generator().manual_seed(11)
    logits = torch.randn(S, B, V_PADDED, generator=g) * 3
    logits[..., VOCAB:] = 0.0  # padding logits: what a zero padding row of the output weight gives
    target = torch.randint(0, VOCAB, (S, B), generator=g)
    grad = torch.rand(S, B, generator=g) + 0.5
    return logits, target, grad


def _run(fn, logits, target, grad, group):
    x = logits.clone().requires_grad_()
    loss = fn(x, target, VOCAB, group)
    loss.backward(grad)
    return _back(loss.detach(), x.grad)


def _back(*tensors):
    """As (dtype name, fp32 numpy array): a tensor would go back through shared memory that the exiting
    rank takes with it (bf16 widens to fp32 exactly)."""
    return tuple((str(t.dtype), t.float().numpy()) for t in tensors)


def _t(pair):
    return torch.from_numpy(pair[1])


def _tolerances(logits, grad):
    """Absolute bounds for two fp32 evaluations of lse - x_t and its gradient that differ in the order of
    their sums: each sum of V terms is within (V - 1) u relatively, the log and exp add a few u times
    their argument; the gradient (p - onehot) g moves by p (|d lse| + |d x|) |g|."""
    scale = 1.0 + logits.abs().max().item()
    loss_tol = (V_PADDED + 8) * U * scale
    return loss_tol, 4 * loss_tol * grad.abs().max().item()


def _body(groups, dtype):
    torch.manual_seed(0)
    logits, target, grad = _problem()
    logits = logits.to(dtype)
    singles = [dist.new_group([r]) for r in range(dist.get_world_size())]
    mine = singles[dist.get_rank()]
    shard = logits.chunk(groups.tp_size, dim=-1)[groups.tp_rank]
    out = {}
    for name, fn in (("fused", fused_vocab_parallel_cross_entropy), ("unfused", vocab_parallel_cross_entropy)):
        out[name + "-tp1"] = _run(fn, logits, target, grad, mine)
        out[name + "-tp2"] = _run(fn, shard, target, grad, groups.tp)
    return out


def _full_grad(ranks, name):
    return torch.cat([_t(r[name][1]) for r in ranks], dim=-1)


def test_fused_matches_unfused_fp32_at_tp1_and_tp2():
    ranks = spawn(2, _body, torch.float32, tp=2)
    logits, _, grad = _problem()
    loss_tol, grad_tol = _tolerances(logits, grad)
    ref_loss, ref_grad = (_t(v) for v in ranks[0]["unfused-tp1"])
    for name in ("fused-tp1", "fused-tp2", "unfused-tp2"):
        loss = _t(ranks[0][name][0])
        full = _t(ranks[0][name][1]) if name.endswith("tp1") else _full_grad(ranks, name)
        assert (loss - ref_loss).abs().max().item() <= loss_tol, name
        assert (full - ref_grad).abs().max().item() <= grad_tol, name
        assert torch.equal(full[..., VOCAB:], torch.zeros_like(full[..., VOCAB:])), f"{name}: padding gradient"
    # the two TP ranks agree on the loss they both return
    assert (ranks[0]["fused-tp2"][0][1] == ranks[1]["fused-tp2"][0][1]).all()


def test_fused_matches_unfused_bf16():
    ranks = spawn(2, _body, torch.bfloat16, tp=2)
    logits, _, grad = _problem()
    loss_tol, grad_tol = _tolerances(logits.bfloat16().float(), grad)
    ref_loss, ref_grad = (_t(v) for v in ranks[0]["unfused-tp1"])
    for name in ("fused-tp1", "fused-tp2"):
        full = _t(ranks[0][name][1]) if name.endswith("tp1") else _full_grad(ranks, name)
        assert ranks[0][name][1][0] == "torch.bfloat16"
        assert (_t(ranks[0][name][0]) - ref_loss).abs().max().item() <= loss_tol, name
        # both round an fp32 gradient to bf16 once: within one bf16 ulp (2^-8 relative) of each other
        bound = grad_tol + 2.0 ** -8 * ref_grad.float().abs()
        assert ((full.float() - ref_grad.float()).abs() <= bound).all(), name


def _one_rank_record(groups, fused):
    logits, target, grad = _problem()
    leaf = logits.bfloat16().requires_grad_()
    x = leaf * 1  # the logits come out of a layer, as in the model (a leaf's .grad would be a copy)
    seen = []
    x.register_hook(lambda g: seen.append(g.data_ptr()))
    fn = fused_vocab_parallel_cross_entropy if fused else vocab_parallel_cross_entropy
    record = OpRecord()
    with record:
        fn(x, target, VOCAB, groups.tp).backward(grad)
    biggest_fp32 = max((o.numel() for _, outs in record.calls for o in outs if o.dtype == torch.float32), default=0)
    names = record.names()
    return biggest_fp32, names, seen == [x.data_ptr()]


def _records(groups):
    unfused = _one_rank_record(groups, False)
    cross_entropy_fused.CHUNK_BYTES = 4 * 4 * V_PADDED  # four rows per chunk
    return _one_rank_record(groups, True), unfused


def test_fused_keeps_no_fp32_logits_copy_and_clones_nothing():
    (biggest, names, in_place), (_, unfused_names, _) = spawn(1, _records)[0]
    assert biggest <= 4 * V_PADDED, f"an fp32 tensor of {biggest} elements: more than a chunk"
    assert "clone" not in names and in_place, "the gradient should be written over the logits"
    assert "clone" not in unfused_names, "the unfused path masks the padding by index, without a clone"


@pytest.mark.parametrize("fused", [True, False])
def test_padding_only_rank(fused):
    # TP 2 with 6 real columns of 16: rank 1 holds padding only; the loss and gradient still match TP 1
    ranks = spawn(2, _padding_only, fused, tp=2)
    ref_loss, ref_grad = (_t(v) for v in ranks[0]["tp1"])
    loss_tol, grad_tol = _tolerances(*_problem()[::2])
    assert (_t(ranks[0]["tp2"][0]) - ref_loss).abs().max().item() <= loss_tol
    full = torch.cat([_t(r["tp2"][1]) for r in ranks], dim=-1)
    assert (full - ref_grad).abs().max().item() <= grad_tol


def _padding_only(groups, fused):
    logits, target, grad = _problem()
    logits[..., 6:] = 0.0
    target = target % 6
    fn = fused_vocab_parallel_cross_entropy if fused else vocab_parallel_cross_entropy
    single = [dist.new_group([r]) for r in range(2)][groups.tp_rank]
    out = {}
    for name, x, group in (("tp1", logits, single), ("tp2", logits.chunk(2, -1)[groups.tp_rank], groups.tp)):
        y = x.clone().requires_grad_()
        loss = fn(y, target, 6, group)
        loss.backward(grad)
        out[name] = _back(loss.detach(), y.grad)
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_path_matches_eager(monkeypatch, dtype):
    """The path CUDA runs (the same two functions under torch.compile, over all tokens at once), compiled
    here by inductor's CPU backend, against the eager chunked path: loss and gradient within the fp32
    bounds above (bf16: plus one bf16 rounding of the gradient); padding columns' gradient zero."""
    logits, target, grad = _problem()
    logits = logits.to(dtype)
    single = PlanGroup(1)  # TP 1: no collective is called
    eager = _run(fused_vocab_parallel_cross_entropy, logits, target, grad, single)
    ran = []
    compile_ = cross_entropy_fused.compiled
    monkeypatch.setattr(cross_entropy_fused, "use_compiled", lambda x: True)
    monkeypatch.setattr(cross_entropy_fused, "compiled", lambda fn: ran.append(fn.__name__) or compile_(fn))
    fused = _run(fused_vocab_parallel_cross_entropy, logits, target, grad, single)
    assert ran == ["_lse_and_target", "_grad_of"], "the compiled path should run forward and backward"
    loss_tol, grad_tol = _tolerances(logits.float(), grad)
    assert fused[1][0] == str(dtype)
    assert (_t(fused[0]) - _t(eager[0])).abs().max().item() <= loss_tol
    # bf16: the two may round a near-tie apart, one ulp: up to 2^-7 of the value (8 significant bits)
    bound = grad_tol + (2.0 ** -7 * _t(eager[1]).abs() if dtype == torch.bfloat16 else 0.0)
    assert ((_t(fused[1]) - _t(eager[1])).abs() <= bound).all()
    assert not _t(fused[1])[..., VOCAB:].any()


def test_compiled_functions_with_targets_on_other_ranks():
    """A TP rank's view: targets outside its columns (inside False) give no target logit and no -1;
    padding columns out of the log-sum-exp; compiled equals eager within the fp32 bounds."""
    from megatron.core.fusions._common import compiled
    logits, target, grad = _problem()
    x, t, g = logits.reshape(-1, V_PADDED)[:, 8:], target.reshape(-1) - 8, grad.reshape(-1)
    inside = (t >= 0) & (t < 8)
    local = t.masked_fill(~inside, 0)
    valid = VOCAB - 8
    lse, tl = cross_entropy_fused._lse_and_target(x, local, inside, valid)
    assert torch.allclose(lse, torch.logsumexp(x[:, :valid].double(), -1).float(), rtol=0, atol=8 * U * 10)
    assert not tl[~inside].any() and torch.equal(tl[inside], x[inside, local[inside]])
    c_lse, c_tl = compiled(cross_entropy_fused._lse_and_target)(x, local, inside, valid)
    loss_tol, grad_tol = _tolerances(logits, grad)
    assert (c_lse - lse).abs().max().item() <= loss_tol and torch.equal(c_tl, tl)
    ref = cross_entropy_fused._grad_of(x, lse, local, inside, g, valid)
    got = compiled(cross_entropy_fused._grad_of)(x, lse, local, inside, g, valid)
    assert (got - ref).abs().max().item() <= grad_tol and not got[:, valid:].any()
    rows = torch.nonzero(inside).squeeze(-1)
    expected = torch.exp(x[:, :valid].double() - lse[:, None].double()) * g[:, None].double()
    expected[rows, local[rows]] -= g[rows].double()
    assert torch.allclose(ref[:, :valid].double(), expected, rtol=0, atol=grad_tol)


def test_which_path_runs(monkeypatch):
    assert not cross_entropy_fused.use_compiled(torch.zeros(1))  # CPU: the eager chunks
    monkeypatch.setattr(cross_entropy_fused, "importable", lambda module: module == "triton")
    assert "torch.compile" in cross_entropy_fused.implementation("cuda")
    assert "chunked" in cross_entropy_fused.implementation("cpu")
    monkeypatch.setattr(cross_entropy_fused, "importable", lambda module: False)
    assert "chunked" in cross_entropy_fused.implementation("cuda")  # no triton: no GPU compiler


def _compiled_tp2(groups):
    cross_entropy_fused.use_compiled = lambda x: True  # this spawned process only: the CUDA path, on CPU
    logits, target, grad = _problem()
    shard = logits.chunk(groups.tp_size, dim=-1)[groups.tp_rank]
    return _run(fused_vocab_parallel_cross_entropy, shard, target, grad, groups.tp)


def test_compiled_path_at_tp2():
    """The compiled path's TP combination (each rank's log-sum-exp and target logit, two all-reduces, then the
    global softmax read per rank) against the unfused loss at TP 1; rank 1 holds the padding."""
    ranks = spawn(2, _compiled_tp2, tp=2)
    logits, target, grad = _problem()
    ref_loss, ref_grad = _run(vocab_parallel_cross_entropy, logits, target, grad, PlanGroup(1))
    loss_tol, grad_tol = _tolerances(logits, grad)
    assert (_t(ranks[0][0]) - _t(ref_loss)).abs().max().item() <= loss_tol
    assert torch.equal(_t(ranks[0][0]), _t(ranks[1][0]))
    full = torch.cat([_t(r[1]) for r in ranks], dim=-1)
    assert (full - _t(ref_grad)).abs().max().item() <= grad_tol and not full[..., VOCAB:].any()
