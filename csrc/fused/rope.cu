// Rotary position embedding, rotate-half convention (Megatron-LM, HF Llama):
//   y_j = x_j cos_j + r_j sin_j,  r_j = -x_{j+d/2} (j < d/2),  x_{j-d/2} (j >= d/2).
// The backward is that linear map's transpose:
//   dx_j = g_j cos_j + (j < d/2 ? g_{j+d/2} sin_{j+d/2} : -g_{j-d/2} sin_{j-d/2}).
// One elementwise kernel does both: it reads x (or g) at j and at its partner index.
#include "common.cuh"

namespace megatron_fused {
namespace {

constexpr int kThreads = 256;

template <typename T>
__global__ void rope_kernel(const T* __restrict__ x, const T* __restrict__ cosv, const T* __restrict__ sinv,
                            T* __restrict__ y, int64_t n, int64_t inner, int dim, bool backward) {
  const int half = dim / 2;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int j = static_cast<int>(i % dim);
    const int64_t f = (i / (inner * dim)) * dim;  // position's row of cos / sin
    const bool low = j < half;
    const int p = low ? j + half : j - half;
    const float xj = to_float(x[i]), xp = to_float(x[i - j + p]);
    const float sign = low ? -1.f : 1.f;
    const float out = backward ? xj * to_float(cosv[f + j]) - sign * xp * to_float(sinv[f + p])
                               : xj * to_float(cosv[f + j]) + sign * xp * to_float(sinv[f + j]);
    y[i] = from_float<T>(out);
  }
}

}  // namespace

cudaError_t rope_apply(const void* x, const void* cos, const void* sin, void* y, int64_t s, int64_t inner, int dim,
                       bool backward, int dtype, cudaStream_t stream) {
  const int64_t n = s * inner * dim;
  if (n == 0) return cudaSuccess;
  if (dim % 2) return cudaErrorInvalidValue;
  MEGATRON_DISPATCH(dtype, T, {
    rope_kernel<T><<<elementwise_blocks(n, kThreads), kThreads, 0, stream>>>(
        static_cast<const T*>(x), static_cast<const T*>(cos), static_cast<const T*>(sin), static_cast<T*>(y), n, inner,
        dim, backward);
  });
  return cudaGetLastError();
}

}  // namespace megatron_fused
