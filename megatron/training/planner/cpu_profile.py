"""Measuring this CPU machine for cpu_calibration.py: a few seconds, once per machine (then cached).

GEMM: fp32 n x n x n matmuls at GEMM_DIMS, the best of REPEATS (the least disturbed by other load). Copy:
a 64 MiB tensor copy (read + write). Links: two forked processes on gloo over loopback, an all-reduce of
LINK_BYTES (bus bandwidth 2 (n-1)/n bytes / time, n = 2) and a 4-byte all-reduce for the latency.
"""
import datetime
import multiprocessing
import os
import socket
import time

import torch
import torch.distributed as dist

GEMM_DIMS = (64, 128, 256, 512)
REPEATS = 5
COPY_BYTES = 64 << 20
LINK_BYTES = 4 << 20


def _best(fn, repeats=REPEATS) -> float:
    fn()  # warm-up: allocation, thread pool start
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def gemm_flops(dims=GEMM_DIMS) -> list[float]:
    gen = torch.Generator().manual_seed(0)
    out = []
    for n in dims:
        a, b = torch.randn(n, n, generator=gen), torch.randn(n, n, generator=gen)
        calls = max(1, int(2e8 // (2 * n ** 3)))  # about 0.2 GFLOP per timing, enough above the timer's noise
        out.append(2.0 * n ** 3 * calls / _best(lambda a=a, b=b, k=calls: [torch.mm(a, b) for _ in range(k)]))
    return out


def copy_bandwidth() -> float:
    src = torch.ones(COPY_BYTES // 4)
    dst = torch.empty_like(src)
    return 2.0 * COPY_BYTES / _best(lambda: dst.copy_(src))


def _link_worker(rank, port, threads, queue):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(threads)
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=60))
    try:
        big, small = torch.ones(LINK_BYTES // 4), torch.ones(1)
        seconds = _best(lambda: dist.all_reduce(big))
        latency = _best(lambda: dist.all_reduce(small), repeats=20)
        if rank == 0:
            queue.put((LINK_BYTES / seconds, latency))  # bus bandwidth at n = 2: 2 (n-1)/n x bytes / time
    finally:
        dist.destroy_process_group()


def link(threads) -> tuple[float, float]:
    """(all-reduce bus bandwidth bytes/s, small all-reduce seconds) between two local gloo processes."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = multiprocessing.get_context("fork")  # the children have torch already: no second import
    queue = ctx.Queue()
    procs = [ctx.Process(target=_link_worker, args=(r, port, threads, queue)) for r in range(2)]
    for p in procs:
        p.start()
    try:
        result = queue.get(timeout=120)
    finally:
        for p in procs:
            p.join(timeout=30)
    return result


def memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def measure(threads) -> dict:
    """The profile cpu_calibration.to_cluster reads, measured at `threads` threads per process."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        flops = gemm_flops()
        bw = copy_bandwidth()
    finally:
        torch.set_num_threads(previous)
    link_bw, latency = link(threads)
    return {"threads": threads, "cores": cores(), "gemm_dims": list(GEMM_DIMS), "gemm_flops": flops,
            "copy_bw": bw, "allreduce_bus_bw": link_bw, "latency": latency, "link_bytes": LINK_BYTES,
            "memory_bytes": memory_bytes(), "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def cores() -> int:
    """The cores this process may run on (its affinity, as torch's default thread count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1
