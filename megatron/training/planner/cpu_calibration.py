"""A measured profile of this CPU machine as a planner Cluster, so --auto-parallel can choose on CPU worlds.

    cluster, source = cpu_cluster(world_size, per_node, cache_dir)

The profile (cpu_profile.measure: fp32 GEMM FLOP/s at a few sizes, copy bandwidth, gloo all-reduce and
send/recv between two local processes, physical memory) is measured once per machine, thread count and
torch version and cached as JSON under the data cache dir; the first rank to take the cache's lock measures,
the others wait and read what it wrote, so every rank of a node plans on the same figures. What it models
and what it does not: docs/planner.md ("CPU worlds").
"""
import fcntl
import json
import os
import socket

import torch

from .hardware import Cluster

PROFILE_VERSION = 1
MEMORY_FRACTION = 0.8  # of the physical memory, shared by the node's ranks (the OS, the launcher, page cache)


def profile_key(threads) -> str:
    return f"cpu-profile-v{PROFILE_VERSION}-{socket.gethostname()}-{threads}t-torch{torch.__version__}.json"


def load_or_measure(cache_dir, threads, measure) -> tuple[dict, bool]:
    """(profile, whether it was read from the cache). measure(threads) -> profile dict; called by the
    first process to hold the lock when no profile is cached, the result written atomically."""
    os.makedirs(cache_dir, exist_ok=True)
    path = os.path.join(cache_dir, profile_key(threads))
    with open(path + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the others of this node wait here while one measures
        try:
            if os.path.exists(path):
                with open(path) as fh:
                    return json.load(fh), True
            profile = measure(threads)
            tmp = f"{path}.{os.getpid()}.tmp"
            with open(tmp, "w") as fh:
                json.dump(profile, fh, indent=1, sort_keys=True)
            os.replace(tmp, path)
            return profile, False
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def share(profile, per_node) -> float:
    """The fraction of one process's measured compute a rank gets when per_node ranks of profile['threads']
    threads each share profile['cores'] cores (1 when they fit; the throughput is taken to divide evenly)."""
    demand = per_node * profile["threads"]
    return min(1.0, profile["cores"] / demand)


def to_cluster(profile, world_size, per_node) -> Cluster:
    """The Cluster of world_size ranks, per_node to a machine, from a measured profile.

    GEMM: peak the best measured FLOP/s, the curve each size's fraction of it, both scaled by share().
    Memory traffic: the copy bandwidth, also shared. Links: the gloo all-reduce bus bandwidth between two
    local processes at the profile's message size (latency folded in at that size) for both the in-node and
    the across-node link (no second machine is measured); latency the small-message round time."""
    s = share(profile, per_node)
    dims = [int(d) for d in profile["gemm_dims"]]
    flops = [float(f) for f in profile["gemm_flops"]]
    peak = max(flops)
    link = float(profile["allreduce_bus_bw"])
    return Cluster(f"CPU ({profile['cores']} cores)", world_size, per_node, peak * s, profile["copy_bw"] * s,
                   MEMORY_FRACTION * profile["memory_bytes"] / per_node, link, link, tuple(dims),
                   tuple(f / peak for f in flops), 1.0, 1.0, 1.0, float(profile["latency"]))


def cpu_cluster(world_size, per_node, cache_dir, measure=None) -> tuple[Cluster, str]:
    """(Cluster of this CPU machine, where its figures come from). measure: cpu_profile.measure by default."""
    if measure is None:
        from .cpu_profile import measure  # the measuring code (and its process spawning) only when needed
    threads = torch.get_num_threads()
    profile, cached = load_or_measure(cache_dir, threads, measure)
    where = os.path.join(cache_dir, profile_key(threads))
    shared = share(profile, per_node)
    return to_cluster(profile, world_size, per_node), (
        f"CPU profile {'read from' if cached else 'measured into'} {where}; {per_node} ranks x {threads} threads on "
        f"{profile['cores']} cores: {100 * shared:.0f}% of one process's measured GEMM rate each")
