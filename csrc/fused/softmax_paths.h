// The two softmax paths behind softmax_forward / softmax_backward (softmax.cu picks one): the
// fast one (softmax_fast.cu: a row in registers, 16-byte accesses, one read of x) and the
// general one (softmax_general.cu: scalar, any row length and alignment). Arguments as in
// fused_kernels.h; rows > 0 and cols > 0 (the launcher checked).
#pragma once
#include <cstdint>

#include <cuda_runtime.h>

namespace megatron_fused {

// Elements of a row each thread of the fast path holds; rows up to 1024 x this take it.
constexpr int kSoftmaxFastElems = 16;
constexpr int kSoftmaxFastMaxCols = kSoftmaxFastElems * 1024;

cudaError_t softmax_forward_fast(const void* x, void* y, const uint8_t* mask, int mask_kind, int64_t rows, int cols,
                                 int sq, int heads, int mask_batches, float scale, int dtype, cudaStream_t stream);
cudaError_t softmax_backward_fast(const void* dy, const void* y, void* dx, int64_t rows, int cols, int causal_sq,
                                  float scale, int dtype, cudaStream_t stream);

cudaError_t softmax_forward_general(const void* x, void* y, const uint8_t* mask, int mask_kind, int64_t rows,
                                    int cols, int sq, int heads, int mask_batches, float scale, int dtype,
                                    cudaStream_t stream);
cudaError_t softmax_backward_general(const void* dy, const void* y, void* dx, int64_t rows, int cols, float scale,
                                     int dtype, cudaStream_t stream);

}  // namespace megatron_fused
