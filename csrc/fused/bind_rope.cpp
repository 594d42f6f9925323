// Binding of the rotary embedding (rope.cu).
#include <ATen/ops/empty.h>

#include "bindings.h"
#include "checks.h"

namespace megatron_fused_bind {

// x [s, b, h, dim]: any strides with a contiguous last dim (q / k as views of the fused QKV
// output); cos, sin with s x dim elements ([s, 1, 1, dim]), contiguous -> y [s, b, h, dim] contiguous
at::Tensor rope_apply(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, bool backward) {
  const char* op = "rope_apply";
  const int dtype = check_float_tensor(x, op, "input", 4);
  MF_CHECK(x.dim() == 4 && x.size(-1) % 2 == 0, op, "input must be [s, b, heads, even dim], got ", x.sizes());
  MF_CHECK(x.stride(-1) == 1, op, "input's last dim must be contiguous, got strides ", x.strides());
  for (int d = 0; d < 3; ++d) MF_CHECK(x.stride(d) >= 0, op, "input has a negative stride: ", x.strides());
  const int64_t s = x.size(0), dim = x.size(3);
  for (const auto& [t, name] : {std::pair<const at::Tensor&, const char*>{cos, "cos"}, {sin, "sin"}}) {
    check_like(x, t, op, name);
    MF_CHECK(t.numel() == s * dim, op, name, " must have s x dim = ", s * dim, " elements ([s, 1, 1, dim]) for input ",
             x.sizes(), ", got ", t.sizes());
    check_contiguous(t, op, name);
  }
  at::Tensor y = at::empty(x.sizes(), x.options());
  if (x.numel() == 0) return y;
  const int d = to_int(dim, op, "the head dim");
  launch_on(x, op, [&](cudaStream_t stream) {
    return megatron_fused::rope_apply(x.const_data_ptr(), x.stride(0), x.stride(1), x.stride(2), cos.const_data_ptr(),
                                      sin.const_data_ptr(), y.mutable_data_ptr(), s, x.size(1), x.size(2), d,
                                      backward, dtype, stream);
  });
  return y;
}

}  // namespace megatron_fused_bind
