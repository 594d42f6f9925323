"""FP8 GEMMs, fp32 accumulation and output. Both operands are given as [rows, K] (K the contraction
dimension): out = a b^T, times the inverse scales.

On a GPU they run torch._scaled_mm. On a CPU, torch 2.13's _scaled_mm is a reference kernel (about 50x
slower than an fp32 GEMM of the same shape, measured here): the default there is the fp32 GEMM of the FP8
values, which computes the same thing (an FP8 x FP8 product is exact in fp32; the K products are summed
in fp32, in another order), then the scales. scaled_mm=True forces _scaled_mm (the unit tests run both and
bound both against fp64). _scaled_mm does not take blockwise scales on a CPU (F.scaled_mm refuses
BlockWise1x128 there), so a blockwise GEMM is one row-scaled GEMM per 128-wide slice of K, summed in fp32:
the same products, another summation order than a fused blockwise kernel.
"""
import torch

from .blockwise import TILE


def _use_scaled_mm(a, scaled_mm):
    return a.is_cuda if scaled_mm is None else scaled_mm


def _row_scaled(a, a_inv, b, b_inv, scaled_mm):
    """a [M, K], b [N, K] fp8; a_inv [M, 1] or 0-d, b_inv [1, N] or 0-d -> fp32 a_inv * (a b^T) * b_inv."""
    if _use_scaled_mm(a, scaled_mm):
        return torch._scaled_mm(a.contiguous(), b.contiguous().t(), scale_a=a_inv.float().contiguous(),
                                scale_b=b_inv.float().contiguous(), out_dtype=torch.float32)
    return torch.mm(a.float(), b.float().t()).mul_(a_inv.float()).mul_(b_inv.float())


def tensorwise_mm(a, a_inv, b, b_inv, scaled_mm=None) -> torch.Tensor:
    """a [M, K], b [N, K] fp8; a_inv, b_inv 0-d fp32 inverse scales -> fp32 [M, N] = a_inv b_inv (a b^T).
    scaled_mm: None (torch._scaled_mm on a GPU, the fp32 GEMM of the FP8 values on a CPU), True or False."""
    return _row_scaled(a, a_inv.reshape(()), b, b_inv.reshape(()), scaled_mm)


def blockwise_mm(a, a_inv, b, b_inv, scaled_mm=None) -> torch.Tensor:
    """a [M, K], b [N, K] fp8; a_inv [M, ceil(K/128)], b_inv [N, ceil(K/128)] inverse scales of each row's
    128-wide K slices -> fp32 [M, N]: sum over slices j of diag(a_inv[:, j]) (a_j b_j^T) diag(b_inv[:, j])."""
    m, k = a.shape
    n = b.shape[0]
    out = torch.zeros(m, n, dtype=torch.float32, device=a.device)
    for j, start in enumerate(range(0, k, TILE)):
        out += _row_scaled(a[:, start:start + TILE], a_inv[:, j:j + 1], b[:, start:start + TILE],
                           b_inv[:, j].reshape(1, n), scaled_mm)
    return out
