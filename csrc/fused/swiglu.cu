// (Bias +) SwiGLU, forward and backward: x [rows, 2 f] = [gate | up] (+ bias [2 f]),
// y [rows, f] = silu(gate) * up. Layout as bias_gelu.cu (columns.cuh): a thread owns a column
// vector of the gate half and the same one of the up half, loads their bias once, and sums
// both halves' bias gradients in registers. Bytes that move: forward x + y (3 f per row),
// backward dy + x + dx (5 f per row).
#include "columns.cuh"

namespace megatron_fused {
namespace {

constexpr int kUnroll = 2;  // rows in flight per thread

__device__ __forceinline__ float sigmoid(float v) { return 1.f / (1.f + __expf(-v)); }

// The gate and up vectors of column c in row r of x [rows, 2 f].
template <typename T, int kVec>
__device__ __forceinline__ void load_halves(const T* __restrict__ x, int64_t r, int f, int c, Vec<T, kVec>& g,
                                            Vec<T, kVec>& u) {
  const T* xr = x + r * 2 * f;
  g.load(xr + c);
  u.load(xr + f + c);
}

// This thread's gate and up bias (zeros without a bias), loaded once.
template <typename T, int kVec>
__device__ __forceinline__ void load_bias_halves(const T* __restrict__ bias, int f, int c, float* bg, float* bu) {
#pragma unroll
  for (int i = 0; i < kVec; ++i) bg[i] = bu[i] = 0.f;
  if (bias != nullptr) {
    load_floats<T, kVec>(bias + c, bg);
    load_floats<T, kVec>(bias + f + c, bu);
  }
}

template <typename T, int kVec>
__global__ void __launch_bounds__(kColumnThreads) swiglu_forward_kernel(const T* __restrict__ x,
                                                                        const T* __restrict__ bias,
                                                                        T* __restrict__ y, int64_t rows, int f) {
  const int64_t c64 = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kVec;
  if (c64 >= f) return;
  const int c = static_cast<int>(c64);
  float bg[kVec], bu[kVec];
  load_bias_halves<T, kVec>(bias, f, c, bg, bu);
  const int64_t step = static_cast<int64_t>(gridDim.y) * blockDim.y;
  for (int64_t r = static_cast<int64_t>(blockIdx.y) * blockDim.y + threadIdx.y; r < rows; r += kUnroll * step) {
    Vec<T, kVec> g[kUnroll], u[kUnroll];
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      if (r + k * step < rows) load_halves<T, kVec>(x, r + k * step, f, c, g[k], u[k]);
    }
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      if (r + k * step < rows) {
#pragma unroll
        for (int i = 0; i < kVec; ++i) {
          const float gate = g[k].get(i) + bg[i];
          g[k].set(i, gate * sigmoid(gate) * (u[k].get(i) + bu[i]));
        }
        g[k].store(y + (r + k * step) * f + c);
      }
    }
  }
}

// d gate = dy up sig (1 + gate (1 - sig)),  d up = dy silu(gate)
template <typename T, int kVec>
__global__ void __launch_bounds__(kColumnThreads) swiglu_backward_kernel(
    const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ bias, T* __restrict__ dx,
    float* __restrict__ part, int64_t rows, int f) {
  const int64_t c64 = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kVec;
  if (c64 >= f) return;
  const int c = static_cast<int>(c64);
  float bg[kVec], bu[kVec], acc_g[kVec], acc_u[kVec];
  load_bias_halves<T, kVec>(bias, f, c, bg, bu);
#pragma unroll
  for (int i = 0; i < kVec; ++i) acc_g[i] = acc_u[i] = 0.f;
  const int64_t step = static_cast<int64_t>(gridDim.y) * blockDim.y;
  for (int64_t r = static_cast<int64_t>(blockIdx.y) * blockDim.y + threadIdx.y; r < rows; r += kUnroll * step) {
    Vec<T, kVec> d[kUnroll], g[kUnroll], u[kUnroll];
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      if (r + k * step < rows) {
        d[k].load(dy + (r + k * step) * f + c);
        load_halves<T, kVec>(x, r + k * step, f, c, g[k], u[k]);
      }
    }
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      if (r + k * step < rows) {
#pragma unroll
        for (int i = 0; i < kVec; ++i) {
          const float gate = g[k].get(i) + bg[i], up = u[k].get(i) + bu[i], grad = d[k].get(i);
          const float s = sigmoid(gate);
          const float dg = grad * up * s * (1.f + gate * (1.f - s)), du = grad * gate * s;
          acc_g[i] += dg;
          acc_u[i] += du;
          g[k].set(i, dg);
          u[k].set(i, du);
        }
        T* dxr = dx + (r + k * step) * 2 * f;
        g[k].store(dxr + c);
        u[k].store(dxr + f + c);
      }
    }
  }
  if (part != nullptr) {
    float* out = part + (static_cast<int64_t>(blockIdx.y) * blockDim.y + threadIdx.y) * 2 * f + c;
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      out[i] = acc_g[i];
      out[f + i] = acc_u[i];
    }
  }
}

template <typename T>
cudaError_t forward_impl(const void* x, const void* bias, void* y, int64_t rows, int f, cudaStream_t stream) {
  constexpr int kVec = 16 / sizeof(T);
  const bool vec = vector_ok<T>(f, {x, bias, y});  // f % kVec == 0 aligns the up half too
  const ColumnPlan plan = column_plan(rows, vec ? f / kVec : f);
  const dim3 grid(plan.gx, plan.gy), block(plan.tx, plan.ty);
  auto kernel = vec ? swiglu_forward_kernel<T, kVec> : swiglu_forward_kernel<T, 1>;
  kernel<<<grid, block, 0, stream>>>(static_cast<const T*>(x), static_cast<const T*>(bias), static_cast<T*>(y), rows,
                                     f);
  return cudaGetLastError();
}

template <typename T>
cudaError_t backward_impl(const void* dy, const void* x, const void* bias, void* dx, void* dbias, float* workspace,
                          int64_t workspace_floats, int64_t rows, int f, cudaStream_t stream) {
  constexpr int kVec = 16 / sizeof(T);
  const bool vec = vector_ok<T>(f, {dy, x, bias, dx});
  const ColumnPlan plan = column_plan(rows, vec ? f / kVec : f);
  if (dbias != nullptr && workspace_floats < plan.slots() * 2 * f) return cudaErrorInvalidValue;
  const dim3 grid(plan.gx, plan.gy), block(plan.tx, plan.ty);
  auto kernel = vec ? swiglu_backward_kernel<T, kVec> : swiglu_backward_kernel<T, 1>;
  kernel<<<grid, block, 0, stream>>>(static_cast<const T*>(dy), static_cast<const T*>(x), static_cast<const T*>(bias),
                                     static_cast<T*>(dx), dbias != nullptr ? workspace : nullptr, rows, f);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess || dbias == nullptr) return err;
  return column_sums(workspace, plan.slots(), 2 * f, 1, dbias, nullptr, dtype_of<T>(), stream);
}

}  // namespace

cudaError_t swiglu_forward(const void* x, const void* bias, void* y, int64_t rows, int f, int dtype,
                           cudaStream_t stream) {
  if (rows < 0 || f <= 0 || f > (1 << 30)) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  MEGATRON_DISPATCH(dtype, T, { return forward_impl<T>(x, bias, y, rows, f, stream); });
  return cudaErrorInvalidValue;
}

cudaError_t swiglu_backward(const void* dy, const void* x, const void* bias, void* dx, void* dbias, float* workspace,
                            int64_t workspace_floats, int64_t rows, int f, int dtype, cudaStream_t stream) {
  if (rows < 0 || f <= 0 || f > (1 << 30) || (dbias != nullptr && bias == nullptr)) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  MEGATRON_DISPATCH(dtype, T, {
    return backward_impl<T>(dy, x, bias, dx, dbias, workspace, workspace_floats, rows, f, stream);
  });
  return cudaErrorInvalidValue;
}

int64_t bias_activation_workspace(int64_t rows, int cols, bool swiglu, int dtype) {
  const int vec = dtype == kFloat32 ? 4 : 8;
  return swiglu ? column_workspace(rows, cols / 2, cols, vec) : column_workspace(rows, cols, cols, vec);
}

}  // namespace megatron_fused
