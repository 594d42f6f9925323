"""The fused precision-aware AdamW kernel (csrc/fused/adamw.cu) on a GPU: the bits of the Python reference
(adamw_step.reference_step, run on the same device: torch rounds each element-wise op, the kernel each float
op, no FMA) for every dtype mix the flags allow, over more tensors than one launch takes and tensors longer
than one block's chunk; and torch.optim.AdamW(fused=True) to the rounding of fp32."""
import pytest
import torch

from megatron.core.optimizer.adamw_step import fused_step, reference_step

LR, BETAS, EPS, WD = 1e-2, (0.9, 0.95), 1e-8, 0.1
F32, F16, BF = torch.float32, torch.float16, torch.bfloat16
SIZES = [1, 7, 4096 * 4 + 3, 70000] + [33] * 40  # > 36 tensors: two launches; > 16384 elements: several blocks


def _pieces(main_dtype, grad_dtype, state_dtype, param_dtype, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    out = []
    for n in SIZES:
        value = torch.randn(n, device="cuda", generator=gen)
        main = value.to(main_dtype)
        param = main if param_dtype is None else value.to(param_dtype)
        out.append((main, (torch.randn(n, device="cuda", generator=gen) * 1e-2).to(grad_dtype),
                    torch.zeros(n, device="cuda", dtype=state_dtype), torch.zeros(n, device="cuda", dtype=state_dtype),
                    param))
    return out


def _step(pieces, fn, step, divisor):
    mains, grads, ms, vs, params = (list(x) for x in zip(*pieces))
    params = [None if p is m else p for p, m in zip(params, mains)]
    return fn(mains, grads, ms, vs, params, LR, BETAS, EPS, WD, step, divisor)


@pytest.mark.parametrize("dtypes", [(F32, F32, F32, None), (F32, F32, F32, BF), (F32, BF, BF, BF), (F16, F32, F16, BF),
                                    (F32, F32, BF, F16)], ids=str)
@pytest.mark.parametrize("clip", [False, True])
def test_kernel_is_the_reference_bitwise(ext, dtypes, clip):
    kernel, ref = _pieces(*dtypes), _pieces(*dtypes)
    divisor = torch.tensor(1.7, device="cuda") if clip else None
    for step in (1, 2, 3):
        assert _step(kernel, fused_step, step, divisor) == "csrc"
        _step(ref, reference_step, step, divisor)
    for k, r in zip(kernel, ref):
        for a, b in zip(k, r):
            assert torch.equal(a, b)


def test_kernel_is_torch_fused_adamw_to_fp32_rounding(ext):
    pieces = _pieces(F32, F32, F32, None)
    params = [torch.nn.Parameter(m.clone()) for m, *_ in pieces]
    opt = torch.optim.AdamW(params, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD, fused=True)
    for step in (1, 2, 3):
        for p, (_, g, *_) in zip(params, pieces):
            p.grad = g.clone()
        opt.step()
        _step(pieces, fused_step, step, None)
    for p, (m, *_) in zip(params, pieces):
        torch.testing.assert_close(m, p.detach(), rtol=4e-7, atol=1e-7)
