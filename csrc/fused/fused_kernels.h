// Host API of the fused kernels: plain pointers, sizes and a stream, no torch headers.
//
// Why no torch here: the .cu files then compile in seconds with nvcc alone (torch's headers
// cost a minute per translation unit), and they do not need the CUDA-build-only headers that
// CPU wheels of torch lack. bindings.cpp is the one file that talks to torch.
//
// Every launcher returns the launch's cudaError_t. dtype codes: see DType. Math is fp32
// whatever the storage type; norms keep fp32 statistics.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

namespace at {
class Tensor;
}

namespace megatron_fused {

enum DType : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

// ---- softmax (softmax.cu) -------------------------------------------------------------
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
cudaError_t softmax_backward(const void* dy, const void* y, void* dx, int64_t rows, int cols,
                             float scale, int dtype, cudaStream_t stream);

// ---- LayerNorm / RMSNorm (layer_norm.cu) -----------------------------------------------
// x [rows, cols] of `dtype`; weight/bias [cols] of `wdtype` (the same as dtype, or fp32).
// LayerNorm: y = (x - mean) * rstd * w + b;  RMSNorm (rms=true): y = x * rstd * w, no bias.
// mean (LayerNorm only) and rstd are fp32 [rows], kept for the backward.
cudaError_t norm_forward(const void* x, const void* weight, const void* bias, void* y, float* mean,
                         float* rstd, int64_t rows, int cols, float eps, bool rms, int dtype,
                         int wdtype, cudaStream_t stream);
// Floats of workspace norm_backward needs: 2 x norm_partials(rows) x cols.
int norm_partials(int64_t rows);
// dx [rows, cols] (dtype); dweight, dbias [cols] (wdtype; dbias ignored when rms).
cudaError_t norm_backward(const void* dy, const void* x, const float* mean, const float* rstd,
                          const void* weight, void* dx, void* dweight, void* dbias, float* workspace,
                          int64_t rows, int cols, bool rms, int dtype, int wdtype, cudaStream_t stream);

// ---- bias + activation (bias_activation.cu) ---------------------------------------------
// x [n / cols, cols], bias [cols] or nullptr (same dtype). GeLU is the exact (erf) form,
// as torch.nn.functional.gelu's default.
cudaError_t bias_gelu_forward(const void* x, const void* bias, void* y, int64_t n, int cols, int dtype,
                              cudaStream_t stream);
cudaError_t bias_gelu_backward(const void* dy, const void* x, const void* bias, void* dx, int64_t n,
                               int cols, int dtype, cudaStream_t stream);
// SwiGLU: x [rows, 2 f] = [gate | up], bias [2 f] or nullptr; y [rows, f] = silu(gate) * up.
cudaError_t swiglu_forward(const void* x, const void* bias, void* y, int64_t rows, int f, int dtype,
                           cudaStream_t stream);
cudaError_t swiglu_backward(const void* dy, const void* x, const void* bias, void* dx, int64_t rows,
                            int f, int dtype, cudaStream_t stream);

// ---- rotary embedding (rope.cu) -------------------------------------------------------
// x [s, inner, dim] (inner = batch x heads), cos/sin [s, dim] of the same dtype, rotate-half
// convention: y = x * cos + rotate_half(x) * sin. backward=true applies the transpose
// (the gradient of that map), which is not the same as negating sin when the two halves
// of cos/sin differ.
cudaError_t rope_apply(const void* x, const void* cos, const void* sin, void* y, int64_t s,
                       int64_t inner, int dim, bool backward, int dtype, cudaStream_t stream);

// ---- weight-gradient accumulation (wgrad_gemm.cu; takes torch tensors: bindings.cpp only) -------
// main [out, in] (fp32) += g^T x for g [t, out] and x [t, in] (bf16, fp16 or fp32, one dtype), all
// contiguous on one CUDA device; cuBLAS on torch's current stream and handle. Raises on bad input;
// false (nothing done) in a build without the cuBLAS headers.
bool wgrad_gemm_accumulate(const at::Tensor& x, const at::Tensor& g, const at::Tensor& main);

}  // namespace megatron_fused
