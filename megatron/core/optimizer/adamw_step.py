"""One AdamW step over a list of tensors of one param group, each tensor in its own dtype: the Python
reference, and the fused multi-tensor kernel (csrc/fused/adamw.cu) where it runs.

Per element, in fp32 (the order the kernel keeps):
    g  = grad / divisor                                  (divisor: the clip divisor, or 1)
    m  = beta1 * m + (1 - beta1) * g
    v  = beta2 * v + (1 - beta2) * g * g
    p  = p * (1 - lr * weight_decay)                     (decoupled decay, as torch's AdamW)
    p  = p - ((lr / bc1) * m) / (sqrt(v) * (1 / sqrt(bc2)) + eps)   (bc1 = 1 - beta1^step, bc2 = 1 - beta2^step)
then m, v and the main value p are stored in their dtypes and p, rounded once, into the model's parameter:
the kernel reads the main gradient and writes the bf16 parameter in the same pass (no separate copy back).
Each operation is rounded on its own, tensor by tensor here and element by element in the kernel (no FMA), and
no scalar divides (torch may turn a division by a scalar into a multiplication by its reciprocal): the kernel
gives the reference's bits.
"""
import math

import torch

from ..fusions import _ext
from ..fusions._common import csrc_ok_for


def coefficients(lr, betas, eps, weight_decay, step):
    """The step's scalars (host floats): lr / bc1, 1 / sqrt(bc2), 1 - lr * weight_decay."""
    beta1, beta2 = betas
    return lr / (1.0 - beta1 ** step), 1.0 / math.sqrt(1.0 - beta2 ** step), 1.0 - lr * weight_decay


@torch.no_grad()
def reference_step(mains, grads, exp_avgs, exp_avg_sqs, params, lr, betas, eps, weight_decay, step, divisor=None):
    """The step in Python (fp32 math), in place. params[i]: the model's flat view to write, or None where
    it is mains[i] itself (an fp32 model's main value is its parameter)."""
    beta1, beta2 = betas
    step_size, inv_bc2_sqrt, decay = coefficients(lr, betas, eps, weight_decay, step)
    for main, grad, m_store, v_store, param in zip(mains, grads, exp_avgs, exp_avg_sqs, params, strict=True):
        g = grad.float()
        if divisor is not None:
            g = g / divisor
        m = m_store.float() * beta1 + g * (1.0 - beta1)
        v = v_store.float() * beta2 + g * g * (1.0 - beta2)
        p = main.float() * decay
        p = p - (m * step_size) / (v.sqrt() * inv_bc2_sqrt + eps)
        m_store.copy_(m)
        v_store.copy_(v)
        main.copy_(p)
        if param is not None:
            param.copy_(p)


def kernel_fits(mains, grads, exp_avgs, exp_avg_sqs, params):
    """Whether the csrc kernel takes these tensors (CUDA, kernel dtypes, the module built)."""
    return csrc_ok_for(*mains, *grads, *exp_avgs, *exp_avg_sqs, *(p for p in params if p is not None))


def fused_step(mains, grads, exp_avgs, exp_avg_sqs, params, lr, betas, eps, weight_decay, step, divisor=None):
    """One launch of the fused kernel over the lists (where kernel_fits), else reference_step. -> "csrc" or
    "torch": what ran."""
    if not kernel_fits(mains, grads, exp_avgs, exp_avg_sqs, params):
        reference_step(mains, grads, exp_avgs, exp_avg_sqs, params, lr, betas, eps, weight_decay, step, divisor)
        return "torch"
    step_size, inv_bc2_sqrt, decay = coefficients(lr, betas, eps, weight_decay, step)
    _ext.load().adamw_step(list(mains), list(grads), list(exp_avgs), list(exp_avg_sqs),
                           [p if p is not None else m for p, m in zip(params, mains)], divisor,
                           float(betas[0]), float(betas[1]), float(eps), float(step_size), float(inv_bc2_sqrt),
                           float(decay))
    return "csrc"
