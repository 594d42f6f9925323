"""The two ceilings of this GPU, measured now: device-to-device copy bandwidth and bf16 GEMM rate.

    python bench/gpu_ceilings.py            # prints one `RESULT {json}` line (bench/gpu_suite.py reads it)

Copy: a 2 GiB tensor copied into another, counting bytes read plus bytes written, median of 20.
GEMM: 8192^3 bf16 on random data (zeros run faster and would flatter the ceiling), median of 10.
Kernel tables divide the bytes a kernel must move by the copy bandwidth to get its roofline time.
"""
import json
import statistics

import torch


def median_ms(fn, repeats, warmup=3):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def copy_time(n):
    src = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    return median_ms(lambda: dst.copy_(src), 20)


def gemm_time(n):
    a, b = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    return median_ms(lambda: a @ b, 10)


def main():
    if not torch.cuda.is_available():
        raise SystemExit("bench/gpu_ceilings.py needs a CUDA GPU")
    n = 1 << 30  # bf16 elements: 2 GiB
    copy_ms = copy_time(n)
    gemm_ms = gemm_time(8192)
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
              "copy_tb_s": round(2 * n * 2 / copy_ms / 1e9, 3),
              "bf16_gemm_tflops": round(2 * 8192**3 / gemm_ms / 1e9, 1)}
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
