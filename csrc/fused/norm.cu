// LayerNorm / RMSNorm entry points: validate, then pick the fast path (norm_fast.cu) where it
// applies and the general one (norm_general.cu) elsewhere.
#include "common.cuh"
#include "norm_paths.h"

#include <initializer_list>

namespace megatron_fused {
namespace {

int element_bytes(int dtype) { return dtype == kFloat32 ? 4 : 2; }

bool valid_dtypes(int dtype, int wdtype) {
  return (dtype == kFloat32 || dtype == kFloat16 || dtype == kBFloat16) && (wdtype == dtype || wdtype == kFloat32);
}

// The fast path moves 16 bytes per access: every row, weight and bias must start on a 16-byte
// boundary, and a row must fit in its register tile.
bool fast(int cols, int dtype, std::initializer_list<const void*> pointers) {
  const int vec = 16 / element_bytes(dtype);
  if (cols % vec != 0 || cols > kNormFastMaxCols) return false;
  for (const void* p : pointers) {
    if (p != nullptr && !aligned16(p)) return false;
  }
  return true;
}

}  // namespace

cudaError_t norm_forward(const void* x, const void* weight, const void* bias, void* y, float* mean, float* rstd,
                         int64_t rows, int cols, float eps, bool rms, int dtype, int wdtype, cudaStream_t stream) {
  if (rows < 0 || cols <= 0 || !valid_dtypes(dtype, wdtype)) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  if (fast(cols, dtype, {x, weight, bias, y})) {
    return norm_forward_fast(x, weight, bias, y, mean, rstd, rows, cols, eps, rms, dtype, wdtype, stream);
  }
  return norm_forward_general(x, weight, bias, y, mean, rstd, rows, cols, eps, rms, dtype, wdtype, stream);
}

int64_t norm_backward_workspace(const void* dy, const void* x, const void* weight, const void* dx, int64_t rows,
                                int cols, bool rms, int dtype, int wdtype) {
  if (rows <= 0 || cols <= 0 || !valid_dtypes(dtype, wdtype)) return 0;
  if (fast(cols, dtype, {dy, x, weight, dx})) {
    return (rms ? 1 : 2) * norm_fast_plan(rows, cols, true, rms, dtype, wdtype).partial_rows() * cols;
  }
  return 2 * static_cast<int64_t>(norm_general_partials(rows)) * cols;
}

cudaError_t norm_backward(const void* dy, const void* x, const float* mean, const float* rstd, const void* weight,
                          void* dx, void* dweight, void* dbias, float* workspace, int64_t workspace_floats,
                          int64_t rows, int cols, bool rms, int dtype, int wdtype, cudaStream_t stream) {
  if (rows < 0 || cols <= 0 || !valid_dtypes(dtype, wdtype)) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  if (workspace_floats < norm_backward_workspace(dy, x, weight, dx, rows, cols, rms, dtype, wdtype)) {
    return cudaErrorInvalidValue;
  }
  if (fast(cols, dtype, {dy, x, weight, dx})) {
    return norm_backward_fast(dy, x, mean, rstd, weight, dx, dweight, dbias, workspace, rows, cols, rms, dtype, wdtype,
                              stream);
  }
  return norm_backward_general(dy, x, mean, rstd, weight, dx, dweight, dbias, workspace, rows, cols, rms, dtype,
                               wdtype, stream);
}

}  // namespace megatron_fused
