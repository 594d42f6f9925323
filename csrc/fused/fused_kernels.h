// Host API of the fused kernels: plain pointers, sizes and a stream, no torch headers.
//
// Why no torch here: the .cu files then compile in seconds with nvcc alone (torch's headers
// cost a minute per translation unit), and they do not need the CUDA-build-only headers that
// CPU wheels of torch lack. The binding files (*.cpp) are the ones that talk to torch.
//
// Every launcher returns the launch's cudaError_t. dtype codes: see DType. Math is fp32
// whatever the storage type; norms keep fp32 statistics.
#pragma once
#include <cstdint>
#ifdef MEGATRON_FUSED_CPU_STUB
#include "cpu_stub/cuda_runtime_stub.h"  // the bindings' CPU test build: no CUDA toolkit needed
#else
#include <cuda_runtime.h>
#endif

namespace megatron_fused {

enum DType : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

// Launchers check their sizes and dtype codes again (cudaErrorInvalidValue, nothing launched)
// but trust pointers: the bindings validate every tensor before calling them. Each picks a
// 16-byte vector path where every pointer is 16-byte aligned and the row length a multiple of
// the vector width, and a scalar path elsewhere.

// ---- softmax (softmax.cu, softmax_fast.cu, softmax_general.cu) ---------------------------
// y = softmax(scale * x) over the last dim of `rows` rows of `cols`. Masked entries get
// probability 0; a row with every entry masked gives all zeros (not NaN, not uniform).
//   mask_kind 0: no mask.
//   mask_kind 1 (padding): mask is uint8 [mask_batches, sq, cols] (nonzero = masked out);
//     x is [b, heads, sq, cols] flattened, and row r uses mask row
//     ((mask_batches == 1 ? 0 : r / (heads * sq)) * sq + r % sq).
//   mask_kind 2 (causal, upper triangle masked): column c of query row q = r % sq is
//     masked when c > q (top-left aligned, like torch SDPA's is_causal).
cudaError_t softmax_forward(const void* x, void* y, const uint8_t* mask, int mask_kind, int64_t rows,
                            int cols, int sq, int heads, int mask_batches, float scale, int dtype,
                            cudaStream_t stream);
// dx = scale * y * (dy - sum(dy * y)) per row; masked entries have y = 0, so dx = 0.
// causal_sq > 0: y is a causal softmax of query length causal_sq, whose entries past the
// diagonal are known zeros: they are not read (dx there is 0).
cudaError_t softmax_backward(const void* dy, const void* y, void* dx, int64_t rows, int cols,
                             int causal_sq, float scale, int dtype, cudaStream_t stream);

// ---- LayerNorm / RMSNorm (norm.cu, norm_fast.cu, norm_general.cu) ------------------------
// x [rows, cols] of `dtype`; weight/bias [cols] of `wdtype` (the same as dtype, or fp32).
// LayerNorm: y = (x - mean) * rstd * w + b;  RMSNorm (rms=true): y = x * rstd * w, no bias.
// mean (LayerNorm only) and rstd are fp32 [rows], kept for the backward.
cudaError_t norm_forward(const void* x, const void* weight, const void* bias, void* y, float* mean,
                         float* rstd, int64_t rows, int cols, float eps, bool rms, int dtype,
                         int wdtype, cudaStream_t stream);
// Floats of fp32 workspace norm_backward needs for these pointers and sizes (0 for rows == 0).
int64_t norm_backward_workspace(const void* dy, const void* x, const void* weight, const void* dx,
                                int64_t rows, int cols, bool rms, int dtype, int wdtype);
// dx [rows, cols] (dtype); dweight, dbias [cols] (wdtype; dbias ignored when rms). rows == 0
// launches nothing (the caller zeroes dweight / dbias).
cudaError_t norm_backward(const void* dy, const void* x, const float* mean, const float* rstd,
                          const void* weight, void* dx, void* dweight, void* dbias, float* workspace,
                          int64_t workspace_floats, int64_t rows, int cols, bool rms, int dtype,
                          int wdtype, cudaStream_t stream);

// ---- bias + activation (bias_gelu.cu, swiglu.cu) -----------------------------------------
// x [rows, cols], bias [cols] or nullptr (same dtype). GeLU is the exact (erf) form, as
// torch.nn.functional.gelu's default. The backward also writes dbias (x's dtype; the fp32
// sum of the unrounded dx over rows) when dbias is given, which needs bias and
// bias_activation_workspace() floats of workspace.
cudaError_t bias_gelu_forward(const void* x, const void* bias, void* y, int64_t rows, int cols, int dtype,
                              cudaStream_t stream);
cudaError_t bias_gelu_backward(const void* dy, const void* x, const void* bias, void* dx, void* dbias,
                               float* workspace, int64_t workspace_floats, int64_t rows, int cols,
                               int dtype, cudaStream_t stream);
// SwiGLU: x [rows, 2 f] = [gate | up], bias [2 f] or nullptr; y [rows, f] = silu(gate) * up.
cudaError_t swiglu_forward(const void* x, const void* bias, void* y, int64_t rows, int f, int dtype,
                           cudaStream_t stream);
cudaError_t swiglu_backward(const void* dy, const void* x, const void* bias, void* dx, void* dbias,
                            float* workspace, int64_t workspace_floats, int64_t rows, int f, int dtype,
                            cudaStream_t stream);
// Floats of workspace for the bias gradient of x [rows, cols] (cols = 2 f for SwiGLU).
int64_t bias_activation_workspace(int64_t rows, int cols, bool swiglu, int dtype);

// ---- rotary embedding (rope.cu) -------------------------------------------------------
// x [s, b, h, dim] with element strides (stride_s, stride_b, stride_h, 1); cos/sin
// [s, dim] contiguous, of x's dtype; y [s, b, h, dim] contiguous. Rotate-half convention:
// y = x * cos + rotate_half(x) * sin. backward=true applies the transpose (the gradient of
// that map), which is not the same as negating sin when the two halves of cos/sin differ.
cudaError_t rope_apply(const void* x, int64_t stride_s, int64_t stride_b, int64_t stride_h,
                       const void* cos, const void* sin, void* y, int64_t s, int64_t b, int64_t h,
                       int dim, bool backward, int dtype, cudaStream_t stream);

// ---- precision-aware AdamW (adamw.cu) ----------------------------------------------------
// One multi-tensor AdamW step over n flat tensors of one param group (the optimizer pieces of a DDP bucket):
// per element, in fp32 with every operation rounded on its own (no FMA contraction), the order of
// megatron/core/optimizer/adamw_step.reference_step:
//   g = grad / *divisor (divisor nullptr: no clipping); m = beta1 m + one_minus_beta1 g;
//   v = beta2 v + (g g) one_minus_beta2; p = main decay; p = p - (m step_size) / (sqrt(v) inv_bc2_sqrt + eps)
// then m, v, main stored in their dtypes and p, rounded once, into param (param == main: stored once).
// Each list has one dtype: main fp32 / fp16, grad fp32 / bf16 / fp16, m and v fp32 / fp16 / bf16, param any.
struct AdamWDTypes {
  int main, grad, exp_avg, exp_avg_sq, param;
};
struct AdamWScalars {
  float beta1, one_minus_beta1, beta2, one_minus_beta2, eps, step_size, inv_bc2_sqrt, decay;
};
cudaError_t adamw_step(int n, void* const* main, const void* const* grad, void* const* exp_avg,
                       void* const* exp_avg_sq, void* const* param, const int64_t* numel, const float* divisor,
                       AdamWDTypes dtypes, AdamWScalars scalars, cudaStream_t stream);

}  // namespace megatron_fused
