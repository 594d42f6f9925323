// LayerNorm and RMSNorm, the fast path: each row is read once into registers (16-byte
// accesses, kNormFastElems elements per thread, blockDim.x threads per row) and written once.
//
// Forward: mean and variance from the registers (two-pass, exact), the next row's load in
// flight meanwhile. Backward, one pass over dy and x: dx from two row sums, and each thread
// adds its columns' dgamma (dy xhat) and dbeta (dy) contributions into registers across all
// the rows its block visits (a persistent grid); at the end every row slot writes its fp32
// partial sums, which column_sums adds up. The bytes that move are those of x, y (forward) and
// dy, x, dx (backward), plus the partials: blocks x rows_per_block x cols floats, from L2.
#include "common.cuh"
#include "norm_paths.h"

namespace megatron_fused {
namespace {

constexpr int kE = kNormFastElems;
constexpr int kMaxThreads = 1024;
constexpr int kTargetThreads = 512;  // threads per block where rows are short

// This thread's accesses in a row: access p starts at column (p * blockDim.x + threadIdx.x) * kVec.
template <typename T>
struct RowTile {
  static constexpr int kVec = 16 / sizeof(T);
  static constexpr int kPer = kE / kVec;
  __device__ __forceinline__ static int col(int p) { return (p * blockDim.x + threadIdx.x) * kVec; }
};

template <typename T, typename W, bool kRms>
__global__ void __launch_bounds__(kMaxThreads) norm_forward_kernel(const T* __restrict__ x, const W* __restrict__ w,
                                                                   const W* __restrict__ b, T* __restrict__ y,
                                                                   float* __restrict__ mean,
                                                                   float* __restrict__ rstd, int64_t rows, int cols,
                                                                   float eps) {
  using Tile = RowTile<T>;
  constexpr int kVec = Tile::kVec, kPer = Tile::kPer;
  __shared__ float scratch[32];
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.y;
  const float inv_cols = 1.f / cols;
  Vec<T, kVec> cur[kPer], next[kPer];
  int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
#pragma unroll
  for (int p = 0; p < kPer; ++p) {
    cur[p].zero();
    if (row < rows && Tile::col(p) < cols) cur[p].load(x + row * cols + Tile::col(p));
  }
  // every thread of the block runs the same number of iterations (row_reduce synchronises)
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * blockDim.y; base < rows; base += step, row += step) {
    const int64_t nrow = row + step;
#pragma unroll
    for (int p = 0; p < kPer; ++p) {
      next[p].zero();
      if (nrow < rows && Tile::col(p) < cols) next[p].load(x + nrow * cols + Tile::col(p));
    }
    float v[kE];
    float s[1] = {0.f};
#pragma unroll
    for (int p = 0; p < kPer; ++p) {
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        v[p * kVec + i] = cur[p].get(i);  // zero outside the row
        s[0] += v[p * kVec + i];
      }
    }
    float mu = 0.f;
    if (!kRms) {
      row_reduce<1, false>(s, scratch);
      mu = s[0] * inv_cols;
    }
    float ss[1] = {0.f};
#pragma unroll
    for (int p = 0; p < kPer; ++p) {
      if (Tile::col(p) < cols) {
#pragma unroll
        for (int i = 0; i < kVec; ++i) {
          const float d = v[p * kVec + i] - mu;
          ss[0] += d * d;
        }
      }
    }
    row_reduce<1, false>(ss, scratch);
    const float r = rsqrtf(ss[0] * inv_cols + eps);
    if (row < rows) {
#pragma unroll
      for (int p = 0; p < kPer; ++p) {
        const int c = Tile::col(p);
        if (c < cols) {
          float wf[kVec], bf[kVec];
          load_floats<W, kVec>(w + c, wf);
          if (!kRms && b != nullptr) load_floats<W, kVec>(b + c, bf);
          Vec<T, kVec> out;
#pragma unroll
          for (int i = 0; i < kVec; ++i) {
            float o = (v[p * kVec + i] - mu) * r * wf[i];
            if (!kRms && b != nullptr) o += bf[i];
            out.set(i, o);
          }
          out.store(y + row * cols + c);
        }
      }
      if (threadIdx.x == 0) {
        if (!kRms) mean[row] = mu;
        rstd[row] = r;
      }
    }
#pragma unroll
    for (int p = 0; p < kPer; ++p) cur[p] = next[p];
  }
}

// LayerNorm: dx = rstd (g - mean(g) - xhat mean(g xhat)), g = dy w, xhat = (x - mean) rstd.
// RMSNorm:   dx = rstd (g - xhat mean(g xhat)),             xhat = x rstd.
template <typename T, typename W, bool kRms>
__global__ void __launch_bounds__(kMaxThreads) norm_backward_kernel(
    const T* __restrict__ dy, const T* __restrict__ x, const float* __restrict__ mean,
    const float* __restrict__ rstd, const W* __restrict__ w, T* __restrict__ dx, float* __restrict__ part_w,
    float* __restrict__ part_b, int64_t rows, int cols) {
  using Tile = RowTile<T>;
  constexpr int kVec = Tile::kVec, kPer = Tile::kPer;
  __shared__ float scratch[32 * 2];
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.y;
  const float inv_cols = 1.f / cols;
  float acc_w[kE], acc_b[kE];
#pragma unroll
  for (int e = 0; e < kE; ++e) acc_w[e] = acc_b[e] = 0.f;
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * blockDim.y; base < rows; base += step) {
    const int64_t row = base + threadIdx.y;
    const bool live = row < rows;
    Vec<T, kVec> gv[kPer], xv[kPer];
#pragma unroll
    for (int p = 0; p < kPer; ++p) {
      gv[p].zero();
      xv[p].zero();
      if (live && Tile::col(p) < cols) {
        gv[p].load(dy + row * cols + Tile::col(p));
        xv[p].load(x + row * cols + Tile::col(p));
      }
    }
    const float mu = (kRms || !live) ? 0.f : mean[row];
    const float r = live ? rstd[row] : 0.f;
    float g[kE], xh[kE];
    float sums[2] = {0.f, 0.f};  // sum g, sum g xhat
#pragma unroll
    for (int p = 0; p < kPer; ++p) {
      float wf[kVec];
      if (Tile::col(p) < cols) {
        load_floats<W, kVec>(w + Tile::col(p), wf);
      } else {
#pragma unroll
        for (int i = 0; i < kVec; ++i) wf[i] = 0.f;
      }
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        const int e = p * kVec + i;
        const float d = gv[p].get(i);
        xh[e] = (xv[p].get(i) - mu) * r;  // zero outside the row and for rows past the end
        g[e] = d * wf[i];
        sums[0] += g[e];
        sums[1] += g[e] * xh[e];
        acc_w[e] += d * xh[e];
        if (!kRms) acc_b[e] += d;
      }
    }
    row_reduce<2, false>(sums, scratch);
    const float mg = sums[0] * inv_cols, mgx = sums[1] * inv_cols;
    if (live) {
#pragma unroll
      for (int p = 0; p < kPer; ++p) {
        if (Tile::col(p) < cols) {
          Vec<T, kVec> out;
#pragma unroll
          for (int i = 0; i < kVec; ++i) {
            const int e = p * kVec + i;
            out.set(i, r * (g[e] - xh[e] * mgx - (kRms ? 0.f : mg)));
          }
          out.store(dx + row * cols + Tile::col(p));
        }
      }
    }
  }
  const int64_t slot = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
#pragma unroll
  for (int p = 0; p < kPer; ++p) {
    const int c = Tile::col(p);
    if (c < cols) {
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        part_w[slot * cols + c + i] = acc_w[p * kVec + i];
        if (!kRms) part_b[slot * cols + c + i] = acc_b[p * kVec + i];
      }
    }
  }
}

template <typename T, typename W>
NormFastPlan plan_impl(int64_t rows, int cols, bool backward, bool rms) {
  NormFastPlan plan{};
  plan.threads_per_row = static_cast<int>(ceil_div(ceil_div(cols, kE), 32) * 32);
  plan.rows_per_block = plan.threads_per_row >= kTargetThreads ? 1 : kTargetThreads / plan.threads_per_row;
  const int threads = plan.threads_per_row * plan.rows_per_block;
  const int per_sm = backward ? (rms ? resident_blocks_cached<norm_backward_kernel<T, W, true>>(threads)
                                     : resident_blocks_cached<norm_backward_kernel<T, W, false>>(threads))
                              : (rms ? resident_blocks_cached<norm_forward_kernel<T, W, true>>(threads)
                                     : resident_blocks_cached<norm_forward_kernel<T, W, false>>(threads));
  const int64_t wanted = ceil_div(rows, plan.rows_per_block);
  const int64_t cap = static_cast<int64_t>(sm_count()) * per_sm;
  plan.blocks = static_cast<int>(wanted < cap ? wanted : cap);
  return plan;
}

template <typename T, typename W>
cudaError_t forward_impl(const void* x, const void* w, const void* b, void* y, float* mean, float* rstd, int64_t rows,
                         int cols, float eps, bool rms, cudaStream_t stream) {
  const NormFastPlan plan = plan_impl<T, W>(rows, cols, false, rms);
  const dim3 grid(plan.blocks), block(plan.threads_per_row, plan.rows_per_block);
  auto kernel = rms ? norm_forward_kernel<T, W, true> : norm_forward_kernel<T, W, false>;
  kernel<<<grid, block, 0, stream>>>(static_cast<const T*>(x), static_cast<const W*>(w), static_cast<const W*>(b),
                                     static_cast<T*>(y), mean, rstd, rows, cols, eps);
  return cudaGetLastError();
}

template <typename T, typename W>
cudaError_t backward_impl(const void* dy, const void* x, const float* mean, const float* rstd, const void* w, void* dx,
                          void* dw, void* db, float* workspace, int64_t rows, int cols, bool rms,
                          cudaStream_t stream) {
  const NormFastPlan plan = plan_impl<T, W>(rows, cols, true, rms);
  const dim3 grid(plan.blocks), block(plan.threads_per_row, plan.rows_per_block);
  float* part_w = workspace;
  float* part_b = workspace + plan.partial_rows() * cols;
  auto kernel = rms ? norm_backward_kernel<T, W, true> : norm_backward_kernel<T, W, false>;
  kernel<<<grid, block, 0, stream>>>(static_cast<const T*>(dy), static_cast<const T*>(x), mean, rstd,
                                     static_cast<const W*>(w), static_cast<T*>(dx), part_w, part_b, rows, cols);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  return column_sums(workspace, plan.partial_rows(), cols, (rms || db == nullptr) ? 1 : 2, dw, db, dtype_of<W>(),
                     stream);
}

template <typename T, typename W>
cudaError_t plan_into(NormFastPlan* out, int64_t rows, int cols, bool backward, bool rms) {
  *out = plan_impl<T, W>(rows, cols, backward, rms);
  return cudaSuccess;
}

}  // namespace

NormFastPlan norm_fast_plan(int64_t rows, int cols, bool backward, bool rms, int dtype, int wdtype) {
  NormFastPlan plan{};
  auto fill = [&]() -> cudaError_t {
    NORM_DISPATCH(dtype, wdtype, plan_into, &plan, rows, cols, backward, rms);
    return cudaErrorInvalidValue;
  };
  fill();
  return plan;
}

cudaError_t norm_forward_fast(const void* x, const void* weight, const void* bias, void* y, float* mean, float* rstd,
                              int64_t rows, int cols, float eps, bool rms, int dtype, int wdtype,
                              cudaStream_t stream) {
  NORM_DISPATCH(dtype, wdtype, forward_impl, x, weight, bias, y, mean, rstd, rows, cols, eps, rms, stream);
  return cudaErrorInvalidValue;
}

cudaError_t norm_backward_fast(const void* dy, const void* x, const float* mean, const float* rstd,
                               const void* weight, void* dx, void* dweight, void* dbias, float* workspace,
                               int64_t rows, int cols, bool rms, int dtype, int wdtype, cudaStream_t stream) {
  NORM_DISPATCH(dtype, wdtype, backward_impl, dy, x, mean, rstd, weight, dx, dweight, dbias, workspace, rows, cols,
                rms, stream);
  return cudaErrorInvalidValue;
}

}  // namespace megatron_fused
