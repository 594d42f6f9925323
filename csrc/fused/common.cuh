// Device helpers shared by the kernels: fp32 conversions, 16-byte vector access, warp and
// block-row reductions, launch sizing, dtype dispatch.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

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

// The dtype code of a storage type (the inverse of MEGATRON_DISPATCH).
template <typename T> constexpr int dtype_of();
template <> constexpr int dtype_of<float>() { return kFloat32; }
template <> constexpr int dtype_of<__half>() { return kFloat16; }
template <> constexpr int dtype_of<__nv_bfloat16>() { return kBFloat16; }

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

// ---- vector access ------------------------------------------------------------------------
// kN elements of T moved as one access: 16 bytes on the fast paths (8 bf16 / fp16, 4 fp32),
// one element on the scalar ones. The address must be aligned to the access size; the host
// checks that before it picks a vector width (aligned16 below).
template <int kBytes> struct RawOf;
template <> struct RawOf<16> { using type = uint4; };
template <> struct RawOf<8> { using type = uint2; };
template <> struct RawOf<4> { using type = unsigned int; };
template <> struct RawOf<2> { using type = unsigned short; };
template <> struct RawOf<1> { using type = unsigned char; };

template <typename T, int kN>
struct Vec {
  using Raw = typename RawOf<sizeof(T) * kN>::type;
  Raw raw;
  __device__ __forceinline__ void load(const T* p) { raw = *reinterpret_cast<const Raw*>(p); }
  __device__ __forceinline__ void store(T* p) const { *reinterpret_cast<Raw*>(p) = raw; }
  __device__ __forceinline__ void zero() { raw = Raw{}; }
  __device__ __forceinline__ float get(int i) const { return to_float(reinterpret_cast<const T*>(&raw)[i]); }
  __device__ __forceinline__ T at(int i) const { return reinterpret_cast<const T*>(&raw)[i]; }
  __device__ __forceinline__ void set(int i, float v) { reinterpret_cast<T*>(&raw)[i] = from_float<T>(v); }
};

// kN elements of U at p as floats, in accesses of at most 16 bytes (fp32 weights beside bf16
// activations take two); p aligned to min(16, kN * sizeof(U)) bytes.
template <typename U, int kN>
__device__ __forceinline__ void load_floats(const U* __restrict__ p, float* out) {
  constexpr int kChunk = (kN * static_cast<int>(sizeof(U)) > 16) ? 16 / static_cast<int>(sizeof(U)) : kN;
#pragma unroll
  for (int i = 0; i < kN; i += kChunk) {
    Vec<U, kChunk> v;
    v.load(p + i);
#pragma unroll
    for (int j = 0; j < kChunk; ++j) out[i + j] = v.get(j);
  }
}

// ---- block-row reductions -----------------------------------------------------------------
// A block of (blockDim.x, blockDim.y) threads works on blockDim.y rows at once, blockDim.x
// threads (a multiple of 32) per row, so no warp spans two rows. row_reduce combines v[0..N)
// over the threads of this thread's row; every thread of the row gets the result, in the
// same (fixed) order everywhere, so results are deterministic. Every thread of the block must
// call it: with more than one warp per row it synchronises the block. scratch: 32 * N floats
// of shared memory.
template <int N, bool kMax>
__device__ __forceinline__ void row_reduce(float (&v)[N], float* scratch) {
#pragma unroll
  for (int i = 0; i < N; ++i) v[i] = kMax ? warp_max(v[i]) : warp_sum(v[i]);
  const int warps = blockDim.x >> 5;
  if (warps == 1) return;
  float* s = scratch + threadIdx.y * warps * N;
  __syncthreads();  // the previous reduction has read its values
  if ((threadIdx.x & 31) == 0) {
#pragma unroll
    for (int i = 0; i < N; ++i) s[(threadIdx.x >> 5) * N + i] = v[i];
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < N; ++i) {
    float t = s[i];
    for (int w = 1; w < warps; ++w) t = kMax ? fmaxf(t, s[w * N + i]) : t + s[w * N + i];
    v[i] = t;
  }
}

// ---- launch sizing ------------------------------------------------------------------------
inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Multiprocessors of the current device, asked once per device (no runtime query after the
// first call: nothing that could disturb a CUDA graph capture).
inline int sm_count() {
  static std::atomic<int> cache[64];
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();  // clear it: the launch after this reports its own errors
    return 132;          // an H100 / H200
  }
  std::atomic<int>& slot = cache[device & 63];
  sms = slot.load(std::memory_order_relaxed);
  if (sms > 0) return sms;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || sms < 1) {
    cudaGetLastError();
    return 132;
  }
  slot.store(sms, std::memory_order_relaxed);
  return sms;
}

// Blocks of `threads` that one multiprocessor runs at once for `kernel` (at least 1).
template <typename Kernel>
inline int resident_blocks(Kernel kernel, int threads) {
  int blocks = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, 0) != cudaSuccess || blocks < 1) {
    cudaGetLastError();
    return 1;
  }
  return blocks;
}

// resident_blocks of a kernel, computed once per block size (the same GPU model throughout a
// process is assumed: a mix would only size the grid less well, never wrongly).
template <auto kKernel>
inline int resident_blocks_cached(int threads) {
  static std::atomic<int> cache[1024 / 32 + 1];
  std::atomic<int>& slot = cache[threads / 32];
  int blocks = slot.load(std::memory_order_relaxed);
  if (blocks == 0) {
    blocks = resident_blocks(kKernel, threads);
    slot.store(blocks, std::memory_order_relaxed);
  }
  return blocks;
}

// Grid size for a grid-stride elementwise loop: enough blocks to fill the GPU, no more.
inline int elementwise_blocks(int64_t n, int threads) {
  int64_t blocks = (n + threads - 1) / threads;
  const int64_t cap = 65536;
  return static_cast<int>(blocks < 1 ? 1 : (blocks > cap ? cap : blocks));
}

// Partial column sums -> out (see column_sums.cu): out_k[c] = sum_p part[k][p][c], k < arrays.
cudaError_t column_sums(const float* part, int64_t parts, int cols, int arrays, void* out0, void* out1,
                        int out_dtype, cudaStream_t stream);

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
