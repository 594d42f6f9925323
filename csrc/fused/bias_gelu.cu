// Bias + GeLU (exact, erf: torch.nn.functional.gelu's default), forward and backward.
//
// Fusing the bias add into the activation saves a read and a write of the [tokens, ffn]
// tensor each way; the backward recomputes the activation's input from x and bias instead of
// keeping it, and sums the bias gradient in the same pass (columns.cuh). Bytes that move:
// forward x + y, backward dy + x + dx; the bias and the partial sums are small.
#include "columns.cuh"

namespace megatron_fused {
namespace {

constexpr float kInvSqrt2 = 0.70710678118654752f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;
constexpr int kUnroll = 4;  // rows in flight per thread

__device__ __forceinline__ float gelu(float v) { return 0.5f * v * (1.f + erff(v * kInvSqrt2)); }
__device__ __forceinline__ float gelu_grad(float v) {
  return 0.5f * (1.f + erff(v * kInvSqrt2)) + v * kInvSqrt2Pi * __expf(-0.5f * v * v);
}

template <typename T, int kVec>
__global__ void __launch_bounds__(kColumnThreads) bias_gelu_forward_kernel(const T* __restrict__ x,
                                                                           const T* __restrict__ bias,
                                                                           T* __restrict__ y, int64_t rows,
                                                                           int cols) {
  const int64_t c64 = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kVec;
  if (c64 >= cols) return;
  const int c = static_cast<int>(c64);
  float b[kVec];
#pragma unroll
  for (int i = 0; i < kVec; ++i) b[i] = 0.f;
  if (bias != nullptr) load_floats<T, kVec>(bias + c, b);
  const int64_t step = static_cast<int64_t>(gridDim.y) * blockDim.y;
  int64_t r = static_cast<int64_t>(blockIdx.y) * blockDim.y + threadIdx.y;
  for (; r + (kUnroll - 1) * step < rows; r += kUnroll * step) {
    Vec<T, kVec> v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u].load(x + (r + u * step) * cols + c);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
      for (int i = 0; i < kVec; ++i) v[u].set(i, gelu(v[u].get(i) + b[i]));
      v[u].store(y + (r + u * step) * cols + c);
    }
  }
  for (; r < rows; r += step) {
    Vec<T, kVec> v;
    v.load(x + r * cols + c);
#pragma unroll
    for (int i = 0; i < kVec; ++i) v.set(i, gelu(v.get(i) + b[i]));
    v.store(y + r * cols + c);
  }
}

// dx = dy gelu'(x + b); part[slot][c] = sum over this slot's rows of dx (fp32, unrounded)
template <typename T, int kVec>
__global__ void __launch_bounds__(kColumnThreads) bias_gelu_backward_kernel(
    const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ bias, T* __restrict__ dx,
    float* __restrict__ part, int64_t rows, int cols) {
  const int64_t c64 = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kVec;
  if (c64 >= cols) return;
  const int c = static_cast<int>(c64);
  float b[kVec], acc[kVec];
#pragma unroll
  for (int i = 0; i < kVec; ++i) b[i] = acc[i] = 0.f;
  if (bias != nullptr) load_floats<T, kVec>(bias + c, b);
  const int64_t step = static_cast<int64_t>(gridDim.y) * blockDim.y;
  int64_t r = static_cast<int64_t>(blockIdx.y) * blockDim.y + threadIdx.y;
  constexpr int kU = kUnroll / 2;  // two loads per row
  for (; r + (kU - 1) * step < rows; r += kU * step) {
    Vec<T, kVec> g[kU], v[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      g[u].load(dy + (r + u * step) * cols + c);
      v[u].load(x + (r + u * step) * cols + c);
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        const float d = g[u].get(i) * gelu_grad(v[u].get(i) + b[i]);
        acc[i] += d;
        g[u].set(i, d);
      }
      g[u].store(dx + (r + u * step) * cols + c);
    }
  }
  for (; r < rows; r += step) {
    Vec<T, kVec> g, v;
    g.load(dy + r * cols + c);
    v.load(x + r * cols + c);
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      const float d = g.get(i) * gelu_grad(v.get(i) + b[i]);
      acc[i] += d;
      g.set(i, d);
    }
    g.store(dx + r * cols + c);
  }
  if (part != nullptr) {
    float* out = part + (static_cast<int64_t>(blockIdx.y) * blockDim.y + threadIdx.y) * cols + c;
#pragma unroll
    for (int i = 0; i < kVec; ++i) out[i] = acc[i];
  }
}

template <typename T>
cudaError_t forward_impl(const void* x, const void* bias, void* y, int64_t rows, int cols, cudaStream_t stream) {
  constexpr int kVec = 16 / sizeof(T);
  const bool vec = vector_ok<T>(cols, {x, bias, y});
  const ColumnPlan plan = column_plan(rows, vec ? cols / kVec : cols);
  const dim3 grid(plan.gx, plan.gy), block(plan.tx, plan.ty);
  auto kernel = vec ? bias_gelu_forward_kernel<T, kVec> : bias_gelu_forward_kernel<T, 1>;
  kernel<<<grid, block, 0, stream>>>(static_cast<const T*>(x), static_cast<const T*>(bias), static_cast<T*>(y), rows,
                                     cols);
  return cudaGetLastError();
}

template <typename T>
cudaError_t backward_impl(const void* dy, const void* x, const void* bias, void* dx, void* dbias, float* workspace,
                          int64_t workspace_floats, int64_t rows, int cols, cudaStream_t stream) {
  constexpr int kVec = 16 / sizeof(T);
  const bool vec = vector_ok<T>(cols, {dy, x, bias, dx});
  const ColumnPlan plan = column_plan(rows, vec ? cols / kVec : cols);
  if (dbias != nullptr && workspace_floats < plan.slots() * cols) return cudaErrorInvalidValue;
  const dim3 grid(plan.gx, plan.gy), block(plan.tx, plan.ty);
  auto kernel = vec ? bias_gelu_backward_kernel<T, kVec> : bias_gelu_backward_kernel<T, 1>;
  kernel<<<grid, block, 0, stream>>>(static_cast<const T*>(dy), static_cast<const T*>(x), static_cast<const T*>(bias),
                                     static_cast<T*>(dx), dbias != nullptr ? workspace : nullptr, rows, cols);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess || dbias == nullptr) return err;
  return column_sums(workspace, plan.slots(), cols, 1, dbias, nullptr, dtype_of<T>(), stream);
}

}  // namespace

cudaError_t bias_gelu_forward(const void* x, const void* bias, void* y, int64_t rows, int cols, int dtype,
                              cudaStream_t stream) {
  if (rows < 0 || cols <= 0) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  MEGATRON_DISPATCH(dtype, T, { return forward_impl<T>(x, bias, y, rows, cols, stream); });
  return cudaErrorInvalidValue;
}

cudaError_t bias_gelu_backward(const void* dy, const void* x, const void* bias, void* dx, void* dbias,
                               float* workspace, int64_t workspace_floats, int64_t rows, int cols, int dtype,
                               cudaStream_t stream) {
  if (rows < 0 || cols <= 0 || (dbias != nullptr && bias == nullptr)) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  MEGATRON_DISPATCH(dtype, T, {
    return backward_impl<T>(dy, x, bias, dx, dbias, workspace, workspace_floats, rows, cols, stream);
  });
  return cudaErrorInvalidValue;
}

}  // namespace megatron_fused
