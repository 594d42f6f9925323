// Precision-aware AdamW, multi-tensor: one launch per group of up to kTensors pieces (apex's
// multi_tensor_apply pattern: the pointers travel in the kernel's arguments, each block takes one
// kChunk-element chunk of one tensor). One pass per element: read the main gradient (fp32 or bf16),
// the main value and both moments in their dtypes; write the moments, the main value and the model's
// parameter. Every float operation is the correctly rounded one on its own (__fmul_rn, __fadd_rn,
// __fdiv_rn, __fsqrt_rn: nvcc would contract a * b + c into an FMA), so a step gives the bits of the
// Python reference, whose torch element-wise ops round each operation too.
#include "common.cuh"

namespace megatron_fused {
namespace {

constexpr int kThreads = 256;
constexpr int kTensors = 36;            // pointers of 36 tensors + sizes + block offsets: ~2.2 KB of arguments
constexpr int64_t kChunk = 4 * 4096;   // elements per block

struct Lists {
  void* main[kTensors];
  const void* grad[kTensors];
  void* m[kTensors];
  void* v[kTensors];
  void* param[kTensors];
  int64_t numel[kTensors];
  int first_block[kTensors + 1];  // block b works on the tensor k with first_block[k] <= b < first_block[k + 1]
  int count;
};

__device__ __forceinline__ float load(const void* p, int dtype, int64_t i) {
  if (dtype == kFloat32) return static_cast<const float*>(p)[i];
  if (dtype == kFloat16) return __half2float(static_cast<const __half*>(p)[i]);
  return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
}

__device__ __forceinline__ void store(void* p, int dtype, int64_t i, float x) {
  if (dtype == kFloat32) {
    static_cast<float*>(p)[i] = x;
  } else if (dtype == kFloat16) {
    static_cast<__half*>(p)[i] = __float2half_rn(x);
  } else {
    static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(x);
  }
}

__global__ void __launch_bounds__(kThreads) adamw_kernel(Lists t, const float* __restrict__ divisor, AdamWDTypes d,
                                                         AdamWScalars s) {
  int k = 0;
  while (k + 1 < t.count && static_cast<int>(blockIdx.x) >= t.first_block[k + 1]) ++k;
  const int64_t lo = static_cast<int64_t>(blockIdx.x - t.first_block[k]) * kChunk;
  const int64_t hi = lo + kChunk < t.numel[k] ? lo + kChunk : t.numel[k];
  const float div = divisor != nullptr ? *divisor : 1.0f;
  const bool own_param = t.param[k] != t.main[k];
  for (int64_t i = lo + threadIdx.x; i < hi; i += kThreads) {
    float g = load(t.grad[k], d.grad, i);
    if (divisor != nullptr) g = __fdiv_rn(g, div);
    const float m = __fadd_rn(__fmul_rn(load(t.m[k], d.exp_avg, i), s.beta1), __fmul_rn(g, s.one_minus_beta1));
    const float v = __fadd_rn(__fmul_rn(load(t.v[k], d.exp_avg_sq, i), s.beta2),
                              __fmul_rn(__fmul_rn(g, g), s.one_minus_beta2));
    float p = __fmul_rn(load(t.main[k], d.main, i), s.decay);
    const float denom = __fadd_rn(__fmul_rn(__fsqrt_rn(v), s.inv_bc2_sqrt), s.eps);
    p = __fsub_rn(p, __fdiv_rn(__fmul_rn(m, s.step_size), denom));
    store(t.m[k], d.exp_avg, i, m);
    store(t.v[k], d.exp_avg_sq, i, v);
    store(t.main[k], d.main, i, p);
    if (own_param) store(t.param[k], d.param, i, p);
  }
}

bool valid(int dtype) { return dtype == kFloat32 || dtype == kFloat16 || dtype == kBFloat16; }

}  // namespace

cudaError_t adamw_step(int n, void* const* main, const void* const* grad, void* const* exp_avg,
                       void* const* exp_avg_sq, void* const* param, const int64_t* numel, const float* divisor,
                       AdamWDTypes dtypes, AdamWScalars scalars, cudaStream_t stream) {
  if (n < 0 || !valid(dtypes.main) || !valid(dtypes.grad) || !valid(dtypes.exp_avg) || !valid(dtypes.exp_avg_sq) ||
      !valid(dtypes.param)) {
    return cudaErrorInvalidValue;
  }
  Lists t{};
  int blocks = 0;
  for (int i = 0; i < n; ++i) {
    const int64_t chunks = (numel[i] + kChunk - 1) / kChunk;
    if (numel[i] <= 0 || chunks > (1 << 30)) return cudaErrorInvalidValue;
    // a full list, or a tensor that would push the grid past its limit: launch what is gathered first
    if (t.count == kTensors || static_cast<int64_t>(blocks) + chunks > (1 << 30)) {
      t.first_block[t.count] = blocks;
      adamw_kernel<<<blocks, kThreads, 0, stream>>>(t, divisor, dtypes, scalars);
      if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
      t = Lists{};
      blocks = 0;
    }
    const int k = t.count++;
    t.main[k] = main[i];
    t.grad[k] = grad[i];
    t.m[k] = exp_avg[i];
    t.v[k] = exp_avg_sq[i];
    t.param[k] = param[i];
    t.numel[k] = numel[i];
    t.first_block[k] = blocks;
    blocks += static_cast<int>(chunks);
  }
  if (t.count == 0) return cudaSuccess;
  t.first_block[t.count] = blocks;
  adamw_kernel<<<blocks, kThreads, 0, stream>>>(t, divisor, dtypes, scalars);
  return cudaGetLastError();
}

}  // namespace megatron_fused
