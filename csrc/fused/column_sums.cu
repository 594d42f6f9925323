// The second, small kernel of every gradient that sums over rows (norm weight and bias
// gradients, activation bias gradients): the main kernel leaves one fp32 partial sum per
// column for each of its row slots, and this adds the slots up in a fixed order (the result
// is deterministic, unlike atomics). The partials are a few MB at most and were just written:
// they are read from L2.
#include "common.cuh"

namespace megatron_fused {
namespace {

constexpr int kTile = 32;  // 32 columns x 32 slot lanes per block

template <typename W>
__global__ void __launch_bounds__(kTile * kTile) column_sums_kernel(const float* __restrict__ part, int64_t parts,
                                                                    int cols, W* __restrict__ out0,
                                                                    W* __restrict__ out1) {
  __shared__ float tile[kTile][kTile + 1];
  const int c = blockIdx.x * kTile + threadIdx.x;
  const float* p = part + static_cast<int64_t>(blockIdx.y) * parts * cols;
  float s = 0.f;
  if (c < cols) {
    for (int64_t r = threadIdx.y; r < parts; r += kTile) s += p[r * cols + c];
  }
  tile[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    float t = 0.f;
#pragma unroll
    for (int i = 0; i < kTile; ++i) t += tile[i][threadIdx.x];
    (blockIdx.y == 0 ? out0 : out1)[c] = from_float<W>(t);
  }
}

}  // namespace

cudaError_t column_sums(const float* part, int64_t parts, int cols, int arrays, void* out0, void* out1,
                        int out_dtype, cudaStream_t stream) {
  if (cols <= 0 || parts <= 0 || arrays < 1 || arrays > 2 || (arrays == 2 && out1 == nullptr)) {
    return cudaErrorInvalidValue;
  }
  const dim3 grid(static_cast<unsigned>(ceil_div(cols, kTile)), arrays), block(kTile, kTile);
  MEGATRON_DISPATCH(out_dtype, W, {
    column_sums_kernel<W><<<grid, block, 0, stream>>>(part, parts, cols, static_cast<W*>(out0), static_cast<W*>(out1));
  });
  return cudaGetLastError();
}

}  // namespace megatron_fused
