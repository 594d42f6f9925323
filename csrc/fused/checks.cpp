// Argument checks of the bindings (checks.h).
#include "checks.h"

#include <climits>
#include <cmath>

namespace megatron_fused_bind {

void fail_value(const char* function, const char* file, uint32_t line, const std::string& message) {
  throw c10::ValueError(c10::SourceLocation{function, file, line}, message);
}

int check_float_tensor(const at::Tensor& t, const char* op, const char* name, int64_t min_dims) {
  MF_CHECK(t.defined(), op, name, " is missing (an undefined tensor)");
  MF_CHECK(t.device().type() == kernel_device_type(), op, name, " must be a ",
           c10::DeviceTypeName(kernel_device_type(), /*lower_case=*/true), " tensor, got one on ", t.device());
  int code = -1;
  switch (t.scalar_type()) {
    case at::kFloat: code = megatron_fused::kFloat32; break;
    case at::kHalf: code = megatron_fused::kFloat16; break;
    case at::kBFloat16: code = megatron_fused::kBFloat16; break;
    default: break;
  }
  MF_CHECK(code >= 0, op, name, " has unsupported dtype ", t.scalar_type(), " (float32, float16 or bfloat16)");
  MF_CHECK(t.dim() >= min_dims, op, name, " needs at least ", min_dims, " dims, got shape ", t.sizes());
  if (t.dim() > 0) {
    MF_CHECK(t.size(-1) >= 1 && t.size(-1) <= INT_MAX, op, name, " needs a last dim of 1 to ", INT_MAX,
             " elements, got shape ", t.sizes());
  }
  return code;
}

void check_contiguous(const at::Tensor& t, const char* op, const char* name) {
  MF_CHECK(t.is_contiguous(), op, name, " must be contiguous, got strides ", t.strides(), " for shape ",
           t.sizes());
}

int check_with_grad(const at::Tensor& t, const at::Tensor& dy, const char* op, const char* name, int64_t min_dims) {
  const int dtype = check_float_tensor(t, op, name, min_dims);
  check_contiguous(t, op, name);
  check_like(t, dy, op, "grad");
  check_shape(dy, t.sizes(), op, "grad");
  check_contiguous(dy, op, "grad");
  return dtype;
}

void check_same_device(const at::Tensor& ref, const at::Tensor& t, const char* op, const char* name) {
  MF_CHECK(t.defined(), op, name, " is missing (an undefined tensor)");
  MF_CHECK(t.device() == ref.device(), op, name, " must be on ", ref.device(), ", got ", t.device());
}

void check_like(const at::Tensor& ref, const at::Tensor& t, const char* op, const char* name) {
  check_same_device(ref, t, op, name);
  MF_CHECK(t.scalar_type() == ref.scalar_type(), op, name, " must have dtype ", ref.scalar_type(), ", got ",
           t.scalar_type());
}

void check_shape(const at::Tensor& t, c10::IntArrayRef shape, const char* op, const char* name) {
  MF_CHECK(t.sizes() == shape, op, name, " must have shape ", shape, ", got ", t.sizes());
}

void check_vector(const at::Tensor& ref, const at::Tensor& t, int64_t n, const char* op, const char* name) {
  check_same_device(ref, t, op, name);
  MF_CHECK(t.dim() == 1 && t.size(0) == n, op, name, " must have shape [", n, "], got ", t.sizes());
  check_contiguous(t, op, name);
}

int to_int(int64_t v, const char* op, const char* what) {
  MF_CHECK(v >= 1 && v <= INT_MAX, op, what, " must be 1 to ", INT_MAX, ", got ", v);
  return static_cast<int>(v);
}

void check_finite(double v, const char* op, const char* what) {
  MF_CHECK(std::isfinite(v), op, what, " must be finite, got ", v);
}

}  // namespace megatron_fused_bind
