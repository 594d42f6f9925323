// The Python-facing functions of megatron_fused_kernels, one bind_<op>.cpp each; bindings.cpp
// registers them. Every one checks all of its arguments first (checks.h) and raises ValueError
// on a bad one, RuntimeError on a failed launch; nothing crosses into a kernel unchecked.
#pragma once
#include <ATen/core/Tensor.h>

#include <optional>
#include <tuple>
#include <vector>

namespace megatron_fused_bind {

// bind_softmax.cpp
at::Tensor softmax_forward(const at::Tensor& x, const std::optional<at::Tensor>& mask, double scale, bool causal);
// causal: y is a causal softmax (its entries past the diagonal are not read)
at::Tensor softmax_backward(const at::Tensor& dy, const at::Tensor& y, double scale, bool causal);

// bind_norm.cpp: -> (y, mean (LayerNorm) or empty (RMSNorm), rstd), mean and rstd fp32 [rows];
// -> (dx, dweight, dbias (LayerNorm with bias) or None)
std::tuple<at::Tensor, at::Tensor, at::Tensor> norm_forward(const at::Tensor& x, const at::Tensor& weight,
                                                            const std::optional<at::Tensor>& bias, double eps,
                                                            bool rms);
std::tuple<at::Tensor, at::Tensor, at::Tensor> norm_backward(const at::Tensor& dy, const at::Tensor& x,
                                                             const at::Tensor& mean, const at::Tensor& rstd,
                                                             const at::Tensor& weight, bool rms, bool has_bias);

// bind_activation.cpp: backward -> (dx, dbias or None)
at::Tensor bias_gelu_forward(const at::Tensor& x, const std::optional<at::Tensor>& bias);
std::tuple<at::Tensor, at::Tensor> bias_gelu_backward(const at::Tensor& dy, const at::Tensor& x,
                                                      const std::optional<at::Tensor>& bias);
at::Tensor swiglu_forward(const at::Tensor& x, const std::optional<at::Tensor>& bias);
std::tuple<at::Tensor, at::Tensor> swiglu_backward(const at::Tensor& dy, const at::Tensor& x,
                                                   const std::optional<at::Tensor>& bias);

// bind_rope.cpp
at::Tensor rope_apply(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, bool backward);

// bind_adamw.cpp: one precision-aware AdamW step in place over flat tensors of one param group (adamw.cu);
// params[i] is mains[i] itself where the model's parameter is its main value. -> the number of tensors stepped
int64_t adamw_step(const std::vector<at::Tensor>& mains, const std::vector<at::Tensor>& grads,
                const std::vector<at::Tensor>& exp_avgs, const std::vector<at::Tensor>& exp_avg_sqs,
                const std::vector<at::Tensor>& params, const std::optional<at::Tensor>& divisor, double beta1,
                double beta2, double eps, double step_size, double inv_bc2_sqrt, double decay);

}  // namespace megatron_fused_bind

// bind_wgrad.cpp (cuBLAS; registered outside the CPU test build): main [out, in] (fp32) += g^T x for g [t, out] and
// x [t, in] (bf16, fp16 or fp32, one dtype), all contiguous on one CUDA device, on torch's current stream
// and cuBLAS handle. Raises ValueError on a bad input; false (nothing done) in a build without cuBLAS headers.
namespace megatron_fused {
bool wgrad_gemm_accumulate(const at::Tensor& x, const at::Tensor& g, const at::Tensor& main, bool accumulate);
}  // namespace megatron_fused
