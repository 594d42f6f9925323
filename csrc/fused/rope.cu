// Rotary position embedding, rotate-half convention (Megatron-LM, HF Llama), on x [s, b, h, d]
// with any strides but a contiguous last dim (q / k sliced from the fused QKV output are read
// where they lie: no copy first), into a contiguous y:
//   y_lo = x_lo cos_lo - x_hi sin_lo,   y_hi = x_hi cos_hi + x_lo sin_hi        (x = [x_lo | x_hi])
// The backward is that linear map's transpose (exact even when the two halves of cos / sin
// differ):
//   dx_lo = g_lo cos_lo + g_hi sin_hi,  dx_hi = g_hi cos_hi - g_lo sin_lo
// A thread owns one 16-byte vector of the low half and its partner in the high half (one
// element each on the scalar path), for one head row at a time. Bytes that move: x + y; cos and
// sin ([s, d]) are read once per head row from cache.
#include "common.cuh"

namespace megatron_fused {
namespace {

constexpr int kThreads = 256;

template <typename T, int kVec>
__global__ void __launch_bounds__(kThreads) rope_kernel(const T* __restrict__ x, int64_t stride_s, int64_t stride_b,
                                                        int64_t stride_h, const T* __restrict__ cosv,
                                                        const T* __restrict__ sinv, T* __restrict__ y, int64_t rows,
                                                        int64_t b, int64_t h, int dim, bool backward) {
  const int half = dim / 2;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.y;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y; row < rows; row += step) {
    const int64_t head = row % h, t = row / h;
    const int64_t bi = t % b, si = t / b;
    const T* xr = x + si * stride_s + bi * stride_b + head * stride_h;
    const T* cr = cosv + si * dim;
    const T* sr = sinv + si * dim;
    T* yr = y + row * dim;
    for (int j = threadIdx.x * kVec; j < half; j += blockDim.x * kVec) {
      Vec<T, kVec> lo, hi, c_lo, c_hi, s_lo, s_hi;
      lo.load(xr + j);
      hi.load(xr + half + j);
      c_lo.load(cr + j);
      c_hi.load(cr + half + j);
      s_lo.load(sr + j);
      s_hi.load(sr + half + j);
      Vec<T, kVec> out_lo, out_hi;
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        const float a = lo.get(i), z = hi.get(i);
        if (backward) {
          out_lo.set(i, a * c_lo.get(i) + z * s_hi.get(i));
          out_hi.set(i, z * c_hi.get(i) - a * s_lo.get(i));
        } else {
          out_lo.set(i, a * c_lo.get(i) - z * s_lo.get(i));
          out_hi.set(i, z * c_hi.get(i) + a * s_hi.get(i));
        }
      }
      out_lo.store(yr + j);
      out_hi.store(yr + half + j);
    }
  }
}

template <typename T>
cudaError_t launch(const void* x, int64_t stride_s, int64_t stride_b, int64_t stride_h, const void* cos,
                   const void* sin, void* y, int64_t s, int64_t b, int64_t h, int dim, bool backward,
                   cudaStream_t stream) {
  constexpr int kVec = 16 / sizeof(T);
  const int half = dim / 2;
  const bool vec = half % kVec == 0 && stride_s % kVec == 0 && stride_b % kVec == 0 && stride_h % kVec == 0 &&
                   aligned16(x) && aligned16(cos) && aligned16(sin) && aligned16(y);
  const int per_row = vec ? half / kVec : half;
  const int tx = per_row < kThreads ? per_row : kThreads;
  const int ty = kThreads / tx;
  const int64_t rows = s * b * h;
  const int64_t wanted = ceil_div(rows, ty), cap = static_cast<int64_t>(sm_count()) * (2048 / kThreads);
  const dim3 grid(static_cast<unsigned>(wanted < cap ? wanted : cap)), block(tx, ty);
  auto kernel = vec ? rope_kernel<T, kVec> : rope_kernel<T, 1>;
  kernel<<<grid, block, 0, stream>>>(static_cast<const T*>(x), stride_s, stride_b, stride_h, static_cast<const T*>(cos),
                                     static_cast<const T*>(sin), static_cast<T*>(y), rows, b, h, dim, backward);
  return cudaGetLastError();
}

}  // namespace

cudaError_t rope_apply(const void* x, int64_t stride_s, int64_t stride_b, int64_t stride_h, const void* cos,
                       const void* sin, void* y, int64_t s, int64_t b, int64_t h, int dim, bool backward, int dtype,
                       cudaStream_t stream) {
  if (s < 0 || b < 0 || h < 0 || dim <= 0 || dim % 2 != 0) return cudaErrorInvalidValue;
  if (s == 0 || b == 0 || h == 0) return cudaSuccess;
  MEGATRON_DISPATCH(dtype, T, {
    return launch<T>(x, stride_s, stride_b, stride_h, cos, sin, y, s, b, h, dim, backward, stream);
  });
  return cudaErrorInvalidValue;
}

}  // namespace megatron_fused
