"""What activation offload (--cpu-offloading) changes in the estimate: the device bytes of the offloaded
layers' kept activations, per micro-batch in flight, and the PCIe time of bringing them back.

The bytes are the estimator's own per-layer figure after recompute (activations.kept_activation_bytes) for
the first --cpu-offloading-num-layers layers of each chunk: what full recompute keeps (a chunk's input) with
it, every saved activation without. Weights are not counted: the model keeps its own copy of each.
The time: the copy out runs on a side stream behind the rest of the forward (counted hidden); the reload
runs on the compute stream when the backward reaches the layer (counted whole, once per micro-batch).
"""
from .activations import kept_activation_bytes


def offloaded_bytes(model_cfg, t, tp, chunk_layers) -> int:
    """Bytes per micro-batch moved to the host on a rank whose model chunks hold chunk_layers decoder layers."""
    if not t.cpu_offloading or not t.cpu_offloading_activations:
        return 0
    n = t.cpu_offloading_num_layers
    return sum(kept_activation_bytes(model_cfg, t.micro_batch_size, tp, min(n, layers))[0] for layers in chunk_layers)


def offload_seconds(cluster, nbytes) -> float:
    """Seconds one micro-batch's reload of nbytes adds (cluster.pcie_bw: achieved host-to-device bytes/s)."""
    if not nbytes:
        return 0.0
    if cluster.pcie_bw is None:
        raise ValueError(f"no PCIe bandwidth for {cluster.gpu} in calibration.toml (pcie_gbps)")
    return nbytes / cluster.pcie_bw
