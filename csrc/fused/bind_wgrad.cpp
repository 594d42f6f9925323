// Gradient-accumulation fusion (megatron/core/tensor_parallel/wgrad_fusion.py): the weight gradient of
// y = x W^T added into the parameter's fp32 main gradient by one cuBLAS GEMM with beta 1,
//   main [out, in] += g^T [out, t] x [t, in],
// fp32 accumulation and output, x and g bf16, fp16 or fp32, on torch's current stream and cuBLAS handle.
// Host code only (compiled by the host compiler, as the other bind_*.cpp): cuBLAS does the work. Every bad
// input raises ValueError, nothing is launched then.
// Returns false, having done nothing, in a build without the cuBLAS headers (the caller uses torch).
//
// Row-major main = g^T x is column-major main^T = x^T g: with x's memory read as the column-major
// [in, t] matrix x^T (no transpose) and g's as [out, t] = g^T (transposed), m = in, n = out, k = t.
#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>

#include <climits>

// ATen's CUDA context needs the cuBLAS / cuSPARSE / cuSOLVER headers; a toolkit without them builds the
// other kernels, and this binding then does nothing (the caller adds through torch). The CPU test build of
// the bindings (tests/csrc_stub.py) has no CUDA at all: the checks only.
#if !defined(MEGATRON_FUSED_CPU_STUB) && __has_include(<cublas_v2.h>) && __has_include(<cublasLt.h>) && \
    __has_include(<cusparse.h>) && __has_include(<cusolverDn.h>)
#define MEGATRON_WGRAD_CUBLAS 1
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <cublas_v2.h>
#endif

#include "bindings.h"
#include "checks.h"

namespace megatron_fused {

namespace {

const char* kName = "megatron_fused_kernels.wgrad_gemm_accumulate";
const char* kOp = "wgrad_gemm_accumulate";  // MF_CHECK prefixes the module

int checked_int(int64_t v, const char* what) {
  MF_CHECK(v >= 0 && v <= INT_MAX, kOp, what, " (", v, ") does not fit cuBLAS's int");
  return static_cast<int>(v);
}

void check_matrix(const at::Tensor& t, const char* name) {
  MF_CHECK(t.defined(), kOp, name, " is undefined");
  MF_CHECK(t.is_cuda(), kOp, name, " must be a CUDA tensor, got ", t.device());
  MF_CHECK(t.dim() == 2, kOp, name, " must be 2-D, got ", t.dim(), "-D ", t.sizes());
  MF_CHECK(t.is_contiguous(), kOp, name, " must be contiguous (row-major), got strides ", t.strides());
  MF_CHECK(t.layout() == at::kStrided, kOp, name, " must be a dense tensor");
}

}  // namespace

bool wgrad_gemm_accumulate(const at::Tensor& x, const at::Tensor& g, const at::Tensor& main, bool accumulate) {
  check_matrix(x, "x");
  check_matrix(g, "g");
  check_matrix(main, "main");
  MF_CHECK(x.device() == g.device() && x.device() == main.device(), kOp, "x, g and main must be on one device");
  MF_CHECK(x.scalar_type() == g.scalar_type(), kOp, "x and g must have one dtype, got ", x.scalar_type(),
              " and ", g.scalar_type());
  const auto dtype = x.scalar_type();
  MF_CHECK(dtype == at::kBFloat16 || dtype == at::kHalf || dtype == at::kFloat, kOp, "x and g must be bfloat16, float16 or float32, got ", dtype);
  MF_CHECK(main.scalar_type() == at::kFloat, kOp, "main must be float32, got ", main.scalar_type());
  MF_CHECK(x.size(0) == g.size(0), kOp, "x ", x.sizes(), " and g ", g.sizes(), " need the same rows");
  MF_CHECK(main.size(0) == g.size(1) && main.size(1) == x.size(1), kOp, "main must be [", g.size(1), ", ",
              x.size(1), "] for g ", g.sizes(), " and x ", x.sizes(), ", got ", main.sizes());
  at::assert_no_internal_overlap(main);
  at::assert_no_overlap(main, x);
  at::assert_no_overlap(main, g);
  const int m = checked_int(x.size(1), "in");
  const int n = checked_int(g.size(1), "out");
  const int k = checked_int(x.size(0), "rows");
  if (m == 0 || n == 0) return true;  // nothing to add or write
  if (k == 0) {  // an empty product: adds nothing, writes zeros
    if (!accumulate) main.zero_();
    return true;
  }
#ifdef MEGATRON_WGRAD_CUBLAS
  const c10::cuda::CUDAGuard guard(main.device());
  const cudaDataType_t ab = dtype == at::kBFloat16 ? CUDA_R_16BF : dtype == at::kHalf ? CUDA_R_16F : CUDA_R_32F;
  // beta 0: cuBLAS does not read main (it may hold anything), the first gradient of a step writes
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  // the current stream's handle: torch binds it to at::cuda::getCurrentCUDAStream() and its workspace
  cublasHandle_t handle = at::cuda::getCurrentCUDABlasHandle();
  const cublasStatus_t status = cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_T, m, n, k, &alpha, x.data_ptr(), ab, m,
                                             g.data_ptr(), ab, n, &beta, main.data_ptr(), CUDA_R_32F, m,
                                             CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  TORCH_CHECK(status == CUBLAS_STATUS_SUCCESS, kName, ": cublasGemmEx failed: ", cublasGetStatusString(status));
  return true;
#else
  return false;  // built without the cuBLAS headers: the caller adds through torch
#endif
}

}  // namespace megatron_fused
