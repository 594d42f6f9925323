"""The cluster the planner sizes: GPU figures and link bandwidths from calibration.toml.

A Cluster is plain data (flag values win over the calibration defaults); the functions here
turn bytes and FLOPs into seconds. No process group, no GPU: everything is on paper.
"""
import dataclasses
import math
import os

from ...core.errors import MegatronUserError

CALIBRATION = os.path.join(os.path.dirname(os.path.abspath(__file__)), "calibration.toml")


def load_toml(path) -> dict:
    """The TOML file at path: tomllib (Python 3.11+) or tomli; imported here, not at module import,
    so that training on older Pythons never needs either."""
    try:
        import tomllib
    except ModuleNotFoundError:
        try:
            import tomli as tomllib
        except ModuleNotFoundError as e:
            raise MegatronUserError("the planner reads TOML files: use Python 3.11+ or `pip install tomli`") from e
    with open(path, "rb") as fh:
        return tomllib.load(fh)


def load_calibration(path=CALIBRATION) -> dict:
    return load_toml(path)


@dataclasses.dataclass
class Cluster:
    """num_gpus GPUs of one kind, gpus_per_node to a node. Bandwidths in bytes/s per GPU and direction."""
    gpu: str
    num_gpus: int
    gpus_per_node: int
    peak_flops: float          # dense bf16 FLOP/s per GPU
    hbm_bw: float              # bytes/s
    memory_bytes: float
    nvlink_bw: float
    network_bw: float
    gemm_dims: tuple
    gemm_fraction: tuple
    hbm_eff: float
    nvlink_eff: float
    network_eff: float
    latency: float             # seconds per ring step across nodes
    peak_fp8_flops: float | None = None  # dense FP8 FLOP/s per GPU; None: no FP8 tensor cores
    pcie_bw: float | None = None  # host <-> GPU bytes/s per direction, achieved (activation offload's copies)


def gpu_names(cal=None) -> list[str]:
    return sorted((cal or load_calibration())["gpu"])


def make_cluster(gpu, num_gpus, gpus_per_node=8, nvlink_gbps: float | None = None,
                 network_gbps: float | None = None, memory_gb: float | None = None, cal=None) -> Cluster:
    """Cluster of `gpu` (a key of calibration.toml's [gpu] table); None overrides keep the calibration's."""
    cal = cal or load_calibration()
    if gpu not in cal["gpu"]:
        raise KeyError(gpu)
    g, eff = cal["gpu"][gpu], cal["efficiency"]
    curve = cal["gemm"][g["gemm"]]
    memory_gb, nvlink_gbps, network_gbps = (g[k] if v is None else v for k, v in (
        ("memory_gb", memory_gb), ("nvlink_gbps", nvlink_gbps), ("network_gbps", network_gbps)))
    return Cluster(gpu, num_gpus, gpus_per_node, g["peak_bf16_tflops"] * 1e12, g["hbm_gbps"] * 1e9,
                   memory_gb * 1e9, nvlink_gbps * 1e9, network_gbps * 1e9, tuple(curve["dims"]),
                   tuple(curve["fraction"]), eff["hbm"], eff["nvlink"], eff["network"], eff["latency_us"] * 1e-6,
                   g["peak_fp8_tflops"] * 1e12 if "peak_fp8_tflops" in g else None,
                   g["pcie_gbps"] * 1e9 * eff.get("pcie", 1.0) if "pcie_gbps" in g else None)


def gemm_fraction(cluster: Cluster, m, n, k) -> float:
    """Achievable fraction of peak of an (m x k) @ (k x n) GEMM: the calibration curve at min(m, n, k),
    linear in log2 between its points, flat outside them."""
    d, dims, frac = min(m, n, k), cluster.gemm_dims, cluster.gemm_fraction
    if d <= dims[0]:
        return frac[0] * d / dims[0]  # below the smallest tile the work shrinks, the time does not
    if d >= dims[-1]:
        return frac[-1]
    i = next(i for i in range(1, len(dims)) if d <= dims[i])
    x = (math.log2(d) - math.log2(dims[i - 1])) / (math.log2(dims[i]) - math.log2(dims[i - 1]))
    return frac[i - 1] + x * (frac[i] - frac[i - 1])


def gemm_time(cluster: Cluster, m, n, k, batch=1) -> float:
    """Seconds of `batch` GEMMs (m x k) @ (k x n): 2 m n k FLOPs each."""
    return 2.0 * batch * m * n * k / (cluster.peak_flops * gemm_fraction(cluster, m, n, k))


def memory_time(cluster: Cluster, nbytes) -> float:
    """Seconds to stream nbytes through HBM (elementwise, norm, softmax, optimizer kernels)."""
    return nbytes / (cluster.hbm_bw * cluster.hbm_eff)


def group_bandwidth(cluster: Cluster, size, stride) -> tuple[float, int]:
    """(bus bandwidth bytes/s, nodes spanned) of a group of `size` ranks `stride` apart in the rank order.
    Inside a node the ring runs over NVLink; across nodes each member of the group in a node drives its
    own NIC, so the bandwidth is that of the members per node times one NIC, capped by NVLink."""
    if size <= 1:
        return cluster.nvlink_bw * cluster.nvlink_eff, 1
    per_node = 1 if stride >= cluster.gpus_per_node else min(size, cluster.gpus_per_node // stride)
    nodes = math.ceil(size / per_node)
    if nodes == 1:
        return cluster.nvlink_bw * cluster.nvlink_eff, 1
    return min(cluster.nvlink_bw * cluster.nvlink_eff, per_node * cluster.network_bw * cluster.network_eff), nodes


def ring_bytes(kind, nbytes, size) -> float:
    """Bytes each rank sends in a ring collective over `size` ranks, nbytes the full buffer: all_reduce
    2 (n-1)/n of it, all_gather / reduce_scatter (n-1)/n (what megatron/core/comm.py counts)."""
    factor = {"all_reduce": 2, "all_gather": 1, "reduce_scatter": 1}[kind]
    return factor * (size - 1) * nbytes / size if size > 1 else 0.0


def collective_time(cluster: Cluster, kind, nbytes, size, stride) -> float:
    """Seconds of a ring collective over `size` ranks `stride` apart, nbytes the full buffer."""
    if size <= 1:
        return 0.0
    bw, nodes = group_bandwidth(cluster, size, stride)
    steps = (2 if kind == "all_reduce" else 1) * (size - 1)
    return ring_bytes(kind, nbytes, size) / bw + (steps * cluster.latency if nodes > 1 else 0.0)


def p2p_time(cluster: Cluster, nbytes, crosses_node) -> float:
    """Seconds of one send of nbytes to the next pipeline stage (its own NIC when it leaves the node)."""
    if crosses_node:
        return nbytes / (cluster.network_bw * cluster.network_eff) + cluster.latency
    return nbytes / (cluster.nvlink_bw * cluster.nvlink_eff)


def all_to_all_time(cluster: Cluster, sent, size, stride) -> float:
    """Seconds of an all-to-all over `size` ranks `stride` apart in which each rank sends `sent`
    bytes spread evenly over the others: the part to ranks in its node over NVLink, the rest over
    its own NIC, both at once."""
    if size <= 1:
        return 0.0
    per_node = 1 if stride >= cluster.gpus_per_node else min(size, cluster.gpus_per_node // stride)
    off = sent * (size - per_node) / (size - 1)
    inside = (sent - off) / (cluster.nvlink_bw * cluster.nvlink_eff)
    if off == 0:
        return inside
    return max(inside, off / (cluster.network_bw * cluster.network_eff)) + cluster.latency
