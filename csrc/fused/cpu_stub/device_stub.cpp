// device.cpp for the CPU test build: tensors on the meta device stand for CUDA tensors (shapes,
// strides and dtypes without memory), and a launch runs the stub launcher with no stream.
#include "../checks.h"

namespace megatron_fused_bind {

c10::DeviceType kernel_device_type() { return c10::DeviceType::Meta; }

void launch_on(const at::Tensor& t, const char* op, const std::function<cudaError_t(cudaStream_t)>& launch) {
  (void)t;
  const cudaError_t err = launch(nullptr);
  TORCH_CHECK(err == cudaSuccess, "megatron_fused_kernels.", op, ": launch error ", static_cast<int>(err));
}

}  // namespace megatron_fused_bind
