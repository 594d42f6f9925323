"""The planner's prediction in a training log: one startup line on a GPU the calibration knows,
so the predicted step time sits beside the measured iteration times that follow."""
import os
import re

import torch

from .hardware import make_cluster
from .predict import predict_resolved

# torch.cuda.get_device_name() -> calibration.toml key; A100s told apart by their memory
_NAMES = [(r"\bH200\b", "H200"), (r"\bH100\b(?!.*\b(PCIe|NVL)\b)", "H100-SXM"), (r"\bA100\b", "A100")]


def calibration_gpu(device_name: str, total_memory_bytes: int) -> str | None:
    """The calibration key of a CUDA device, or None when the calibration has no entry for it."""
    for pattern, key in _NAMES:
        if re.search(pattern, device_name, re.IGNORECASE):
            if key == "A100":
                return "A100-80GB" if total_memory_bytes > 48e9 else "A100-40GB"
            return key
    return None


def prediction_line(model_cfg, train_cfg, world_size, gpu, gpus_per_node) -> str:
    """'> planner: ...' for resolved configs on world_size GPUs of calibration key `gpu`."""
    p = predict_resolved(model_cfg, train_cfg, world_size, make_cluster(gpu, world_size, gpus_per_node))
    return (f"> planner (docs/planner.md; {world_size} x {gpu}, {gpus_per_node} per node): predicted "
            f"{p.step.total:.3f} s per iteration ({p.step.schedule} bubble {100 * p.step.bubble:.1f}%), "
            f"{p.tflops_per_gpu:.1f} TFLOP/s per GPU, MFU {100 * p.mfu:.1f}%, "
            f"{p.memory_bytes / 1e9:.1f} GB on the most loaded GPU")


def predicted_step_line(model_cfg, train_cfg, world_size, device) -> str | None:
    """prediction_line for this run's GPU; None off CUDA or on a GPU the calibration lacks. The
    prediction is information only: whatever goes wrong in it (a layout the model cannot price, a bug)
    gives one '> planner: no prediction
    (reason)' line instead, and the run goes on."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    try:
        gpu = calibration_gpu(torch.cuda.get_device_name(device), torch.cuda.get_device_properties(device).total_memory)
        if gpu is None:
            return None
        per_node = int(os.environ.get("LOCAL_WORLD_SIZE", torch.cuda.device_count()))
        return prediction_line(model_cfg, train_cfg, world_size, gpu, max(1, min(per_node, world_size)))
    except Exception as e:  # noqa: BLE001 - a prediction must never stop training
        reason = str(e).splitlines()[0] if str(e) else ""
        return f"> planner: no prediction ({type(e).__name__}{': ' + reason if reason else ''})"
