// Bindings of bias + GeLU and (bias +) SwiGLU (bias_gelu.cu, swiglu.cu).
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>

#include "bindings.h"
#include "checks.h"

namespace megatron_fused_bind {
namespace {

// x [..., cols] contiguous (cols even for SwiGLU); bias [cols] of x's dtype or None. Returns x's dtype code.
int check_x_and_bias(const at::Tensor& x, const at::Tensor& bias, bool swiglu, const char* op) {
  const int dtype = check_float_tensor(x, op, "input", 1);
  check_contiguous(x, op, "input");
  if (swiglu) MF_CHECK(x.size(-1) % 2 == 0, op, "input must be [..., 2 f] = [gate | up], got ", x.sizes());
  if (bias.defined()) {
    check_vector(x, bias, x.size(-1), op, "bias");
    MF_CHECK(bias.scalar_type() == x.scalar_type(), op, "bias must have dtype ", x.scalar_type(), ", got ",
             bias.scalar_type());
  }
  return dtype;
}

// dy [..., cols] (SwiGLU: [..., cols / 2]) like x
void check_grad(const at::Tensor& x, const at::Tensor& dy, bool swiglu, const char* op) {
  check_like(x, dy, op, "grad");
  std::vector<int64_t> shape = x.sizes().vec();
  if (swiglu) shape.back() /= 2;
  check_shape(dy, shape, op, "grad");
  check_contiguous(dy, op, "grad");
}

at::Tensor forward(const at::Tensor& x, const std::optional<at::Tensor>& bias_arg, bool swiglu, const char* op) {
  const at::Tensor bias = value_or_undefined(bias_arg);
  const int dtype = check_x_and_bias(x, bias, swiglu, op);
  std::vector<int64_t> shape = x.sizes().vec();
  if (swiglu) shape.back() /= 2;
  at::Tensor y = at::empty(shape, x.options());
  if (x.numel() == 0) return y;
  const int cols = to_int(x.size(-1), op, "the last dim");
  const int64_t rows = x.numel() / cols;
  const void* b = bias.defined() ? bias.const_data_ptr() : nullptr;
  launch_on(x, op, [&](cudaStream_t stream) {
    return swiglu ? megatron_fused::swiglu_forward(x.const_data_ptr(), b, y.mutable_data_ptr(), rows, cols / 2, dtype,
                                                   stream)
                  : megatron_fused::bias_gelu_forward(x.const_data_ptr(), b, y.mutable_data_ptr(), rows, cols, dtype,
                                                      stream);
  });
  return y;
}

// -> (dx, dbias or None): dbias is the fp32 sum over rows of the unrounded dx, written in the same pass
std::tuple<at::Tensor, at::Tensor> backward(const at::Tensor& dy, const at::Tensor& x,
                                            const std::optional<at::Tensor>& bias_arg, bool swiglu, const char* op) {
  const at::Tensor bias = value_or_undefined(bias_arg);
  const int dtype = check_x_and_bias(x, bias, swiglu, op);
  check_grad(x, dy, swiglu, op);
  at::Tensor dx = at::empty_like(x);
  at::Tensor dbias = bias.defined() ? at::empty_like(bias) : at::Tensor();
  const int cols = to_int(x.size(-1), op, "the last dim");
  const int64_t rows = x.numel() / cols;
  if (rows == 0) {  // a sum over no rows
    if (dbias.defined()) dbias.zero_();
    return {dx, dbias};
  }
  const int64_t floats = dbias.defined() ? megatron_fused::bias_activation_workspace(rows, cols, swiglu, dtype) : 0;
  at::Tensor workspace = at::empty({floats}, x.options().dtype(at::kFloat));
  const void* b = bias.defined() ? bias.const_data_ptr() : nullptr;
  void* db = dbias.defined() ? dbias.mutable_data_ptr() : nullptr;
  float* ws = dbias.defined() ? static_cast<float*>(workspace.mutable_data_ptr()) : nullptr;
  launch_on(x, op, [&](cudaStream_t stream) {
    return swiglu ? megatron_fused::swiglu_backward(dy.const_data_ptr(), x.const_data_ptr(), b, dx.mutable_data_ptr(),
                                                    db, ws, floats, rows, cols / 2, dtype, stream)
                  : megatron_fused::bias_gelu_backward(dy.const_data_ptr(), x.const_data_ptr(), b,
                                                       dx.mutable_data_ptr(), db, ws, floats, rows, cols, dtype,
                                                       stream);
  });
  return {dx, dbias};
}

}  // namespace

at::Tensor bias_gelu_forward(const at::Tensor& x, const std::optional<at::Tensor>& bias) {
  return forward(x, bias, false, "bias_gelu_forward");
}

std::tuple<at::Tensor, at::Tensor> bias_gelu_backward(const at::Tensor& dy, const at::Tensor& x,
                                                      const std::optional<at::Tensor>& bias) {
  return backward(dy, x, bias, false, "bias_gelu_backward");
}

at::Tensor swiglu_forward(const at::Tensor& x, const std::optional<at::Tensor>& bias) {
  return forward(x, bias, true, "swiglu_forward");
}

std::tuple<at::Tensor, at::Tensor> swiglu_backward(const at::Tensor& dy, const at::Tensor& x,
                                                   const std::optional<at::Tensor>& bias) {
  return backward(dy, x, bias, true, "swiglu_backward");
}

}  // namespace megatron_fused_bind
