"""Blockwise scales (DeepSeek-V3's recipe): one scale per 1x128 tile of an activation or gradient (128
consecutive elements along the contraction dimension of a row) and per 128x128 block of a weight.

A tile never crosses a rank boundary when the sharded dimensions are multiples of 128 (config check), so
blockwise needs no amax reduction: each rank's tiles are tiles of the one-process tensor.
"""
import torch

from .formats import quantize, scale_from_amax

TILE = 128


def _blocks(n: int) -> int:
    return -(-n // TILE)


def tile_amax(x: torch.Tensor) -> torch.Tensor:
    """[M, K] -> [M, ceil(K/128)]: max |x| over each 1x128 tile of a row (the last tile may be short)."""
    m, k = x.shape
    pad = _blocks(k) * TILE - k
    a = torch.nn.functional.pad(x.detach().abs().float(), (0, pad))
    return a.view(m, _blocks(k), TILE).amax(-1)


def block_amax(w: torch.Tensor) -> torch.Tensor:
    """[N, K] -> [ceil(N/128), ceil(K/128)]: max |w| over each 128x128 block."""
    n, k = w.shape
    a = torch.nn.functional.pad(w.detach().abs().float(), (0, _blocks(k) * TILE - k, 0, _blocks(n) * TILE - n))
    return a.view(_blocks(n), TILE, _blocks(k), TILE).amax(dim=(1, 3))


def expand(scales: torch.Tensor, rows: int, cols: int, row_tile: int) -> torch.Tensor:
    """Per-tile scales [R, C] -> one per element [rows, cols] (tiles of row_tile x 128)."""
    return scales.repeat_interleave(row_tile, 0)[:rows].repeat_interleave(TILE, 1)[:, :cols]


def quantize_tiles(x: torch.Tensor, dtype, margin: int = 0):
    """x [M, K] in 1x128 tiles -> (fp8 [M, K], scales [M, ceil(K/128)])."""
    s = scale_from_amax(tile_amax(x), dtype, margin)
    return quantize(x, expand(s, *x.shape, 1), dtype), s


def quantize_blocks(w: torch.Tensor, dtype, margin: int = 0):
    """w [N, K] in 128x128 blocks -> (fp8 [N, K], scales [ceil(N/128), ceil(K/128)])."""
    s = scale_from_amax(block_amax(w), dtype, margin)
    return quantize(w, expand(s, *w.shape, TILE), dtype), s


def block_rows(scales: torch.Tensor, rows: int) -> torch.Tensor:
    """128x128 block scales [R, C] -> per-row scales [rows, C] (each row takes its block row's)."""
    return scales.repeat_interleave(TILE, 0)[:rows]
