// Scaled softmax entry points: validate, then pick the fast path (softmax_fast.cu) where it
// applies and the general one (softmax_general.cu) elsewhere.
#include "common.cuh"
#include "softmax_paths.h"

namespace megatron_fused {
namespace {

bool fast(int cols, int dtype, const void* a, const void* b, const void* c, const uint8_t* mask) {
  const int vec = dtype == kFloat32 ? 4 : 8;
  // the mask is read in accesses of `vec` bytes: its rows (cols apart) start aligned if it does
  const bool mask_ok = mask == nullptr || (reinterpret_cast<uintptr_t>(mask) % vec) == 0;
  return cols % vec == 0 && cols <= kSoftmaxFastMaxCols && aligned16(a) && aligned16(b) &&
         (c == nullptr || aligned16(c)) && mask_ok;
}

bool valid_dtype(int dtype) { return dtype == kFloat32 || dtype == kFloat16 || dtype == kBFloat16; }

}  // namespace

cudaError_t softmax_forward(const void* x, void* y, const uint8_t* mask, int mask_kind, int64_t rows, int cols,
                            int sq, int heads, int mask_batches, float scale, int dtype, cudaStream_t stream) {
  if (rows < 0 || cols <= 0 || sq <= 0 || heads <= 0 || mask_batches <= 0 || mask_kind < 0 || mask_kind > 2 ||
      !valid_dtype(dtype) || (mask_kind == 1) != (mask != nullptr)) {
    return cudaErrorInvalidValue;
  }
  if (rows == 0) return cudaSuccess;
  if (fast(cols, dtype, x, y, nullptr, mask)) {
    return softmax_forward_fast(x, y, mask, mask_kind, rows, cols, sq, heads, mask_batches, scale, dtype, stream);
  }
  return softmax_forward_general(x, y, mask, mask_kind, rows, cols, sq, heads, mask_batches, scale, dtype, stream);
}

cudaError_t softmax_backward(const void* dy, const void* y, void* dx, int64_t rows, int cols, int causal_sq,
                             float scale, int dtype, cudaStream_t stream) {
  if (rows < 0 || cols <= 0 || causal_sq < 0 || !valid_dtype(dtype)) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  if (fast(cols, dtype, dy, y, dx, nullptr)) {
    return softmax_backward_fast(dy, y, dx, rows, cols, causal_sq, scale, dtype, stream);
  }
  return softmax_backward_general(dy, y, dx, rows, cols, scale, dtype, stream);  // reads the zeros too
}

}  // namespace megatron_fused
