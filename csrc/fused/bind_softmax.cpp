// Bindings of the scaled masked / causal softmax (softmax.cu).
#include <ATen/ops/empty_like.h>

#include "bindings.h"
#include "checks.h"

namespace megatron_fused_bind {

at::Tensor softmax_forward(const at::Tensor& x, const std::optional<at::Tensor>& mask_arg, double scale, bool causal) {
  const char* op = "softmax_forward";
  const at::Tensor mask = value_or_undefined(mask_arg);
  const int dtype = check_float_tensor(x, op, "input", 2);
  check_contiguous(x, op, "input");
  check_finite(scale, op, "scale");
  int kind = causal ? 2 : 0, heads = 1, mask_batches = 1;
  if (mask.defined()) {
    MF_CHECK(!causal, op, "the causal softmax takes no mask");
    MF_CHECK(x.dim() == 4, op, "a masked softmax input must be [b, heads, sq, sk], got ", x.sizes());
    check_same_device(x, mask, op, "mask");
    MF_CHECK(mask.scalar_type() == at::kBool || mask.scalar_type() == at::kByte, op,
             "mask must be bool (True = masked), got ", mask.scalar_type());
    MF_CHECK(mask.dim() == 4 && mask.size(1) == 1 && mask.size(2) == x.size(2) && mask.size(3) == x.size(3) &&
                 (mask.size(0) == 1 || mask.size(0) == x.size(0)),
             op, "mask must be [b or 1, 1, sq, sk] for input ", x.sizes(), ", got ", mask.sizes());
    check_contiguous(mask, op, "mask");
    kind = 1;
  }
  at::Tensor y = at::empty_like(x);
  if (x.numel() == 0) return y;
  const int cols = to_int(x.size(-1), op, "the row length");
  const int sq = to_int(x.size(-2), op, "the query length");
  if (mask.defined()) {
    heads = to_int(x.size(1), op, "heads");
    mask_batches = to_int(mask.size(0), op, "the mask's batch");
  }
  const int64_t rows = x.numel() / cols;
  const uint8_t* mask_ptr = mask.defined() ? static_cast<const uint8_t*>(mask.const_data_ptr()) : nullptr;
  launch_on(x, op, [&](cudaStream_t stream) {
    return megatron_fused::softmax_forward(x.const_data_ptr(), y.mutable_data_ptr(), mask_ptr, kind, rows, cols, sq,
                                           heads, mask_batches, static_cast<float>(scale), dtype, stream);
  });
  return y;
}

at::Tensor softmax_backward(const at::Tensor& dy, const at::Tensor& y, double scale, bool causal) {
  const char* op = "softmax_backward";
  const int dtype = check_with_grad(y, dy, op, "softmax output", 2);
  check_finite(scale, op, "scale");
  at::Tensor dx = at::empty_like(y);
  if (y.numel() == 0) return dx;
  const int cols = to_int(y.size(-1), op, "the row length");
  const int causal_sq = causal ? to_int(y.size(-2), op, "the query length") : 0;
  const int64_t rows = y.numel() / cols;
  launch_on(y, op, [&](cudaStream_t stream) {
    return megatron_fused::softmax_backward(dy.const_data_ptr(), y.const_data_ptr(), dx.mutable_data_ptr(), rows, cols,
                                            causal_sq, static_cast<float>(scale), dtype, stream);
  });
  return dx;
}

}  // namespace megatron_fused_bind
