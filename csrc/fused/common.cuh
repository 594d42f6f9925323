// Device helpers shared by the kernels: fp32 conversions, warp reductions, dtype dispatch.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "fused_kernels.h"

namespace megatron_fused {

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

constexpr unsigned kFullMask = 0xffffffffu;

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, offset));
  return v;
}

// Grid size for a grid-stride elementwise loop: enough blocks to fill the GPU, no more.
inline int elementwise_blocks(int64_t n, int threads) {
  int64_t blocks = (n + threads - 1) / threads;
  const int64_t cap = 65536;
  return static_cast<int>(blocks < 1 ? 1 : (blocks > cap ? cap : blocks));
}

}  // namespace megatron_fused

// Runs the statement with `scalar_t` bound to the storage type of dtype code `code`;
// an unknown code returns cudaErrorInvalidValue from the enclosing launcher.
#define MEGATRON_DISPATCH(code, scalar_t, ...)                                  \
  switch (code) {                                                               \
    case ::megatron_fused::kFloat32: { using scalar_t = float; __VA_ARGS__; break; }          \
    case ::megatron_fused::kFloat16: { using scalar_t = __half; __VA_ARGS__; break; }         \
    case ::megatron_fused::kBFloat16: { using scalar_t = __nv_bfloat16; __VA_ARGS__; break; } \
    default: return cudaErrorInvalidValue;                                      \
  }
