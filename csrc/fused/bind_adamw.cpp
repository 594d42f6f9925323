// Binding of the precision-aware multi-tensor AdamW step (adamw.cu).
#include <vector>

#include "bindings.h"
#include "checks.h"

namespace megatron_fused_bind {
namespace {

// Every tensor of a list: a 1-D contiguous float tensor of the kernels' device, on the first main's device,
// of the list's one dtype, as long as the main value it goes with. Returns the list's dtype code.
int check_list(const std::vector<at::Tensor>& list, const std::vector<at::Tensor>& mains, const char* op,
               const char* name) {
  MF_CHECK(list.size() == mains.size(), op, name, " must hold one tensor per main value (", mains.size(),
           "), got ", list.size());
  int dtype = -1;
  for (size_t i = 0; i < list.size(); ++i) {
    const at::Tensor& t = list[i];
    const int code = check_float_tensor(t, op, name, 1);
    MF_CHECK(t.dim() == 1, op, name, " must be flat (1-D) tensors, got shape ", t.sizes(), " at ", i);
    check_contiguous(t, op, name);
    check_same_device(mains[0], t, op, name);
    MF_CHECK(dtype < 0 || code == dtype, op, name, " must all have one dtype; ", t.scalar_type(), " at ", i,
             " differs from ", list[0].scalar_type());
    MF_CHECK(t.numel() == mains[i].numel(), op, name, " at ", i, " must have ", mains[i].numel(),
             " elements (its main value's), got ", t.numel());
    dtype = code;
  }
  return dtype;
}

std::vector<void*> pointers(const std::vector<at::Tensor>& list) {
  std::vector<void*> out;
  for (const at::Tensor& t : list) out.push_back(t.mutable_data_ptr());
  return out;
}

}  // namespace

int64_t adamw_step(const std::vector<at::Tensor>& mains, const std::vector<at::Tensor>& grads,
                const std::vector<at::Tensor>& exp_avgs, const std::vector<at::Tensor>& exp_avg_sqs,
                const std::vector<at::Tensor>& params, const std::optional<at::Tensor>& divisor_arg, double beta1,
                double beta2, double eps, double step_size, double inv_bc2_sqrt, double decay) {
  const char* op = "adamw_step";
  MF_CHECK(!mains.empty(), op, "needs at least one main value");
  megatron_fused::AdamWDTypes dtypes{};
  dtypes.main = check_list(mains, mains, op, "mains");
  MF_CHECK(dtypes.main != megatron_fused::kBFloat16, op, "mains must be float32 or float16 (--main-params-dtype), "
           "got ", mains[0].scalar_type());
  dtypes.grad = check_list(grads, mains, op, "grads");
  dtypes.exp_avg = check_list(exp_avgs, mains, op, "exp_avgs");
  dtypes.exp_avg_sq = check_list(exp_avg_sqs, mains, op, "exp_avg_sqs");
  dtypes.param = check_list(params, mains, op, "params");
  for (size_t i = 0; i < mains.size(); ++i) {
    // a parameter that is its own main value (an fp32 model) is passed as that same tensor: stored once
    const bool alias = params[i].is_same(mains[i]);
    MF_CHECK(alias || !params[i].is_alias_of(mains[i]), op, "params at ", i, " overlaps its main value without "
             "being it");
  }
  const at::Tensor divisor = value_or_undefined(divisor_arg);
  if (divisor.defined()) {
    check_float_tensor(divisor, op, "divisor", 0);
    check_same_device(mains[0], divisor, op, "divisor");
    MF_CHECK(divisor.scalar_type() == at::kFloat && divisor.numel() == 1, op, "divisor must be one float32, got ",
             divisor.scalar_type(), " of shape ", divisor.sizes());
  }
  for (const auto& [v, what] : {std::pair<double, const char*>{beta1, "beta1"}, {beta2, "beta2"}, {eps, "eps"},
                                {step_size, "step_size"}, {inv_bc2_sqrt, "inv_bc2_sqrt"}, {decay, "decay"}}) {
    check_finite(v, op, what);
  }
  MF_CHECK(beta1 >= 0.0 && beta1 < 1.0 && beta2 >= 0.0 && beta2 < 1.0, op, "betas must be in [0, 1), got ", beta1,
           ", ", beta2);
  MF_CHECK(eps > 0.0 && inv_bc2_sqrt > 0.0, op, "eps and inv_bc2_sqrt must be positive, got ", eps, ", ",
           inv_bc2_sqrt);
  const megatron_fused::AdamWScalars scalars{static_cast<float>(beta1), static_cast<float>(1.0 - beta1),
                                             static_cast<float>(beta2), static_cast<float>(1.0 - beta2),
                                             static_cast<float>(eps), static_cast<float>(step_size),
                                             static_cast<float>(inv_bc2_sqrt), static_cast<float>(decay)};
  std::vector<void*> main_p = pointers(mains), m_p = pointers(exp_avgs), v_p = pointers(exp_avg_sqs),
                     param_p = pointers(params);
  std::vector<const void*> grad_p;
  std::vector<int64_t> numel;
  for (size_t i = 0; i < mains.size(); ++i) {
    grad_p.push_back(grads[i].const_data_ptr());
    numel.push_back(mains[i].numel());
  }
  const float* div = divisor.defined() ? static_cast<const float*>(divisor.const_data_ptr()) : nullptr;
  launch_on(mains[0], op, [&](cudaStream_t stream) {
    return megatron_fused::adamw_step(static_cast<int>(mains.size()), main_p.data(), grad_p.data(), m_p.data(),
                                      v_p.data(), param_p.data(), numel.data(), div, dtypes, scalars, stream);
  });
  return static_cast<int64_t>(mains.size());
}

}  // namespace megatron_fused_bind
