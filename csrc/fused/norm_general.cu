// LayerNorm and RMSNorm, the general path (norm.cu picks it for what the fast path cannot
// take: rows longer than its register tile, a row length that is not a multiple of 16 bytes,
// a pointer that is not 16-byte aligned). Scalar loads, any layout; the same math.
//
// Forward and the input gradient: one warp per row (the second and third reads of a row hit
// the cache). Statistics are two-pass (mean, then the sum of squared deviations). Weight and
// bias gradients are column sums over all rows: blocks of 32 columns x 8 row lanes write fp32
// partial sums for a slice of rows, and column_sums adds the slices.
#include <climits>

#include "common.cuh"
#include "norm_paths.h"

namespace megatron_fused {
namespace {

constexpr int kWarps = 4;
constexpr int kColTile = 32;
constexpr int kRowLanes = 8;
constexpr int kMaxPartials = 256;
constexpr int kRowsPerPartial = 64;

template <typename T, typename W, bool kRms>
__global__ void norm_forward_kernel(const T* __restrict__ x, const W* __restrict__ w, const W* __restrict__ b,
                                    T* __restrict__ y, float* __restrict__ mean, float* __restrict__ rstd,
                                    int64_t rows, int cols, float eps) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.y;
  if (row >= rows) return;
  const int lane = threadIdx.x;
  const T* xr = x + row * cols;
  T* yr = y + row * cols;
  float mu = 0.f;
  if (!kRms) {
    float s = 0.f;
    for (int c = lane; c < cols; c += 32) s += to_float(xr[c]);
    mu = warp_sum(s) / cols;
  }
  float ss = 0.f;
  for (int c = lane; c < cols; c += 32) {
    const float v = to_float(xr[c]) - mu;
    ss += v * v;
  }
  const float r = rsqrtf(warp_sum(ss) / cols + eps);
  for (int c = lane; c < cols; c += 32) {
    float v = (to_float(xr[c]) - mu) * r * to_float(w[c]);
    if (!kRms && b != nullptr) v += to_float(b[c]);
    yr[c] = from_float<T>(v);
  }
  if (lane == 0) {
    if (!kRms) mean[row] = mu;
    rstd[row] = r;
  }
}

// LayerNorm: dx = rstd (g - mean(g) - xhat mean(g xhat)), g = dy w, xhat = (x - mean) rstd.
// RMSNorm:   dx = rstd (g - xhat mean(g xhat)),             xhat = x rstd.
template <typename T, typename W, bool kRms>
__global__ void norm_backward_dx_kernel(const T* __restrict__ dy, const T* __restrict__ x,
                                        const float* __restrict__ mean, const float* __restrict__ rstd,
                                        const W* __restrict__ w, T* __restrict__ dx, int64_t rows, int cols) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.y;
  if (row >= rows) return;
  const int lane = threadIdx.x;
  const T* dyr = dy + row * cols;
  const T* xr = x + row * cols;
  T* dxr = dx + row * cols;
  const float mu = kRms ? 0.f : mean[row];
  const float r = rstd[row];
  float sg = 0.f, sgx = 0.f;
  for (int c = lane; c < cols; c += 32) {
    const float g = to_float(dyr[c]) * to_float(w[c]);
    sg += g;
    sgx += g * (to_float(xr[c]) - mu) * r;
  }
  sg = warp_sum(sg) / cols;
  sgx = warp_sum(sgx) / cols;
  for (int c = lane; c < cols; c += 32) {
    const float g = to_float(dyr[c]) * to_float(w[c]);
    float v = g - (to_float(xr[c]) - mu) * r * sgx;
    if (!kRms) v -= sg;
    dxr[c] = from_float<T>(r * v);
  }
}

template <typename T, bool kRms>
__global__ void norm_backward_partial_kernel(const T* __restrict__ dy, const T* __restrict__ x,
                                             const float* __restrict__ mean, const float* __restrict__ rstd,
                                             float* __restrict__ part_w, float* __restrict__ part_b, int64_t rows,
                                             int cols, int64_t rows_per_part) {
  __shared__ float sw[kRowLanes][kColTile + 1];
  __shared__ float sb[kRowLanes][kColTile + 1];
  const int c = blockIdx.x * kColTile + threadIdx.x;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * rows_per_part;
  const int64_t r1 = min(rows, r0 + rows_per_part);
  float aw = 0.f, ab = 0.f;
  if (c < cols) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kRowLanes) {
      const float g = to_float(dy[r * cols + c]);
      const float mu = kRms ? 0.f : mean[r];
      aw += g * (to_float(x[r * cols + c]) - mu) * rstd[r];
      ab += g;
    }
  }
  sw[threadIdx.y][threadIdx.x] = aw;
  sb[threadIdx.y][threadIdx.x] = ab;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    float tw = 0.f, tb = 0.f;
#pragma unroll
    for (int i = 0; i < kRowLanes; ++i) {
      tw += sw[i][threadIdx.x];
      tb += sb[i][threadIdx.x];
    }
    part_w[static_cast<int64_t>(blockIdx.y) * cols + c] = tw;
    part_b[static_cast<int64_t>(blockIdx.y) * cols + c] = tb;
  }
}

template <typename T, typename W>
cudaError_t forward_impl(const void* x, const void* w, const void* b, void* y, float* mean, float* rstd, int64_t rows,
                         int cols, float eps, bool rms, cudaStream_t stream) {
  const int64_t blocks = (rows + kWarps - 1) / kWarps;
  if (blocks > INT_MAX) return cudaErrorInvalidConfiguration;
  const dim3 grid(static_cast<unsigned>(blocks)), block(32, kWarps);
  const T* xp = static_cast<const T*>(x);
  const W* wp = static_cast<const W*>(w);
  const W* bp = static_cast<const W*>(b);
  if (rms) {
    norm_forward_kernel<T, W, true><<<grid, block, 0, stream>>>(xp, wp, bp, static_cast<T*>(y), mean, rstd, rows, cols, eps);
  } else {
    norm_forward_kernel<T, W, false><<<grid, block, 0, stream>>>(xp, wp, bp, static_cast<T*>(y), mean, rstd, rows, cols, eps);
  }
  return cudaGetLastError();
}

template <typename T, typename W>
cudaError_t backward_impl(const void* dy, const void* x, const float* mean, const float* rstd, const void* w, void* dx,
                          void* dw, void* db, float* workspace, int64_t rows, int cols, bool rms, cudaStream_t stream) {
  const int64_t blocks = (rows + kWarps - 1) / kWarps;
  if (blocks > INT_MAX) return cudaErrorInvalidConfiguration;
  const T* dyp = static_cast<const T*>(dy);
  const T* xp = static_cast<const T*>(x);
  const dim3 grid(static_cast<unsigned>(blocks)), block(32, kWarps);
  if (rms) {
    norm_backward_dx_kernel<T, W, true><<<grid, block, 0, stream>>>(dyp, xp, mean, rstd, static_cast<const W*>(w),
                                                                    static_cast<T*>(dx), rows, cols);
  } else {
    norm_backward_dx_kernel<T, W, false><<<grid, block, 0, stream>>>(dyp, xp, mean, rstd, static_cast<const W*>(w),
                                                                     static_cast<T*>(dx), rows, cols);
  }
  const int parts = norm_general_partials(rows);
  const int64_t rows_per_part = (rows + parts - 1) / parts;
  float* part_w = workspace;
  float* part_b = workspace + static_cast<int64_t>(parts) * cols;
  const dim3 pgrid((cols + kColTile - 1) / kColTile, parts), pblock(kColTile, kRowLanes);
  if (rms) {
    norm_backward_partial_kernel<T, true><<<pgrid, pblock, 0, stream>>>(dyp, xp, mean, rstd, part_w, part_b, rows, cols,
                                                                        rows_per_part);
  } else {
    norm_backward_partial_kernel<T, false><<<pgrid, pblock, 0, stream>>>(dyp, xp, mean, rstd, part_w, part_b, rows,
                                                                         cols, rows_per_part);
  }
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  return column_sums(workspace, parts, cols, (rms || db == nullptr) ? 1 : 2, dw, db, dtype_of<W>(), stream);
}

}  // namespace

int norm_general_partials(int64_t rows) {
  const int64_t p = (rows + kRowsPerPartial - 1) / kRowsPerPartial;
  return static_cast<int>(p < 1 ? 1 : (p > kMaxPartials ? kMaxPartials : p));
}

cudaError_t norm_forward_general(const void* x, const void* weight, const void* bias, void* y, float* mean, float* rstd,
                         int64_t rows, int cols, float eps, bool rms, int dtype, int wdtype, cudaStream_t stream) {
  NORM_DISPATCH(dtype, wdtype, forward_impl, x, weight, bias, y, mean, rstd, rows, cols, eps, rms, stream);
  return cudaErrorInvalidValue;
}

cudaError_t norm_backward_general(const void* dy, const void* x, const float* mean, const float* rstd, const void* weight,
                          void* dx, void* dweight, void* dbias, float* workspace, int64_t rows, int cols, bool rms,
                          int dtype, int wdtype, cudaStream_t stream) {
  NORM_DISPATCH(dtype, wdtype, backward_impl, dy, x, mean, rstd, weight, dx, dweight, dbias, workspace, rows, cols,
                rms, stream);
  return cudaErrorInvalidValue;
}

}  // namespace megatron_fused
