// Scaled softmax, the fast path: each row is read once into registers (16-byte accesses,
// kSoftmaxFastElems elements per thread, blockDim.x threads per row; the mask in accesses of
// as many bytes as elements), its max and sum of exponentials are reduced over the row's
// threads, and it is written once; the next row's loads are in flight meanwhile. Causal rows
// skip the vectors past their diagonal. Bytes that move: x + y (+ the mask, once per row of
// its own), backward dy + y + dx.
#include <cmath>

#include "common.cuh"
#include "softmax_paths.h"

namespace megatron_fused {
namespace {

constexpr int kE = kSoftmaxFastElems;
constexpr int kMaxThreads = 1024;
constexpr int kTargetThreads = 512;

template <typename T>
struct Tile {
  static constexpr int kVec = 16 / sizeof(T);
  static constexpr int kPer = kE / kVec;
  __device__ __forceinline__ static int col(int p) { return (p * blockDim.x + threadIdx.x) * kVec; }
};

// What a thread loads of one row: x vectors and, with a padding mask, the mask's bytes.
template <typename T, int kMask>
struct RowLoad {
  static constexpr int kVec = Tile<T>::kVec, kPer = Tile<T>::kPer;
  Vec<T, kVec> x[kPer];
  Vec<uint8_t, kVec> m[kMask == 1 ? kPer : 1];

  __device__ __forceinline__ void load(const T* __restrict__ xs, const uint8_t* __restrict__ mask, int64_t row,
                                       int64_t rows, int cols, int sq, int heads, int mask_batches) {
    const bool live = row < rows;
    const int q = live ? static_cast<int>(row % sq) : 0;
    const uint8_t* mr = nullptr;
    if (kMask == 1 && live) {
      const int64_t b = mask_batches == 1 ? 0 : row / (static_cast<int64_t>(heads) * sq);
      mr = mask + (b * sq + q) * static_cast<int64_t>(cols);
    }
#pragma unroll
    for (int p = 0; p < kPer; ++p) {
      const int c = Tile<T>::col(p);
      const bool in = live && c < cols && (kMask != 2 || c <= q);  // causal: vectors past the diagonal stay unread
      x[p].zero();
      if (in) x[p].load(xs + row * cols + c);
      if (kMask == 1) {
        m[p].zero();
        if (in) m[p].load(mr + c);
      }
    }
  }
};

template <typename T, int kMask>
__global__ void __launch_bounds__(kMaxThreads) softmax_forward_kernel(const T* __restrict__ x, T* __restrict__ y,
                                                                      const uint8_t* __restrict__ mask, int64_t rows,
                                                                      int cols, int sq, int heads, int mask_batches,
                                                                      float scale) {
  constexpr int kVec = Tile<T>::kVec, kPer = Tile<T>::kPer;
  __shared__ float scratch[32];
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.y;
  int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  RowLoad<T, kMask> cur, next;
  cur.load(x, mask, row, rows, cols, sq, heads, mask_batches);
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * blockDim.y; base < rows; base += step, row += step) {
    next.load(x, mask, row + step, rows, cols, sq, heads, mask_batches);
    const int q = row < rows ? static_cast<int>(row % sq) : 0;
    float v[kE];
    float m[1] = {-INFINITY};
#pragma unroll
    for (int p = 0; p < kPer; ++p) {
      const int c = Tile<T>::col(p);
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        const bool keep = c + i < cols && (kMask != 1 || !cur.m[p].at(i)) &&
                          (kMask != 2 || c + i <= q);
        v[p * kVec + i] = keep ? cur.x[p].get(i) * scale : -INFINITY;
        m[0] = fmaxf(m[0], v[p * kVec + i]);  // a NaN is skipped here and poisons the sum below, as in torch
      }
    }
    row_reduce<1, true>(m, scratch);
    float s[1] = {0.f};
#pragma unroll
    for (int e = 0; e < kE; ++e) {
      v[e] = __expf(v[e] - m[0]);  // exp(-inf) = 0 for masked entries
      s[0] += v[e];
    }
    row_reduce<1, false>(s, scratch);
    // every entry masked (max -inf): zeros, not NaN
    const float inv = m[0] == -INFINITY ? 0.f : 1.f / s[0];
    if (row < rows) {
#pragma unroll
      for (int p = 0; p < kPer; ++p) {
        const int c = Tile<T>::col(p);
        if (c < cols) {
          Vec<T, kVec> out;
#pragma unroll
          for (int i = 0; i < kVec; ++i) out.set(i, inv == 0.f ? 0.f : v[p * kVec + i] * inv);
          out.store(y + row * cols + c);
        }
      }
    }
    cur = next;
  }
}

// dx = scale y (dy - sum(dy y)); masked entries have y = 0, so dx = 0 (causal_sq > 0: the
// entries past the diagonal are not even read)
template <typename T>
__global__ void __launch_bounds__(kMaxThreads) softmax_backward_kernel(const T* __restrict__ dy,
                                                                       const T* __restrict__ y, T* __restrict__ dx,
                                                                       int64_t rows, int cols, int causal_sq,
                                                                       float scale) {
  constexpr int kVec = Tile<T>::kVec, kPer = Tile<T>::kPer;
  __shared__ float scratch[32];
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.y;
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * blockDim.y; base < rows; base += step) {
    const int64_t row = base + threadIdx.y;
    const int last = causal_sq > 0 && row < rows ? static_cast<int>(row % causal_sq) : cols - 1;
    Vec<T, kVec> g[kPer], p_[kPer];
#pragma unroll
    for (int p = 0; p < kPer; ++p) {
      g[p].zero();
      p_[p].zero();
      if (row < rows && Tile<T>::col(p) < cols && Tile<T>::col(p) <= last) {
        g[p].load(dy + row * cols + Tile<T>::col(p));
        p_[p].load(y + row * cols + Tile<T>::col(p));
      }
    }
    float dot[1] = {0.f};
#pragma unroll
    for (int p = 0; p < kPer; ++p) {
#pragma unroll
      for (int i = 0; i < kVec; ++i) dot[0] += g[p].get(i) * p_[p].get(i);
    }
    row_reduce<1, false>(dot, scratch);
    if (row < rows) {
#pragma unroll
      for (int p = 0; p < kPer; ++p) {
        if (Tile<T>::col(p) < cols) {
#pragma unroll
          for (int i = 0; i < kVec; ++i) g[p].set(i, scale * p_[p].get(i) * (g[p].get(i) - dot[0]));
          g[p].store(dx + row * cols + Tile<T>::col(p));
        }
      }
    }
  }
}

struct Plan {
  dim3 grid, block;
};

template <auto kKernel>
Plan plan(int64_t rows, int cols) {
  const int tpr = static_cast<int>(ceil_div(ceil_div(cols, kE), 32) * 32);
  const int rpb = tpr >= kTargetThreads ? 1 : kTargetThreads / tpr;
  const int64_t wanted = ceil_div(rows, rpb);
  const int64_t cap = static_cast<int64_t>(sm_count()) * resident_blocks_cached<kKernel>(tpr * rpb);
  return Plan{dim3(static_cast<unsigned>(wanted < cap ? wanted : cap)), dim3(tpr, rpb)};
}

template <typename T, int kMask>
cudaError_t forward_impl(const void* x, void* y, const uint8_t* mask, int64_t rows, int cols, int sq, int heads,
                         int mask_batches, float scale, cudaStream_t stream) {
  const Plan p = plan<softmax_forward_kernel<T, kMask>>(rows, cols);
  softmax_forward_kernel<T, kMask><<<p.grid, p.block, 0, stream>>>(static_cast<const T*>(x), static_cast<T*>(y), mask,
                                                                   rows, cols, sq, heads, mask_batches, scale);
  return cudaGetLastError();
}

}  // namespace

cudaError_t softmax_forward_fast(const void* x, void* y, const uint8_t* mask, int mask_kind, int64_t rows, int cols,
                                 int sq, int heads, int mask_batches, float scale, int dtype, cudaStream_t stream) {
  MEGATRON_DISPATCH(dtype, T, {
    if (mask_kind == 0) return forward_impl<T, 0>(x, y, mask, rows, cols, sq, heads, mask_batches, scale, stream);
    if (mask_kind == 1) return forward_impl<T, 1>(x, y, mask, rows, cols, sq, heads, mask_batches, scale, stream);
    return forward_impl<T, 2>(x, y, mask, rows, cols, sq, heads, mask_batches, scale, stream);
  });
  return cudaErrorInvalidValue;
}

cudaError_t softmax_backward_fast(const void* dy, const void* y, void* dx, int64_t rows, int cols, int causal_sq,
                                  float scale, int dtype, cudaStream_t stream) {
  MEGATRON_DISPATCH(dtype, T, {
    const Plan p = plan<softmax_backward_kernel<T>>(rows, cols);
    softmax_backward_kernel<T><<<p.grid, p.block, 0, stream>>>(static_cast<const T*>(dy), static_cast<const T*>(y),
                                                               static_cast<T*>(dx), rows, cols, causal_sq, scale);
    return cudaGetLastError();
  });
  return cudaErrorInvalidValue;
}

}  // namespace megatron_fused
