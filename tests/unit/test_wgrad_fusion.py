"""Gradient-accumulation fusion (tensor_parallel/wgrad_fusion.py): the torch path of main += g^T x against
an fp64 reference written here; the linear layers' weight gradients added into their grad sink (and no
gradient tensor of the weight made), the sink told once per backward; DDP as the sink over a real step."""
import pytest
import torch

from megatron.core.comm import PlanGroup
from megatron.core.pipeline_parallel.backward_split import backward_input
from megatron.core.tensor_parallel import wgrad_fusion
from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
from megatron.core.tensor_parallel.param_meta import set_grad_sink
from tests import rounding
from tests.harness import spawn

ONE = PlanGroup(1)
U = 2.0 ** -24  # fp32 unit roundoff


def _bound(main, g, x):
    """|fl(main + g^T x) - exact| for a sum of t products and main in fp32: at most (t + 1) u times
    the sum of the magnitudes (products of bf16 or fp32 values are exact or rounded once)."""
    t = g.shape[0]
    return (t + 2) * U * (main.double().abs() + g.double().abs().t() @ x.double().abs())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_accumulate_adds_the_product_into_fp32(dtype):
    gen = torch.Generator().manual_seed(0)
    g = torch.randn(37, 5, generator=gen).to(dtype)
    x = torch.randn(37, 7, generator=gen).to(dtype)
    main = torch.randn(5, 7, generator=gen)
    exact = main.double() + g.double().t() @ x.double()
    bound = _bound(main, g, x)
    wgrad_fusion.accumulate(main, g, x)
    assert main.dtype == torch.float32
    assert ((main.double() - exact).abs() <= bound).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_first_gradient_writes_the_product_without_reading(dtype):
    """first=True (a step's first gradient of the parameter, beta 0): main = g^T x whatever main held."""
    gen = torch.Generator().manual_seed(1)
    g = torch.randn(37, 5, generator=gen).to(dtype)
    x = torch.randn(37, 7, generator=gen).to(dtype)
    main = torch.full((5, 7), float("nan"))
    wgrad_fusion.accumulate(main, g, x, first=True)
    exact = g.double().t() @ x.double()
    assert ((main.double() - exact).abs() <= _bound(torch.zeros(5, 7), g, x)).all()


class _Sink:
    """The grad-sink contract as DDP fulfils it: a buffer per parameter, a count of gradients added."""

    def __init__(self, params):
        self.main = {id(p): torch.zeros(p.shape, dtype=torch.float32) for p in params}
        self.added = {id(p): 0 for p in params}

    def grad_target(self, p):
        return self.main[id(p)]

    def grad_is_first(self, p):  # the buffers start zeroed: every gradient adds
        return False

    def grad_added(self, p):
        self.added[id(p)] += 1


def _layers():
    yield "column", ColumnParallelLinear(6, 8, group=ONE)
    yield "row", RowParallelLinear(8, 6, group=ONE)
    yield "column no bias", ColumnParallelLinear(6, 8, group=ONE, bias=False)


@pytest.mark.parametrize("name,layer", list(_layers()), ids=lambda v: v if isinstance(v, str) else "")
def test_linear_adds_its_weight_gradient_into_the_sink(name, layer):
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn(p.shape, generator=gen))
    xs = [torch.randn(5, 2, layer.weight.shape[1], generator=gen).requires_grad_() for _ in range(2)]
    gys = [torch.randn(5, 2, layer.weight.shape[0], generator=gen) for _ in range(2)]
    for x, gy in zip(xs, gys):  # reference: autograd, two microbatches into .grad
        layer(x)[0].backward(gy)
    want_w = layer.weight.grad.clone()
    want_b = None if layer.bias is None else layer.bias.grad.clone()
    want_x = [x.grad.clone() for x in xs]
    layer.zero_grad(set_to_none=True)
    for x in xs:
        x.grad = None

    sink = _Sink([layer.weight])
    set_grad_sink(layer.weight, sink)
    made = []
    # a gradient tensor reaching the weight (torch runs the hook with None where the function returned none)
    layer.weight.register_hook(lambda g: made.append(g) if g is not None else None)
    for x, gy in zip(xs, gys):
        layer(x)[0].backward(gy)
    set_grad_sink(layer.weight, None)
    assert layer.weight.grad is None and not made, "no gradient tensor of the weight"
    assert sink.added[id(layer.weight)] == 2, "told once per backward"
    # addmm onto the sink against autograd's mm then add: one sum of both microbatches' rows in two orders
    rows = torch.cat([x.detach().reshape(-1, x.shape[-1]) for x in xs])
    g = torch.cat([gy.reshape(-1, gy.shape[-1]) for gy in gys])
    bound = 2 * rounding.gamma(rows.shape[0], rows.dtype) * (g.abs().t() @ rows.abs())
    rounding.assert_within(sink.main[id(layer.weight)], want_w, bound, "weight")
    if want_b is not None:
        torch.testing.assert_close(layer.bias.grad, want_b, rtol=0, atol=0)
    for x, w in zip(xs, want_x):
        torch.testing.assert_close(x.grad, w, rtol=0, atol=0)


def test_input_without_grad_still_reaches_the_sink():
    layer = ColumnParallelLinear(4, 3, group=ONE, bias=False)
    sink = _Sink([layer.weight])
    set_grad_sink(layer.weight, sink)
    x = torch.randn(2, 1, 4)
    layer(x)[0].sum().backward()
    assert sink.added[id(layer.weight)] == 1
    torch.testing.assert_close(sink.main[id(layer.weight)], torch.ones(3, 2) @ x.reshape(2, 4), rtol=1e-6, atol=1e-6)


def test_zero_bubble_w_adds_the_weight_gradient_into_the_sink():
    # the executor's split (backward_split.py): B computes the input gradient alone, W (grad mode on, as
    # the executor runs it) adds the weight's into the sink and tells it once
    layer = ColumnParallelLinear(4, 3, group=ONE)
    sink = _Sink([layer.weight])
    set_grad_sink(layer.weight, sink)
    x = torch.randn(2, 1, 4, requires_grad=True)
    y = layer(x)[0]
    work = backward_input(y, torch.ones_like(y), x, {id(p): i for i, p in enumerate(layer.parameters())})
    assert sink.added[id(layer.weight)] == 0 and not sink.main[id(layer.weight)].any() and x.grad is not None
    assert layer.bias.grad is None
    work.run()
    assert sink.added[id(layer.weight)] == 1 and layer.weight.grad is None and layer.bias.grad is not None
    assert not sink.main[id(layer.weight)].requires_grad, "the buffer was drawn into autograd's graph"
    torch.testing.assert_close(sink.main[id(layer.weight)], torch.ones(3, 2) @ x.detach().reshape(2, 4),
                               rtol=1e-6, atol=1e-6)


# ---- DDP as the sink, one rank: a real step with and without fusion


def _gpt_step(groups, fusion, overlap, stale=False):
    from megatron.core.config import TransformerConfig
    from megatron.core.distributed import DistributedDataParallel
    from megatron.core.distributed.ddp_config import DistributedDataParallelConfig
    from megatron.core.models.gpt import GPTModel
    from megatron.core.optimizer import LRScheduler, MegatronOptimizer
    from megatron.core.tensor_parallel.initialization import initialize_parameters
    from megatron.core.tensor_parallel.random import model_parallel_seed
    from megatron.training.loop.training import train_step
    model_parallel_seed(5, 0, 0, torch.device("cpu"))
    cfg = TransformerConfig(num_layers=2, hidden_size=32, num_attention_heads=4, seq_length=16, hidden_dropout=0.0,
                            attention_dropout=0.0, untie_embeddings_and_output_weights=True)
    cfg.vocab_size = 100  # padded to 128
    model = GPTModel(cfg, groups, device="cpu")
    initialize_parameters(model, 5, 0, 1)
    ddp = DistributedDataParallel(model, groups, DistributedDataParallelConfig(overlap_grad_reduce=overlap,
                                                                              bucket_size=2000),
                                  gradient_accumulation_fusion=fusion)
    opt = MegatronOptimizer(ddp, groups, 1e-3, 0.1)
    sched = LRScheduler(opt, 1e-3, 1e-4, 100, 1, "cosine")
    gen = torch.Generator().manual_seed(9)
    batches = []
    for _ in range(3):
        t = torch.randint(0, 100, (2, 17), generator=gen)
        batches.append({"tokens": t[:, :-1], "labels": t[:, 1:], "loss_mask": torch.ones(2, 16)})
    if stale:  # what the last step left: every gradient must overwrite or be added after one that did
        for buf in ddp.buffers:
            buf.grad_data.fill_(float("nan"))
    grads = {}
    hooks = [p.register_hook(lambda g, n=n: grads.setdefault(n, []).append(g.shape) if g is not None else None)
             for n, p in model.named_parameters()]  # None: torch runs the hook of a fused weight without one
    orig = ddp.finish_grad_sync

    def finish(*a, **k):  # the buffers after the last microbatch, before the step
        started = [b.pending is None for b in ddp.buckets]
        orig(*a, **k)
        # numpy: a tensor would go back through shared memory that the exiting rank takes with it
        finish.snapshot = ({n: ddp.main_grad(p).numpy().copy() for n, p in model.named_parameters()}, started)
    ddp.finish_grad_sync = finish

    def fwd(model, batch):
        return {"lm loss": (model(batch["tokens"], labels=batch["labels"]), batch["loss_mask"])}
    train_step(model, ddp, opt, sched, batches, fwd, groups, 1)
    for h in hooks:
        h.remove()
    main, started = finish.snapshot
    return main, started, sorted(n for n in grads if n.endswith("weight") and "linear" in n or "output_layer" in n)


def test_ddp_fusion_gives_the_main_grads_of_autograd():
    ref, _, through_autograd = spawn(1, _gpt_step, False, False)[0]
    got, started, fused_seen = spawn(1, _gpt_step, True, True)[0]
    assert through_autograd and not fused_seen, f"linear weights reached autograd under fusion: {fused_seen}"
    assert all(started), "with overlap every bucket started its reduction during backward"
    for name, want in ref.items():
        torch.testing.assert_close(torch.from_numpy(got[name]), torch.from_numpy(want), rtol=1e-5, atol=1e-7,
                                   msg=name)


@pytest.mark.parametrize("fusion", [False, True])
def test_ddp_overwrites_last_steps_gradients(fusion):
    """start_step does not zero the buffers: a parameter's first gradient of a step is written, not added."""
    ref, _, _ = spawn(1, _gpt_step, False, False)[0]
    got, _, _ = spawn(1, _gpt_step, fusion, False, True)[0]
    for name, want in ref.items():
        torch.testing.assert_close(torch.from_numpy(got[name]), torch.from_numpy(want), rtol=1e-5, atol=1e-7,
                                   msg=name)


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = ColumnParallelLinear(6, 8, group=ONE)
        with torch.no_grad():  # the layer allocates uninitialised memory (set_init names what to fill it with)
            gen = torch.Generator().manual_seed(1)
            self.linear.weight.copy_(torch.randn(8, 6, generator=gen))
            self.linear.bias.copy_(torch.randn(8, generator=gen))
        self.unused = torch.nn.Parameter(torch.ones(3))  # no gradient ever: its main grad must be zeroed

    def forward(self, x):
        return self.linear(x)[0]


def _three_microbatches(groups, fusion):
    import copy

    from megatron.core.distributed import DistributedDataParallel
    torch.manual_seed(0)
    model = _Net()
    ref = copy.deepcopy(model)
    ddp = DistributedDataParallel(model, groups, gradient_accumulation_fusion=fusion)
    gen = torch.Generator().manual_seed(3)
    xs = [torch.randn(4, 2, 6, generator=gen) for _ in range(3)]
    for step in range(2):  # the second step over what the first left, made NaN
        ddp.start_step(len(xs))
        if step:
            for buf in ddp.buffers:
                buf.grad_data.fill_(float("nan"))
        for x in xs:
            model(x).square().sum().backward()
        ddp.finish_grad_sync()
    for x in xs:
        ref(x).square().sum().backward()
    refs = dict(ref.named_parameters())
    # the main grad is one sum over every microbatch's rows, in whatever order the GEMMs take them
    # (addmm onto the buffer, or autograd's .grad += per microbatch): bound that order, not a tolerance
    rows = torch.cat([x.reshape(-1, 6) for x in xs])
    g = 2 * torch.cat([ref(x).detach().reshape(-1, 8) for x in xs])
    bounds = {"linear.weight": 2 * rounding.gamma(rows.shape[0], rows.dtype) * (g.abs().t() @ rows.abs()),
              "linear.bias": rounding.sum_bound(g, 0)}
    return {n: (ddp.main_grad(p).numpy().copy(), None if refs[n].grad is None else refs[n].grad.numpy().copy(),
                bounds[n].numpy() if n in bounds else None) for n, p in model.named_parameters()}


@pytest.mark.parametrize("fusion", [False, True])
def test_ddp_sums_the_microbatches_over_a_stale_buffer(fusion):
    """Every microbatch's gradient in the main grad (the first written, the others added), each step."""
    got = spawn(1, _three_microbatches, fusion)[0]
    for name, (main, want, bound) in got.items():
        if want is None:  # no gradient ever: zeroed, exactly
            assert torch.equal(torch.from_numpy(main), torch.zeros(main.shape)), name
            continue
        rounding.assert_within(torch.from_numpy(main), torch.from_numpy(want), torch.from_numpy(bound), name)


def _grouped_experts_main_grads(groups, fusion):
    from megatron.core.distributed import DistributedDataParallel
    from megatron.core.transformer.moe import step_hooks
    from tests.unit.test_moe import cfg, layer
    m = layer(cfg(moe_grouped_gemm=True, moe_router_topk=2, moe_token_dispatcher_type="alltoall"))
    ddp = DistributedDataParallel(m, groups, gradient_accumulation_fusion=fusion)
    step_hooks.bind(m).start_iteration(1.0, 3)
    gen = torch.Generator().manual_seed(4)
    xs = [torch.randn(8, 2, 16, generator=gen) for _ in range(3)]
    seen = []  # the router's input rows and logits' gradient per microbatch: its weight gradient's bound
    plain = wgrad_fusion.linear_or_fused  # this spawned process only

    def recording(x, weight, bias=None):
        y = plain(x, weight, bias)
        if weight is m.router.weight:
            rows = x.detach()
            y.register_hook(lambda g: seen.append((rows, g)))
        return y
    wgrad_fusion.linear_or_fused = recording
    ddp.start_step(len(xs))
    for x in xs:
        m(x)[0].square().sum().backward()
    ddp.finish_grad_sync()
    rows, g = (torch.cat([pair[i] for pair in seen]) for i in (0, 1))
    router_bound = 2 * rounding.gamma(rows.shape[0], rows.dtype) * (g.abs().t() @ rows.abs())
    return {n: ddp.main_grad(p).numpy().copy() for n, p in m.named_parameters()}, router_bound.numpy()


def test_grouped_experts_sum_every_microbatch_into_their_sinks():
    """The experts' one grouped matmul hands each expert's gradient to its sink (wgrad_fusion.deposit):
    over three microbatches the main grads equal the hook's (.grad copied, then added) bit for bit: the same
    grouped product copied, then added, in the same order. The router is a fused linear (addmm onto the buffer
    against mm then add): within the bound of one sum of its rows in two orders.
    A one-process parity run cannot see a wrong deposit (the reference runs the same code)."""
    want, _ = spawn(1, _grouped_experts_main_grads, False)[0]
    got, router_bound = spawn(1, _grouped_experts_main_grads, True)[0]
    assert want.keys() == got.keys()
    for name in want:
        if name == "router.weight":
            rounding.assert_within(torch.from_numpy(got[name]), torch.from_numpy(want[name]),
                                   torch.from_numpy(router_bound), name)
        else:
            assert (got[name] == want[name]).all(), name
