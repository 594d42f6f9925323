"""bench/op_traffic.py's counting rules (what a GPU kernel of each kind of op reads, writes and
launches), and bench/traffic.py's training-step counts on fake tensors against real ones."""
import dataclasses

import torch

from bench import pair, traffic
from bench.op_traffic import OpTraffic, multi_tensor_launches
from tests.harness import spawn


def counted(fn):
    with OpTraffic() as t:
        fn()
    return t.ops


def test_views_and_allocations_move_nothing():
    x = torch.randn(8, 16)
    ops = counted(lambda: (x.view(16, 8), x.t(), x[:, :4], x.unsqueeze(0).expand(3, 8, 16), x.detach(),
                           x.split(4, dim=1), torch.empty(100), torch.empty_like(x)))
    assert ops == {}


def test_out_of_place_in_place_and_out():
    x, y = torch.randn(8, 16), torch.randn(8, 16)
    n = x.numel() * 4
    ops = counted(lambda: x + y)
    assert (ops["add"].launches, ops["add"].read, ops["add"].written) == (1, 2 * n, n)
    ops = counted(lambda: x.add_(y))                       # self is read and written
    assert (ops["add_"].read, ops["add_"].written) == (2 * n, n)
    out = torch.empty(8, 16)
    ops = counted(lambda: torch.add(x, y, out=out))        # out= is written only
    assert (ops["add"].read, ops["add"].written) == (2 * n, n)
    ops = counted(lambda: out.copy_(x))                    # a copy's destination is not read
    assert (ops["copy_"].read, ops["copy_"].written) == (n, n)
    ops = counted(lambda: out.zero_())
    assert (ops["zero_"].read, ops["zero_"].written) == (0, n)
    ops = counted(lambda: torch.zeros_like(x))             # takes the shape only
    assert (ops["zeros_like"].read, ops["zeros_like"].written) == (0, n)


def test_broadcast_operand_is_read_once():
    x, b = torch.randn(64, 32, dtype=torch.bfloat16), torch.randn(32, dtype=torch.bfloat16)
    ops = counted(lambda: x + b)
    assert ops["add"].read == (64 * 32 + 32) * 2


def test_indexing_touches_only_the_indexed_elements():
    table, rows = torch.randn(1000, 16), torch.tensor([3, 7, 7, 9])
    ops = counted(lambda: torch.nn.functional.embedding(rows, table))
    assert ops["embedding"].read == 4 * 16 * 4 + 4 * 8                     # 4 rows of 16 fp32 + the ids
    logits, labels = torch.randn(8, 1000), torch.randint(0, 1000, (8,))
    ops = counted(lambda: logits.gather(1, labels.unsqueeze(1)))
    assert ops["gather"].read == 8 * 4 + 8 * 8
    ops = counted(lambda: torch.nn.functional.nll_loss(logits, labels))
    assert ops["nll_loss_forward"].read == 8 * 4 + 8 * 8                   # the targets' logits + the targets
    grad = torch.zeros(8, 1000)
    ops = counted(lambda: grad.index_put_((torch.arange(8), labels), torch.ones(8)))
    assert (ops["index_put_"].read, ops["index_put_"].written) == (2 * 8 * 8 + 8 * 4, 8 * 4)
    ops = counted(lambda: grad.index_put_((torch.arange(8), labels), torch.ones(8), accumulate=True))
    assert (ops["index_put_"].read, ops["index_put_"].written) == (2 * 8 * 8 + 8 * 4 + 8 * 4, 8 * 4)
    ops = counted(lambda: grad.scatter_add_(1, labels.unsqueeze(1), torch.ones(8, 1)))
    assert (ops["scatter_add_"].read, ops["scatter_add_"].written) == (8 * 4 + 8 * 8 + 8 * 4, 8 * 4)


def test_gemm_flops_and_bytes():
    a, w, bias = torch.randn(64, 32), torch.randn(48, 32), torch.randn(48)
    ops = counted(lambda: torch.nn.functional.linear(a, w, bias))
    c = ops["addmm"]
    assert c.flops == 2 * 64 * 32 * 48
    assert (c.read, c.written) == ((64 * 32 + 48 * 32 + 48) * 4, 64 * 48 * 4)


def test_grouped_mm_flops():
    if not hasattr(torch, "_grouped_mm"):
        return
    x, w = torch.randn(48, 32, dtype=torch.bfloat16), torch.randn(3, 32, 16, dtype=torch.bfloat16)
    offs = torch.tensor([16, 32, 48], dtype=torch.int32)
    ops = counted(lambda: torch._grouped_mm(x, w, offs=offs))
    assert ops["_grouped_mm"].flops == 2 * 48 * 32 * 16


def test_attention_flops():
    q = torch.randn(2, 4, 16, 8)
    ops = counted(lambda: torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True))
    (name, c), = ops.items()
    assert "attention" in name and c.flops == 4 * 2 * 4 * 16 * 16 * 8


def test_multi_tensor_launches_as_cuda_batches_them():
    chunk = 65536
    assert multi_tensor_launches([10] * 36, 4) == 1           # 36 tensors per launch at depth 4
    assert multi_tensor_launches([10] * 37, 4) == 2
    assert multi_tensor_launches([10] * 110, 1) == 1
    assert multi_tensor_launches([320 * chunk], 4) == 1       # 320 blocks of 64 Ki elements per launch
    assert multi_tensor_launches([320 * chunk + 1], 4) == 2
    assert multi_tensor_launches([0, 0], 1) == 0


def test_fused_adamw_reads_grads_and_updates_state():
    params = [torch.nn.Parameter(torch.randn(100)) for _ in range(3)]
    opt = torch.optim.AdamW(params, fused=True)
    for p in params:
        p.grad = torch.randn(100)
    opt.step()  # lazy state
    ops = counted(opt.step)
    c = ops["_fused_adamw_"]
    n = 3 * 100 * 4
    assert (c.launches, c.read, c.written) == (1, 4 * n + 3 * 4, 3 * n)  # + the step counters read


def _real_and_fake(groups, shape):
    return traffic.count_step(groups, shape), traffic.count_step(groups, shape, fake=True)


def test_fake_tensors_count_what_real_ones_do():
    """A full training step of ours and of the plain loop (bf16): the same ops and counts on fake
    tensors as on real ones, and the same first-step loss and grad norm (same weights and function)."""
    shape = dataclasses.replace(pair.PRESETS["gpt-1.3b"].scaled(32), layers=2, num_micro=2)
    real, fake = spawn(1, _real_and_fake, shape, timeout=600)[0]
    assert real["ours"] and real["plain"]
    for name in ("ours", "plain"):
        assert real[name] == fake[name], name
    assert pair.disagreement(*real["first"], torch.bfloat16) is None
