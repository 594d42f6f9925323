"""The precision-aware AdamW step's Python reference (core/optimizer/adamw_step.py): torch's AdamW to the
rounding of fp32, the clip divisor as dividing the gradient, moments and main values stored in their dtypes
(at step 1 exactly the fp32 step's values rounded once), the model's parameter written from the same fp32
value, and a tensor cut anywhere stepped to the same bits as whole."""
import pytest
import torch

from megatron.core.optimizer.adamw_step import fused_step, reference_step

LR, BETAS, EPS, WD = 1e-2, (0.9, 0.95), 1e-8, 0.1


def _tensors(n=777, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, generator=gen), torch.randn(n, generator=gen) * 1e-3


def _run(main, grads, m_dtype=torch.float32, v_dtype=torch.float32, param=None, divisor=None):
    m, v = torch.zeros(main.shape, dtype=m_dtype), torch.zeros(main.shape, dtype=v_dtype)
    for step, g in enumerate(grads, 1):
        reference_step([main], [g], [m], [v], [param], LR, BETAS, EPS, WD, step, divisor)
    return main, m, v


def test_fp32_reference_is_torch_adamw_to_rounding():
    p, g = _tensors()
    q = torch.nn.Parameter(p.clone())
    opt = torch.optim.AdamW([q], lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    for _ in range(3):
        q.grad = g.clone()
        opt.step()
    main, m, v = _run(p.clone(), [g] * 3)
    torch.testing.assert_close(main, q.detach(), rtol=4e-7, atol=1e-7)  # a rounding or two of fp32
    torch.testing.assert_close(m, opt.state[q]["exp_avg"], rtol=1e-6, atol=0)
    torch.testing.assert_close(v, opt.state[q]["exp_avg_sq"], rtol=1e-6, atol=0)


def test_clip_divisor_divides_the_gradient():
    p, g = _tensors(seed=1)
    divisor = torch.tensor(3.0)
    clipped, _, _ = _run(p.clone(), [g], divisor=divisor)
    by_hand, _, _ = _run(p.clone(), [g / divisor])
    assert torch.equal(clipped, by_hand)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_moments_in_their_dtype_are_the_fp32_step_rounded_once(dtype):
    p, g = _tensors(seed=2)
    g = g * 100  # fp16's second moment of 1e-3 gradients would be subnormal (what fp16 moments cost)
    _, m32, v32 = _run(p.clone(), [g])
    _, m, v = _run(p.clone(), [g], dtype, dtype)
    assert m.dtype == v.dtype == dtype
    assert torch.equal(m, m32.to(dtype)) and torch.equal(v, v32.to(dtype))  # step 1: rounded once
    main32, m32, v32 = _run(p.clone(), [g, g * 0.5, g * 2])
    main, m, _ = _run(p.clone(), [g, g * 0.5, g * 2], dtype, dtype)
    ulp, tiny = torch.finfo(dtype).eps, torch.finfo(dtype).smallest_normal * torch.finfo(dtype).eps  # tiny: subnormal
    assert ((m.float() - m32).abs() <= 3 * (ulp * m32.abs() + tiny)).all()  # one rounding a step, three steps
    # where the second moment is a normal number of the dtype (fp16's flushes small ones: its cost)
    normal = v32 >= torch.finfo(dtype).smallest_normal
    assert normal.float().mean() > 0.8 and (main - main32)[normal].abs().max() < 1e-4


def test_bf16_parameter_and_fp16_main_are_written_from_the_fp32_value():
    p, g = _tensors(seed=3)
    main32, _, _ = _run(p.clone(), [g])
    param = p.to(torch.bfloat16)
    main16, _, _ = _run(p.to(torch.float16), [g], param=param)
    assert main16.dtype == torch.float16 and param.dtype == torch.bfloat16
    # the fp16 main value moved from fp16-rounded start values; the parameter is that step's result rounded once
    start = p.to(torch.float16)
    expected, _, _ = _run(start.float(), [g])
    assert torch.equal(param, expected.to(torch.bfloat16)) and torch.equal(main16, expected.to(torch.float16))
    assert (main16.float() - main32).abs().max() < 1e-2


def test_a_tensor_cut_anywhere_steps_to_the_bits_of_the_whole():
    p, g = _tensors(seed=4)
    whole, wm, wv = _run(p.clone(), [g, -g])
    cut = [0, 5, 300, 301, 777]
    mains = [p[a:b].clone() for a, b in zip(cut, cut[1:])]
    ms, vs = [torch.zeros_like(x) for x in mains], [torch.zeros_like(x) for x in mains]
    for step, grad in enumerate([g, -g], 1):
        reference_step(mains, [grad[a:b] for a, b in zip(cut, cut[1:])], ms, vs, [None] * len(mains), LR, BETAS,
                       EPS, WD, step)
    assert torch.equal(torch.cat(mains), whole) and torch.equal(torch.cat(ms), wm) and torch.equal(torch.cat(vs), wv)


def test_off_cuda_the_fused_step_runs_the_reference():
    p, g = _tensors(seed=5)
    main, m, v = p.clone(), torch.zeros_like(p), torch.zeros_like(p)
    assert fused_step([main], [g], [m], [v], [None], LR, BETAS, EPS, WD, 1) == "torch"
    ref, _, _ = _run(p.clone(), [g])
    assert torch.equal(main, ref)
