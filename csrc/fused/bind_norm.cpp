// Bindings of LayerNorm / RMSNorm (norm.cu).
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>

#include "bindings.h"
#include "checks.h"

namespace megatron_fused_bind {
namespace {

// weight / bias [cols], contiguous, on x's device, of x's dtype (code x_code) or float32;
// returns its dtype code
int check_weight(const at::Tensor& x, int x_code, const at::Tensor& w, const char* op, const char* name) {
  check_vector(x, w, x.size(-1), op, name);
  MF_CHECK(w.scalar_type() == x.scalar_type() || w.scalar_type() == at::kFloat, op, name,
           " must have the input's dtype (", x.scalar_type(), ") or float32, got ", w.scalar_type());
  return w.scalar_type() == x.scalar_type() ? x_code : megatron_fused::kFloat32;
}

void check_stat(const at::Tensor& x, const at::Tensor& s, int64_t rows, const char* op, const char* name) {
  check_vector(x, s, rows, op, name);
  MF_CHECK(s.scalar_type() == at::kFloat, op, name, " must be float32, got ", s.scalar_type());
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> norm_forward(const at::Tensor& x, const at::Tensor& weight,
                                                            const std::optional<at::Tensor>& bias_arg, double eps,
                                                            bool rms) {
  const char* op = "norm_forward";
  const at::Tensor bias = value_or_undefined(bias_arg);
  const int dtype = check_float_tensor(x, op, "input", 1);
  check_contiguous(x, op, "input");
  const int wdtype = check_weight(x, dtype, weight, op, "weight");
  if (bias.defined()) {
    MF_CHECK(!rms, op, "RMSNorm takes no bias");
    check_weight(x, dtype, bias, op, "bias");
    MF_CHECK(bias.scalar_type() == weight.scalar_type(), op, "bias must have the weight's dtype (",
             weight.scalar_type(), "), got ", bias.scalar_type());
  }
  check_finite(eps, op, "eps");
  MF_CHECK(eps >= 0, op, "eps must be >= 0, got ", eps);
  const int cols = to_int(x.size(-1), op, "the hidden size");
  const int64_t rows = x.numel() / cols;
  const auto f32 = x.options().dtype(at::kFloat);
  at::Tensor y = at::empty_like(x);
  at::Tensor mean = at::empty({rms ? 0 : rows}, f32);
  at::Tensor rstd = at::empty({rows}, f32);
  if (rows == 0) return {y, mean, rstd};
  launch_on(x, op, [&](cudaStream_t stream) {
    return megatron_fused::norm_forward(x.const_data_ptr(), weight.const_data_ptr(),
                                        bias.defined() ? bias.const_data_ptr() : nullptr, y.mutable_data_ptr(),
                                        rms ? nullptr : static_cast<float*>(mean.mutable_data_ptr()),
                                        static_cast<float*>(rstd.mutable_data_ptr()), rows, cols,
                                        static_cast<float>(eps), rms, dtype, wdtype, stream);
  });
  return {y, mean, rstd};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> norm_backward(const at::Tensor& dy, const at::Tensor& x,
                                                             const at::Tensor& mean, const at::Tensor& rstd,
                                                             const at::Tensor& weight, bool rms, bool has_bias) {
  const char* op = "norm_backward";
  const int dtype = check_with_grad(x, dy, op, "input", 1);
  const int wdtype = check_weight(x, dtype, weight, op, "weight");
  MF_CHECK(!(rms && has_bias), op, "RMSNorm has no bias");
  const int cols = to_int(x.size(-1), op, "the hidden size");
  const int64_t rows = x.numel() / cols;
  check_stat(x, rstd, rows, op, "rstd");
  if (!rms) check_stat(x, mean, rows, op, "mean");
  at::Tensor dx = at::empty_like(x);
  at::Tensor dw = at::empty_like(weight);
  at::Tensor db = has_bias ? at::empty_like(weight) : at::Tensor();
  if (rows == 0) {  // a sum over no rows
    dw.zero_();
    if (db.defined()) db.zero_();
    return {dx, dw, db};
  }
  const int64_t floats = megatron_fused::norm_backward_workspace(dy.const_data_ptr(), x.const_data_ptr(),
                                                                 weight.const_data_ptr(), dx.const_data_ptr(), rows,
                                                                 cols, rms, dtype, wdtype);
  at::Tensor workspace = at::empty({floats}, x.options().dtype(at::kFloat));
  launch_on(x, op, [&](cudaStream_t stream) {
    return megatron_fused::norm_backward(dy.const_data_ptr(), x.const_data_ptr(),
                                         rms ? nullptr : static_cast<const float*>(mean.const_data_ptr()),
                                         static_cast<const float*>(rstd.const_data_ptr()), weight.const_data_ptr(),
                                         dx.mutable_data_ptr(), dw.mutable_data_ptr(),
                                         db.defined() ? db.mutable_data_ptr() : nullptr,
                                         static_cast<float*>(workspace.mutable_data_ptr()), floats, rows, cols, rms,
                                         dtype, wdtype, stream);
  });
  return {dx, dw, db};
}

}  // namespace megatron_fused_bind
