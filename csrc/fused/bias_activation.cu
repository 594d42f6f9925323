// Bias + GeLU and (bias +) SwiGLU, forward and backward: elementwise, fp32 math.
//
// Fusing the bias add into the activation saves one full read and write of the
// [tokens, ffn] tensor each way; the backward recomputes the activation's input from x
// and bias instead of keeping it.
#include <cmath>

#include "common.cuh"

namespace megatron_fused {
namespace {

constexpr int kThreads = 256;
constexpr float kInvSqrt2 = 0.70710678118654752f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;

// exact GeLU (erf), as torch.nn.functional.gelu(approximate="none")
__device__ __forceinline__ float gelu(float v) { return 0.5f * v * (1.f + erff(v * kInvSqrt2)); }
__device__ __forceinline__ float gelu_grad(float v) {
  return 0.5f * (1.f + erff(v * kInvSqrt2)) + v * kInvSqrt2Pi * expf(-0.5f * v * v);
}
__device__ __forceinline__ float sigmoid(float v) { return 1.f / (1.f + expf(-v)); }

template <typename T>
__global__ void bias_gelu_forward_kernel(const T* __restrict__ x, const T* __restrict__ bias, T* __restrict__ y,
                                         int64_t n, int cols) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float v = to_float(x[i]) + (bias != nullptr ? to_float(bias[i % cols]) : 0.f);
    y[i] = from_float<T>(gelu(v));
  }
}

template <typename T>
__global__ void bias_gelu_backward_kernel(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ bias,
                                          T* __restrict__ dx, int64_t n, int cols) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float v = to_float(x[i]) + (bias != nullptr ? to_float(bias[i % cols]) : 0.f);
    dx[i] = from_float<T>(to_float(dy[i]) * gelu_grad(v));
  }
}

// x row r is [gate (f) | up (f)]; y [rows, f]
template <typename T>
__global__ void swiglu_forward_kernel(const T* __restrict__ x, const T* __restrict__ bias, T* __restrict__ y,
                                      int64_t rows, int f) {
  const int64_t n = rows * f;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / f;
    const int c = static_cast<int>(i - r * f);
    const T* xr = x + r * 2 * f;
    float g = to_float(xr[c]), u = to_float(xr[f + c]);
    if (bias != nullptr) {
      g += to_float(bias[c]);
      u += to_float(bias[f + c]);
    }
    y[i] = from_float<T>(g * sigmoid(g) * u);
  }
}

// d gate = dy up sig (1 + gate (1 - sig)),  d up = dy silu(gate)
template <typename T>
__global__ void swiglu_backward_kernel(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ bias,
                                       T* __restrict__ dx, int64_t rows, int f) {
  const int64_t n = rows * f;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / f;
    const int c = static_cast<int>(i - r * f);
    const T* xr = x + r * 2 * f;
    T* dxr = dx + r * 2 * f;
    float g = to_float(xr[c]), u = to_float(xr[f + c]);
    if (bias != nullptr) {
      g += to_float(bias[c]);
      u += to_float(bias[f + c]);
    }
    const float s = sigmoid(g), d = to_float(dy[i]);
    dxr[c] = from_float<T>(d * u * s * (1.f + g * (1.f - s)));
    dxr[f + c] = from_float<T>(d * g * s);
  }
}

}  // namespace

cudaError_t bias_gelu_forward(const void* x, const void* bias, void* y, int64_t n, int cols, int dtype,
                              cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (cols <= 0) return cudaErrorInvalidValue;
  MEGATRON_DISPATCH(dtype, T, {
    bias_gelu_forward_kernel<T><<<elementwise_blocks(n, kThreads), kThreads, 0, stream>>>(
        static_cast<const T*>(x), static_cast<const T*>(bias), static_cast<T*>(y), n, cols);
  });
  return cudaGetLastError();
}

cudaError_t bias_gelu_backward(const void* dy, const void* x, const void* bias, void* dx, int64_t n, int cols,
                               int dtype, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (cols <= 0) return cudaErrorInvalidValue;
  MEGATRON_DISPATCH(dtype, T, {
    bias_gelu_backward_kernel<T><<<elementwise_blocks(n, kThreads), kThreads, 0, stream>>>(
        static_cast<const T*>(dy), static_cast<const T*>(x), static_cast<const T*>(bias), static_cast<T*>(dx), n, cols);
  });
  return cudaGetLastError();
}

cudaError_t swiglu_forward(const void* x, const void* bias, void* y, int64_t rows, int f, int dtype,
                           cudaStream_t stream) {
  if (rows == 0 || f == 0) return cudaSuccess;
  MEGATRON_DISPATCH(dtype, T, {
    swiglu_forward_kernel<T><<<elementwise_blocks(rows * f, kThreads), kThreads, 0, stream>>>(
        static_cast<const T*>(x), static_cast<const T*>(bias), static_cast<T*>(y), rows, f);
  });
  return cudaGetLastError();
}

cudaError_t swiglu_backward(const void* dy, const void* x, const void* bias, void* dx, int64_t rows, int f, int dtype,
                            cudaStream_t stream) {
  if (rows == 0 || f == 0) return cudaSuccess;
  MEGATRON_DISPATCH(dtype, T, {
    swiglu_backward_kernel<T><<<elementwise_blocks(rows * f, kThreads), kThreads, 0, stream>>>(
        static_cast<const T*>(dy), static_cast<const T*>(x), static_cast<const T*>(bias), static_cast<T*>(dx), rows, f);
  });
  return cudaGetLastError();
}

}  // namespace megatron_fused
