// Scaled softmax, the general path (softmax.cu picks it for what the fast path cannot take:
// rows longer than its register tile, a row length that is not a multiple of 16 bytes, a
// pointer that is not 16-byte aligned). One warp per row, scalar loads, fp32 math.
//
// The forward reads each row twice: pass 1 keeps a running max and a running sum of
// exponentials (rescaled when the max grows, the "online softmax"), merged across the
// warp; pass 2 writes exp(v - max) / sum. Causal rows stop reading at their diagonal.
#include <climits>
#include <cmath>

#include "common.cuh"
#include "softmax_paths.h"

namespace megatron_fused {
namespace {

constexpr int kWarps = 4;  // rows per block of 128 threads

// d * exp(m - mx), where d == 0 stands for "no entries yet" (m may be -inf then)
__device__ __forceinline__ float rescale(float d, float m, float mx) { return d == 0.f ? 0.f : d * expf(m - mx); }

// kMask: 0 none, 1 padding mask, 2 causal
template <typename T, int kMask>
__global__ void softmax_forward_kernel(const T* __restrict__ x, T* __restrict__ y, const uint8_t* __restrict__ mask,
                                       int64_t rows, int cols, int sq, int heads, int mask_batches, float scale) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.y;
  if (row >= rows) return;  // the row is the same for the whole warp: it leaves together
  const int lane = threadIdx.x;
  const T* xr = x + row * cols;
  T* yr = y + row * cols;
  const int q = static_cast<int>(row % sq);
  const uint8_t* mr = nullptr;
  if (kMask == 1) {
    const int64_t b = mask_batches == 1 ? 0 : row / (static_cast<int64_t>(heads) * sq);
    mr = mask + (b * sq + q) * static_cast<int64_t>(cols);
  }
  const int valid = kMask == 2 ? min(cols, q + 1) : cols;  // causal: columns > q are masked

  float m = -INFINITY, d = 0.f;
  for (int c = lane; c < valid; c += 32) {
    if (kMask == 1 && mr[c]) continue;
    const float v = to_float(xr[c]) * scale;
    if (v == -INFINITY) continue;  // contributes exp(-inf) = 0
    if (v > m) {
      d = rescale(d, m, v) + 1.f;
      m = v;
    } else {
      d += expf(v - m);  // a NaN input makes d NaN, and the row NaN, as in torch
    }
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float m2 = __shfl_xor_sync(kFullMask, m, offset);
    const float d2 = __shfl_xor_sync(kFullMask, d, offset);
    const float mx = fmaxf(m, m2);
    d = rescale(d, m, mx) + rescale(d2, m2, mx);
    m = mx;
  }
  // d == 0: every entry masked (or -inf): the row is all zeros rather than NaN
  const float inv = d == 0.f ? 0.f : 1.f / d;
  for (int c = lane; c < cols; c += 32) {
    float p = 0.f;
    if (c < valid && !(kMask == 1 && mr[c]) && inv != 0.f) p = expf(to_float(xr[c]) * scale - m) * inv;
    yr[c] = from_float<T>(p);
  }
}

template <typename T>
__global__ void softmax_backward_kernel(const T* __restrict__ dy, const T* __restrict__ y, T* __restrict__ dx,
                                        int64_t rows, int cols, float scale) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.y;
  if (row >= rows) return;
  const int lane = threadIdx.x;
  const T* dyr = dy + row * cols;
  const T* yr = y + row * cols;
  T* dxr = dx + row * cols;
  float dot = 0.f;
  for (int c = lane; c < cols; c += 32) dot += to_float(dyr[c]) * to_float(yr[c]);
  dot = warp_sum(dot);
  for (int c = lane; c < cols; c += 32) dxr[c] = from_float<T>(scale * to_float(yr[c]) * (to_float(dyr[c]) - dot));
}

bool grid_for(int64_t rows, dim3* grid) {
  const int64_t blocks = (rows + kWarps - 1) / kWarps;
  if (blocks > INT_MAX) return false;
  *grid = dim3(static_cast<unsigned>(blocks));
  return true;
}

}  // namespace

cudaError_t softmax_forward_general(const void* x, void* y, const uint8_t* mask, int mask_kind, int64_t rows,
                                    int cols, int sq, int heads, int mask_batches, float scale, int dtype,
                                    cudaStream_t stream) {
  dim3 grid;
  if (!grid_for(rows, &grid)) return cudaErrorInvalidConfiguration;
  const dim3 block(32, kWarps);
  MEGATRON_DISPATCH(dtype, T, {
    const T* xp = static_cast<const T*>(x);
    T* yp = static_cast<T*>(y);
    if (mask_kind == 0) {
      softmax_forward_kernel<T, 0><<<grid, block, 0, stream>>>(xp, yp, mask, rows, cols, sq, heads, mask_batches, scale);
    } else if (mask_kind == 1) {
      softmax_forward_kernel<T, 1><<<grid, block, 0, stream>>>(xp, yp, mask, rows, cols, sq, heads, mask_batches, scale);
    } else {
      softmax_forward_kernel<T, 2><<<grid, block, 0, stream>>>(xp, yp, mask, rows, cols, sq, heads, mask_batches, scale);
    }
  });
  return cudaGetLastError();
}

cudaError_t softmax_backward_general(const void* dy, const void* y, void* dx, int64_t rows, int cols, float scale,
                                     int dtype, cudaStream_t stream) {
  dim3 grid;
  if (!grid_for(rows, &grid)) return cudaErrorInvalidConfiguration;
  const dim3 block(32, kWarps);
  MEGATRON_DISPATCH(dtype, T, {
    softmax_backward_kernel<T><<<grid, block, 0, stream>>>(static_cast<const T*>(dy), static_cast<const T*>(y),
                                                           static_cast<T*>(dx), rows, cols, scale);
  });
  return cudaGetLastError();
}

}  // namespace megatron_fused
