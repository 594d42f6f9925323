"""FP8 GEMMs over torch._scaled_mm, fp32 accumulation and output.

Both operands are given as [rows, K] (K the contraction dimension, row-major): out = a b^T. torch 2.13
runs per-tensor and per-row scales on CPU but not blockwise ones (its F.scaled_mm refuses BlockWise1x128
there), so a blockwise GEMM is one row-scaled _scaled_mm per 128-wide slice of K, summed in fp32: the
same products, a different summation order than a fused blockwise kernel.
"""
import torch

from .blockwise import TILE


def tensorwise_mm(a, a_inv, b, b_inv) -> torch.Tensor:
    """a [M, K], b [N, K] fp8; a_inv, b_inv 0-d fp32 inverse scales -> fp32 [M, N] = a_inv b_inv (a b^T)."""
    return torch._scaled_mm(a.contiguous(), b.contiguous().t(), scale_a=a_inv.reshape(()).float(),
                            scale_b=b_inv.reshape(()).float(), out_dtype=torch.float32)


def blockwise_mm(a, a_inv, b, b_inv) -> torch.Tensor:
    """a [M, K], b [N, K] fp8; a_inv [M, ceil(K/128)], b_inv [N, ceil(K/128)] inverse scales of each row's
    128-wide K slices -> fp32 [M, N]: sum over slices j of diag(a_inv[:, j]) (a_j b_j^T) diag(b_inv[:, j])."""
    m, k = a.shape
    n = b.shape[0]
    out = torch.zeros(m, n, dtype=torch.float32, device=a.device)
    for j, start in enumerate(range(0, k, TILE)):
        aj = a[:, start:start + TILE].contiguous()
        bj = b[:, start:start + TILE].contiguous()
        out += torch._scaled_mm(aj, bj.t(), scale_a=a_inv[:, j:j + 1].float().contiguous(),
                                scale_b=b_inv[:, j].float().reshape(1, n).contiguous(), out_dtype=torch.float32)
    return out
