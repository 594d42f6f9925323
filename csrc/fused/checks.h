// What every binding shares: argument checks and the launch on the tensors' device.
//
// Every binding checks every tensor (defined, device, dtype, dims, sizes, layout) and every
// number before it allocates, takes a pointer or launches anything; a bad argument raises
// ValueError naming the op, the argument, what was expected and what came. A launch that fails
// raises RuntimeError. Only c10 / ATen core headers here: no CUDA header (launch_on hides the
// stream and the device guard), so the CPU test build (cpu_stub/) compiles these files as they
// are.
#pragma once
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <functional>

#include "fused_kernels.h"

namespace megatron_fused_bind {

// ValueError "megatron_fused_kernels.<op>: <message...>" unless cond
#define MF_CHECK(cond, op, ...) TORCH_CHECK_VALUE(cond, "megatron_fused_kernels.", op, ": ", __VA_ARGS__)

// The device the kernels run on: CUDA (meta in the CPU test build, whose tensors have shapes
// and no memory).
c10::DeviceType kernel_device_type();

// A tensor the kernels compute on: defined, on the kernels' device, fp32 / fp16 / bf16, at
// least min_dims dims, a last dim of 1 .. INT_MAX elements. Returns its dtype code.
int check_float_tensor(const at::Tensor& t, const char* op, const char* name, int64_t min_dims);
void check_contiguous(const at::Tensor& t, const char* op, const char* name);
// A backward's saved tensor t (check_float_tensor, contiguous) and its gradient dy: like t,
// t's shape, contiguous. Returns the dtype code.
int check_with_grad(const at::Tensor& t, const at::Tensor& dy, const char* op, const char* name, int64_t min_dims);
// defined, on ref's device (type and index), of ref's dtype
void check_like(const at::Tensor& ref, const at::Tensor& t, const char* op, const char* name);
void check_same_device(const at::Tensor& ref, const at::Tensor& t, const char* op, const char* name);
void check_shape(const at::Tensor& t, c10::IntArrayRef shape, const char* op, const char* name);
// 1-D, n elements, contiguous, on ref's device; dtype checked by the caller
void check_vector(const at::Tensor& ref, const at::Tensor& t, int64_t n, const char* op, const char* name);
// 1 .. INT_MAX (the kernels index with int)
int to_int(int64_t v, const char* op, const char* what);
void check_finite(double v, const char* op, const char* what);
// The optional argument, or an undefined tensor for None.
inline at::Tensor value_or_undefined(const std::optional<at::Tensor>& t) { return t.has_value() ? *t : at::Tensor(); }

// Runs launch(stream) with t's device current, on that device's current stream; raises
// RuntimeError naming op when it returns an error.
void launch_on(const at::Tensor& t, const char* op, const std::function<cudaError_t(cudaStream_t)>& launch);

}  // namespace megatron_fused_bind
