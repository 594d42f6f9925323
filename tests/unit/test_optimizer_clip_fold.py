"""MegatronOptimizer.step with the clip coefficient inside the fused AdamW step (its grad_scale) and one
multi-tensor copy-back: the parameters after a clipped step equal torch AdamW's on gradients scaled by
min(1, clip / norm), and the step runs no scaling pass and one copy of its own."""
import pytest
import torch
from torch import nn

from tests.harness import spawn
from tests.op_record import OpRecord

# eps of the clipped gradients' size: Adam's first step is lr * g / (|g| + eps), which a wrong clip
# coefficient then changes (with a small eps it would be lr * sign(g), blind to the clip)
LR, CLIP, EPS = 1e-2, 0.05, 1e-2


def _step(groups, dtype):
    from megatron.core.distributed import DistributedDataParallel
    from megatron.core.optimizer import MegatronOptimizer
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 6), nn.LayerNorm(6), nn.Linear(6, 3)).to(dtype)
    ddp = DistributedDataParallel(model, groups)
    opt = MegatronOptimizer(ddp, groups, LR, 0.1, eps=EPS, clip_grad=CLIP)
    start = {n: p.detach().float().clone() for n, p in model.named_parameters()}
    gen = torch.Generator().manual_seed(1)
    ddp.start_step(1)
    grads = {}
    for n, p in model.named_parameters():  # the reduced gradients, as backward and DDP leave them
        grads[n] = torch.randn(p.shape, generator=gen)
        ddp.main_grad(p).copy_(grads[n])
    record = OpRecord()
    with record:
        updated, norm = opt.step()
    assert updated
    # the reference: torch's AdamW on fp32 copies, the gradients clipped by multiplication
    norm_ref = torch.sqrt(sum(g.double().pow(2).sum() for g in grads.values())).float()
    coeff = min(1.0, CLIP / (float(norm_ref) + 1e-6))
    ref = {n: nn.Parameter(v.clone()) for n, v in start.items()}
    decay = [ref[n] for n, p in model.named_parameters() if p.ndim > 1]
    no_decay = [ref[n] for n, p in model.named_parameters() if p.ndim <= 1]
    torch_opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                                  lr=LR, betas=(0.9, 0.95), eps=EPS, foreach=False)
    for n, p in ref.items():
        p.grad = grads[n] * coeff
    torch_opt.step()
    got = {n: p.detach().float() for n, p in model.named_parameters()}
    return {n: (got[n].numpy(), ref[n].detach().to(dtype).float().numpy()) for n in got}, float(norm), \
        float(norm_ref), coeff, record.names()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_clipped_step_equals_adamw_on_clipped_gradients(dtype):
    params, norm, norm_ref, coeff, names = spawn(1, _step, dtype)[0]
    assert coeff < 0.1, "the test must clip"
    assert norm == pytest.approx(norm_ref, rel=1e-6)
    for name, (got, want) in params.items():
        # Adam's first step moves each value by lr * g / (|g| + eps): the clip's rounding (a division here, a
        # product there: 2 u relative in g) changes that by less than lr * 2 u; the copy to the model's dtype
        # rounds once (one ulp apart at most, where the two fp32 values straddle a rounding point)
        ulp = 2.0 ** -7 if dtype == torch.bfloat16 else 2.0 ** -23
        tol = ulp * abs(want).max() + 1e-6 * LR
        assert abs(got - want).max() <= tol, name
    assert "_foreach_mul_" not in names and "mul_" not in names, "the clip should run inside the AdamW step"
    copies = names.count("_foreach_copy_") + names.count("copy_")
    assert copies == (1 if dtype == torch.bfloat16 else 0), f"one multi-tensor copy-back, got {copies}: {names}"
