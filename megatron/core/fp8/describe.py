"""The start-up line naming FP8 as the other precision and kernel choices are named: the formats, the scaling
recipe and its settings, which transformer layers and GEMMs run in FP8, and the GEMM kernel with the reason."""
import torch

from .config import fp8_layer
from .formats import formats

_RECIPES = {"delayed": "delayed scaling (amax history {h}, {algo})", "tensorwise": "tensorwise scaling",
            "blockwise": "blockwise scaling (1x128 activation tiles, 128x128 weight blocks)"}


def _runs(numbers):
    """'2-5, 7' of sorted layer numbers."""
    runs, start = [], None
    for i, n in enumerate(numbers):
        if start is None:
            start = n
        if i + 1 == len(numbers) or numbers[i + 1] != n + 1:
            runs.append(f"{start}" if start == n else f"{start}-{n}")
            start = None
    return ", ".join(runs) or "none"


def describe(cfg, device) -> str | None:
    """One line, or None without --fp8-format."""
    if cfg.fp8_format is None:
        return None
    fwd, grad = (str(d).replace("torch.float8_", "") for d in formats(cfg.fp8_format))
    recipe = _RECIPES[cfg.fp8_recipe].format(h=cfg.fp8_amax_history_len, algo=cfg.fp8_amax_compute_algo)
    layers = [n for n in range(1, cfg.num_layers + 1) if fp8_layer(cfg, n) is not None]
    kept = "" if not cfg.first_last_layers_bf16 else \
        f" (--first-last-layers-bf16: {cfg.num_layers_at_start_in_bf16} first, {cfg.num_layers_at_end_in_bf16} last " \
        "in the model's precision)"
    cuda = torch.device(device).type == "cuda"
    kernel = "torch._scaled_mm (CUDA)" if cuda else \
        "the fp32 GEMM of the FP8 values, then the scales (torch._scaled_mm is a slow reference kernel on a CPU)"
    if cfg.fp8_recipe == "blockwise" and not cuda:
        kernel += ", one per 128-wide slice of K (no blockwise _scaled_mm on a CPU)"
    return (f"> FP8: --fp8-format {cfg.fp8_format} ({fwd} forward, {grad} gradients), {recipe}, margin "
            f"{cfg.fp8_margin} | layers {_runs(layers)} of {cfg.num_layers}{kept}: QKV, projection, fc1, fc2"
            f"{' (the experts and shared experts too)' if cfg.num_experts else ''} "
            f"(forward, input and weight gradients) | output layer "
            f"{'FP8 (--fp8-output-layer)' if cfg.fp8_output_layer else 'in the model precision'}"
            f"{' | weights gathered as FP8 (--fp8-param-gather)' if cfg.fp8_param_gather else ''} | GEMMs: {kernel}")
