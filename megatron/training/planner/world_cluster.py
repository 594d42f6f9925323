"""The Cluster --auto-parallel plans on: --planner-gpu's, the CUDA device's, or on CPU the measured CPU profile.

Every input is the same on every rank of a homogeneous world (the flag, the device kind, the cached CPU profile
file), so each rank builds the same Cluster without a collective. A world of mixed GPUs must give --planner-gpu.
"""
import torch

from ...core.config import ConfigError
from .hardware import Cluster, gpu_names, load_calibration, make_cluster
from .live import calibration_gpu


def cluster_of(planner_gpu, world_size, per_node, cpu_cluster=None) -> tuple[Cluster, str]:
    """(Cluster of world_size ranks, per_node to a node; where its figures come from). cpu_cluster:
    (world_size, per_node) -> (Cluster, source), used off CUDA without --planner-gpu. Raises ConfigError."""
    cal = load_calibration()
    if planner_gpu is not None:
        if planner_gpu not in cal["gpu"]:
            raise ConfigError(f"--planner-gpu {planner_gpu}: unknown to the planner's calibration; one of "
                              f"{', '.join(gpu_names(cal))}")
        return make_cluster(planner_gpu, world_size, per_node, cal=cal), "--planner-gpu"
    if torch.cuda.is_available():
        name, props = torch.cuda.get_device_name(0), torch.cuda.get_device_properties(0)
        key = calibration_gpu(name, props.total_memory)
        if key is None:
            raise ConfigError(f"--auto-parallel: the planner's calibration has no figures for {name}; give "
                              f"--planner-gpu with the closest of {', '.join(gpu_names(cal))}")
        # the device's own memory where it is less than the calibration's (a MIG slice, a smaller variant)
        memory_gb = min(cal["gpu"][key]["memory_gb"], props.total_memory / 1e9)
        return make_cluster(key, world_size, per_node, memory_gb=memory_gb, cal=cal), f"detected {name}"
    return cpu_cluster(world_size, per_node)
