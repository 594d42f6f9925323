// The bindings' one contact with the CUDA runtime: the device guard, the current stream and
// the launch error (cpu_stub/device_stub.cpp stands in for this file in the CPU test build).
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "checks.h"

namespace megatron_fused_bind {

c10::DeviceType kernel_device_type() { return c10::DeviceType::CUDA; }

void launch_on(const at::Tensor& t, const char* op, const std::function<cudaError_t(cudaStream_t)>& launch) {
  const c10::cuda::CUDAGuard guard(t.device());
  const cudaError_t err = launch(c10::cuda::getCurrentCUDAStream(t.device().index()).stream());
  TORCH_CHECK(err == cudaSuccess, "megatron_fused_kernels.", op, ": ", cudaGetErrorString(err));
}

}  // namespace megatron_fused_bind
