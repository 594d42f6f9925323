// The kernels' host API (fused_kernels.h) for the CPU test build of the bindings: every
// launcher counts its calls and launches nothing, so the test sees which inputs reached a
// launch (valid ones) and which did not (every bad one).
#include <map>
#include <mutex>
#include <string>

#include "../fused_kernels.h"

namespace megatron_fused {
namespace {

std::mutex lock;
std::map<std::string, int> calls;

cudaError_t count(const char* name) {
  const std::lock_guard<std::mutex> guard(lock);
  ++calls[name];
  return cudaSuccess;
}

}  // namespace

std::map<std::string, int> stub_launches() {
  const std::lock_guard<std::mutex> guard(lock);
  return calls;
}

cudaError_t softmax_forward(const void*, void*, const uint8_t*, int, int64_t, int, int, int, int, float, int,
                            cudaStream_t) {
  return count("softmax_forward");
}
cudaError_t softmax_backward(const void*, const void*, void*, int64_t, int, int, float, int, cudaStream_t) {
  return count("softmax_backward");
}
cudaError_t norm_forward(const void*, const void*, const void*, void*, float*, float*, int64_t, int, float, bool, int,
                         int, cudaStream_t) {
  return count("norm_forward");
}
int64_t norm_backward_workspace(const void*, const void*, const void*, const void*, int64_t rows, int cols, bool, int,
                                int) {
  return 2 * rows * cols;
}
cudaError_t norm_backward(const void*, const void*, const float*, const float*, const void*, void*, void*, void*,
                          float*, int64_t, int64_t, int, bool, int, int, cudaStream_t) {
  return count("norm_backward");
}
cudaError_t bias_gelu_forward(const void*, const void*, void*, int64_t, int, int, cudaStream_t) {
  return count("bias_gelu_forward");
}
cudaError_t bias_gelu_backward(const void*, const void*, const void*, void*, void*, float*, int64_t, int64_t, int, int,
                               cudaStream_t) {
  return count("bias_gelu_backward");
}
cudaError_t swiglu_forward(const void*, const void*, void*, int64_t, int, int, cudaStream_t) {
  return count("swiglu_forward");
}
cudaError_t swiglu_backward(const void*, const void*, const void*, void*, void*, float*, int64_t, int64_t, int, int,
                            cudaStream_t) {
  return count("swiglu_backward");
}
int64_t bias_activation_workspace(int64_t rows, int cols, bool, int) { return rows * cols; }
cudaError_t rope_apply(const void*, int64_t, int64_t, int64_t, const void*, const void*, void*, int64_t, int64_t,
                       int64_t, int, bool, int, cudaStream_t) {
  return count("rope_apply");
}

cudaError_t adamw_step(int, void* const*, const void* const*, void* const*, void* const*, void* const*, const int64_t*,
                       const float*, AdamWDTypes, AdamWScalars, cudaStream_t) {
  return count("adamw_step");
}

}  // namespace megatron_fused
