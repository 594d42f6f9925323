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
#include <cstdio>
#include <functional>
#include <string>
#include <type_traits>

#include "fused_kernels.h"

namespace megatron_fused_bind {

// The text of a failed check, built without std::ostream. On the H200 machine (torch 2.11, GCC 13.3,
// 2026-11-26) the first number streamed into an error message crashed the process (SIGSEGV in this
// module's own instantiation of std::ostream::_M_insert<long>, called by TORCH_CHECK's c10::str;
// tests/gpu/bindings_crash_probe.py: messages of strings, devices and dtypes raised, any integer or
// double died). snprintf (libc) and libc10's own formatting (Device::str, toString(ScalarType)) are
// what formats here.
namespace text_parts {
inline void put(std::string& s, const char* v) { s += v; }
inline void put(std::string& s, const std::string& v) { s += v; }
template <typename T, std::enable_if_t<std::is_integral_v<T>, int> = 0>
inline void put(std::string& s, T v) {
  char b[32];
  std::snprintf(b, sizeof b, "%lld", static_cast<long long>(v));
  s += b;
}
inline void put(std::string& s, double v) {
  char b[40];
  std::snprintf(b, sizeof b, "%g", v);
  s += b;
}
inline void put(std::string& s, c10::IntArrayRef v) {
  s += "[";
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s += ", ";
    put(s, v[i]);
  }
  s += "]";
}
inline void put(std::string& s, c10::ScalarType v) { s += c10::toString(v); }
inline void put(std::string& s, const c10::Device& v) { s += v.str(); }
}  // namespace text_parts

template <typename... Parts>
std::string text(const Parts&... parts) {
  std::string s;
  (text_parts::put(s, parts), ...);
  return s;
}

// throws c10::ValueError (Python ValueError) with `message` (checks.cpp: no formatting there either)
[[noreturn]] void fail_value(const char* function, const char* file, uint32_t line, const std::string& message);

// ValueError "megatron_fused_kernels.<op>: <message...>" unless cond
#define MF_CHECK(cond, op, ...)                                                                         \
  do {                                                                                                 \
    if (C10_UNLIKELY(!(cond))) {                                                                       \
      ::megatron_fused_bind::fail_value(__func__, __FILE__, static_cast<uint32_t>(__LINE__),           \
                                        ::megatron_fused_bind::text("megatron_fused_kernels.", op, ": ", \
                                                                    __VA_ARGS__));                     \
    }                                                                                                  \
  } while (0)

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
