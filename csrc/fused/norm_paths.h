// The two LayerNorm / RMSNorm paths behind norm_forward / norm_backward (norm.cu picks one):
// the fast one (norm_fast.cu: a row in registers, 16-byte accesses, one pass each way) and the
// general one (norm_general.cu: scalar, any row length and alignment). Arguments as in
// fused_kernels.h; rows > 0, cols > 0, dtype and wdtype valid (the launcher checked).
#pragma once
#include <cstdint>

#include <cuda_runtime.h>

#include "fused_kernels.h"

namespace megatron_fused {

// The weight type is the input's or fp32 (fp32 master-style norm weights under bf16 activations).
#define NORM_DISPATCH(dtype, wdtype, FN, ...)                 \
  MEGATRON_DISPATCH(dtype, T, {                               \
    if (wdtype == dtype) return FN<T, T>(__VA_ARGS__);        \
    if (wdtype == kFloat32) return FN<T, float>(__VA_ARGS__); \
    return cudaErrorInvalidValue;                             \
  })

// Elements of a row each thread of the fast path holds; rows up to kNormFastElems x 1024 take it.
constexpr int kNormFastElems = 8;
constexpr int kNormFastMaxCols = kNormFastElems * 1024;

struct NormFastPlan {
  int threads_per_row, rows_per_block, blocks;
  int64_t partial_rows() const { return static_cast<int64_t>(blocks) * rows_per_block; }
};
NormFastPlan norm_fast_plan(int64_t rows, int cols, bool backward, bool rms, int dtype, int wdtype);

cudaError_t norm_forward_fast(const void* x, const void* weight, const void* bias, void* y, float* mean, float* rstd,
                              int64_t rows, int cols, float eps, bool rms, int dtype, int wdtype, cudaStream_t stream);
// workspace: (rms ? 1 : 2) x plan.partial_rows() x cols floats
cudaError_t norm_backward_fast(const void* dy, const void* x, const float* mean, const float* rstd,
                               const void* weight, void* dx, void* dweight, void* dbias, float* workspace,
                               int64_t rows, int cols, bool rms, int dtype, int wdtype, cudaStream_t stream);

int norm_general_partials(int64_t rows);
cudaError_t norm_forward_general(const void* x, const void* weight, const void* bias, void* y, float* mean,
                                 float* rstd, int64_t rows, int cols, float eps, bool rms, int dtype, int wdtype,
                                 cudaStream_t stream);
// workspace: 2 x norm_general_partials(rows) x cols floats
cudaError_t norm_backward_general(const void* dy, const void* x, const float* mean, const float* rstd,
                                  const void* weight, void* dx, void* dweight, void* dbias, float* workspace,
                                  int64_t rows, int cols, bool rms, int dtype, int wdtype, cudaStream_t stream);

}  // namespace megatron_fused
