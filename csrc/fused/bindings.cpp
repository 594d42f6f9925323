// Python bindings of the fused kernels (module megatron_fused_kernels): tensor checks,
// output allocation, the current stream and the device guard; the math is in the .cu files.
//
// Only ATen, c10/cuda and pybind headers: torch/extension.h would also pull in the whole C++
// frontend and double the build time of this file.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/utils/pybind.h>

#include <climits>
#include <optional>
#include <tuple>

#include "fused_kernels.h"
#include "source_hash.h"

namespace mf = megatron_fused;

namespace {

int dtype_code(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return mf::kFloat32;
    case at::kHalf: return mf::kFloat16;
    case at::kBFloat16: return mf::kBFloat16;
    default: TORCH_CHECK(false, "megatron_fused_kernels: unsupported dtype ", t.scalar_type());
  }
  return -1;
}

void check_input(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.is_cuda(), "megatron_fused_kernels: ", name, " must be a CUDA tensor");
  TORCH_CHECK(t.is_contiguous(), "megatron_fused_kernels: ", name, " must be contiguous");
}

void check_like(const at::Tensor& ref, const at::Tensor& t, const char* name) {
  check_input(t, name);
  TORCH_CHECK(t.device() == ref.device(), "megatron_fused_kernels: ", name, " is on another device");
  TORCH_CHECK(t.scalar_type() == ref.scalar_type(), "megatron_fused_kernels: ", name, " must have dtype ",
              ref.scalar_type(), ", got ", t.scalar_type());
}

const void* optional_ptr(const std::optional<at::Tensor>& t, const at::Tensor& ref, const char* name, int64_t numel) {
  if (!t.has_value() || !t->defined()) return nullptr;
  check_like(ref, *t, name);
  TORCH_CHECK(t->numel() == numel, "megatron_fused_kernels: ", name, " must have ", numel, " elements");
  return t->data_ptr();
}

int to_int(int64_t v, const char* what) {
  TORCH_CHECK(v >= 0 && v <= INT_MAX, "megatron_fused_kernels: ", what, " too large: ", v);
  return static_cast<int>(v);
}

cudaStream_t stream() { return c10::cuda::getCurrentCUDAStream().stream(); }

void launched(cudaError_t err, const char* what) {
  TORCH_CHECK(err == cudaSuccess, "megatron_fused_kernels.", what, ": ", cudaGetErrorString(err));
}

// ---- softmax ------------------------------------------------------------------------------

at::Tensor softmax_forward(const at::Tensor& x, const std::optional<at::Tensor>& mask, double scale, bool causal) {
  check_input(x, "input");
  TORCH_CHECK(x.dim() >= 2, "megatron_fused_kernels: softmax input needs at least 2 dims");
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor y = at::empty_like(x);
  const int cols = to_int(x.size(-1), "softmax row length");
  const int64_t rows = cols == 0 ? 0 : x.numel() / cols;
  const int sq = to_int(x.size(-2), "query length");
  int kind = causal ? 2 : 0, heads = 1, mask_batches = 1;
  const uint8_t* mask_ptr = nullptr;
  if (mask.has_value() && mask->defined()) {
    const at::Tensor& m = *mask;
    TORCH_CHECK(!causal, "megatron_fused_kernels: causal softmax takes no mask");
    check_input(m, "mask");
    TORCH_CHECK(m.device() == x.device(), "megatron_fused_kernels: mask is on another device");
    TORCH_CHECK(m.scalar_type() == at::kBool || m.scalar_type() == at::kByte, "megatron_fused_kernels: mask must be bool");
    TORCH_CHECK(x.dim() == 4, "megatron_fused_kernels: masked softmax input must be [b, heads, sq, sk]");
    TORCH_CHECK(m.dim() == 4 && m.size(1) == 1 && m.size(2) == x.size(2) && m.size(3) == x.size(3) &&
                    (m.size(0) == 1 || m.size(0) == x.size(0)),
                "megatron_fused_kernels: mask must be [b or 1, 1, sq, sk] for input ", x.sizes(), ", got ", m.sizes());
    kind = 1;
    heads = to_int(x.size(1), "heads");
    mask_batches = to_int(m.size(0), "mask batch");
    mask_ptr = static_cast<const uint8_t*>(m.data_ptr());
  }
  launched(mf::softmax_forward(x.data_ptr(), y.data_ptr(), mask_ptr, kind, rows, cols, sq, heads, mask_batches,
                               static_cast<float>(scale), dtype_code(x), stream()),
           "softmax_forward");
  return y;
}

at::Tensor softmax_backward(const at::Tensor& dy, const at::Tensor& y, double scale) {
  check_input(y, "softmax output");
  check_like(y, dy, "grad");
  TORCH_CHECK(dy.sizes() == y.sizes(), "megatron_fused_kernels: grad and output shapes differ");
  const c10::cuda::CUDAGuard guard(y.device());
  at::Tensor dx = at::empty_like(y);
  const int cols = to_int(y.size(-1), "softmax row length");
  const int64_t rows = cols == 0 ? 0 : y.numel() / cols;
  launched(mf::softmax_backward(dy.data_ptr(), y.data_ptr(), dx.data_ptr(), rows, cols, static_cast<float>(scale),
                                dtype_code(y), stream()),
           "softmax_backward");
  return dx;
}

// ---- LayerNorm / RMSNorm ------------------------------------------------------------------

void check_weight(const at::Tensor& x, const at::Tensor& w, const char* name) {
  check_input(w, name);
  TORCH_CHECK(w.device() == x.device(), "megatron_fused_kernels: ", name, " is on another device");
  TORCH_CHECK(w.scalar_type() == x.scalar_type() || w.scalar_type() == at::kFloat,
              "megatron_fused_kernels: ", name, " must have the input's dtype or float32");
  TORCH_CHECK(w.numel() == x.size(-1), "megatron_fused_kernels: ", name, " must have ", x.size(-1), " elements");
}

// -> (y, mean (LayerNorm) or empty (RMSNorm), rstd); mean and rstd are fp32 [rows]
std::tuple<at::Tensor, at::Tensor, at::Tensor> norm_forward(const at::Tensor& x, const at::Tensor& weight,
                                                            const std::optional<at::Tensor>& bias, double eps,
                                                            bool rms) {
  check_input(x, "input");
  TORCH_CHECK(x.dim() >= 1 && x.size(-1) > 0, "megatron_fused_kernels: norm input needs a non-empty last dim");
  check_weight(x, weight, "weight");
  const void* bias_ptr = nullptr;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(!rms, "megatron_fused_kernels: RMSNorm has no bias");
    check_weight(x, *bias, "bias");
    TORCH_CHECK(bias->scalar_type() == weight.scalar_type(), "megatron_fused_kernels: bias and weight dtypes differ");
    bias_ptr = bias->data_ptr();
  }
  const c10::cuda::CUDAGuard guard(x.device());
  const int cols = to_int(x.size(-1), "hidden size");
  const int64_t rows = x.numel() / cols;
  const auto f32 = x.options().dtype(at::kFloat);
  at::Tensor y = at::empty_like(x);
  at::Tensor mean = at::empty({rms ? 0 : rows}, f32);
  at::Tensor rstd = at::empty({rows}, f32);
  launched(mf::norm_forward(x.data_ptr(), weight.data_ptr(), bias_ptr, y.data_ptr(),
                            rms ? nullptr : mean.data_ptr<float>(), rstd.data_ptr<float>(), rows, cols,
                            static_cast<float>(eps), rms, dtype_code(x), dtype_code(weight), stream()),
           "norm_forward");
  return {y, mean, rstd};
}

// -> (dx, dweight, dbias (LayerNorm with bias) or empty)
std::tuple<at::Tensor, at::Tensor, at::Tensor> norm_backward(const at::Tensor& dy, const at::Tensor& x,
                                                             const at::Tensor& mean, const at::Tensor& rstd,
                                                             const at::Tensor& weight, bool rms, bool has_bias) {
  check_input(x, "input");
  check_like(x, dy, "grad");
  TORCH_CHECK(dy.sizes() == x.sizes(), "megatron_fused_kernels: grad and input shapes differ");
  check_weight(x, weight, "weight");
  const int cols = to_int(x.size(-1), "hidden size");
  const int64_t rows = x.numel() / cols;
  check_input(rstd, "rstd");
  TORCH_CHECK(rstd.scalar_type() == at::kFloat && rstd.numel() == rows, "megatron_fused_kernels: bad rstd");
  if (!rms) {
    check_input(mean, "mean");
    TORCH_CHECK(mean.scalar_type() == at::kFloat && mean.numel() == rows, "megatron_fused_kernels: bad mean");
  }
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor dx = at::empty_like(x);
  at::Tensor dw = at::empty_like(weight);
  at::Tensor db = (has_bias && !rms) ? at::empty_like(weight) : at::Tensor();
  if (rows == 0) {  // a sum over no rows
    dw.zero_();
    if (db.defined()) db.zero_();
    return {dx, dw, db};
  }
  const int64_t parts = mf::norm_partials(rows);
  at::Tensor workspace = at::empty({2, parts, cols}, x.options().dtype(at::kFloat));
  launched(mf::norm_backward(dy.data_ptr(), x.data_ptr(), rms ? nullptr : mean.data_ptr<float>(),
                             rstd.data_ptr<float>(), weight.data_ptr(), dx.data_ptr(), dw.data_ptr(),
                             db.defined() ? db.data_ptr() : nullptr, workspace.data_ptr<float>(), rows, cols, rms,
                             dtype_code(x), dtype_code(weight), stream()),
           "norm_backward");
  return {dx, dw, db};
}

// ---- bias + GeLU, SwiGLU --------------------------------------------------------------------

at::Tensor bias_gelu_forward(const at::Tensor& x, const std::optional<at::Tensor>& bias) {
  check_input(x, "input");
  TORCH_CHECK(x.dim() >= 1, "megatron_fused_kernels: bias_gelu needs at least 1 dim");
  const int cols = to_int(x.size(-1), "last dim");
  const void* b = optional_ptr(bias, x, "bias", cols);
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor y = at::empty_like(x);
  launched(mf::bias_gelu_forward(x.data_ptr(), b, y.data_ptr(), x.numel(), cols, dtype_code(x), stream()),
           "bias_gelu_forward");
  return y;
}

at::Tensor bias_gelu_backward(const at::Tensor& dy, const at::Tensor& x, const std::optional<at::Tensor>& bias) {
  check_input(x, "input");
  check_like(x, dy, "grad");
  TORCH_CHECK(dy.sizes() == x.sizes(), "megatron_fused_kernels: grad and input shapes differ");
  const int cols = to_int(x.size(-1), "last dim");
  const void* b = optional_ptr(bias, x, "bias", cols);
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor dx = at::empty_like(x);
  launched(mf::bias_gelu_backward(dy.data_ptr(), x.data_ptr(), b, dx.data_ptr(), x.numel(), cols, dtype_code(x),
                                  stream()),
           "bias_gelu_backward");
  return dx;
}

at::Tensor swiglu_forward(const at::Tensor& x, const std::optional<at::Tensor>& bias) {
  check_input(x, "input");
  TORCH_CHECK(x.dim() >= 1 && x.size(-1) % 2 == 0, "megatron_fused_kernels: swiglu needs an even last dim");
  const int f = to_int(x.size(-1) / 2, "last dim");
  const void* b = optional_ptr(bias, x, "bias", 2 * static_cast<int64_t>(f));
  const c10::cuda::CUDAGuard guard(x.device());
  auto shape = x.sizes().vec();
  shape.back() = f;
  at::Tensor y = at::empty(shape, x.options());
  const int64_t rows = f == 0 ? 0 : x.numel() / (2 * static_cast<int64_t>(f));
  launched(mf::swiglu_forward(x.data_ptr(), b, y.data_ptr(), rows, f, dtype_code(x), stream()), "swiglu_forward");
  return y;
}

at::Tensor swiglu_backward(const at::Tensor& dy, const at::Tensor& x, const std::optional<at::Tensor>& bias) {
  check_input(x, "input");
  check_like(x, dy, "grad");
  TORCH_CHECK(x.dim() >= 1 && x.size(-1) % 2 == 0, "megatron_fused_kernels: swiglu needs an even last dim");
  const int f = to_int(x.size(-1) / 2, "last dim");
  TORCH_CHECK(dy.numel() * 2 == x.numel() && dy.size(-1) == f, "megatron_fused_kernels: swiglu grad shape");
  const void* b = optional_ptr(bias, x, "bias", 2 * static_cast<int64_t>(f));
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor dx = at::empty_like(x);
  const int64_t rows = f == 0 ? 0 : x.numel() / (2 * static_cast<int64_t>(f));
  launched(mf::swiglu_backward(dy.data_ptr(), x.data_ptr(), b, dx.data_ptr(), rows, f, dtype_code(x), stream()),
           "swiglu_backward");
  return dx;
}

// ---- rotary embedding ---------------------------------------------------------------------

// x [s, ..., dim]; cos, sin with s * dim elements ([s, 1, 1, dim]); -> y like x
at::Tensor rope_apply(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, bool backward) {
  check_input(x, "input");
  TORCH_CHECK(x.dim() >= 2 && x.size(-1) % 2 == 0, "megatron_fused_kernels: rope needs [s, ..., even dim]");
  const int64_t s = x.size(0);
  const int dim = to_int(x.size(-1), "head dim");
  check_like(x, cos, "cos");
  check_like(x, sin, "sin");
  TORCH_CHECK(cos.numel() == s * dim && sin.numel() == s * dim,
              "megatron_fused_kernels: cos and sin must be [s, 1, 1, dim] for input ", x.sizes());
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor y = at::empty_like(x);
  const int64_t inner = (s == 0 || dim == 0) ? 0 : x.numel() / (s * dim);
  launched(mf::rope_apply(x.data_ptr(), cos.data_ptr(), sin.data_ptr(), y.data_ptr(), s, inner, dim, backward,
                          dtype_code(x), stream()),
           "rope_apply");
  return y;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "Megatron fused CUDA kernels (csrc/fused): softmax, norms, bias activations, rotary embedding";
  m.attr("SOURCE_HASH") = MEGATRON_FUSED_SOURCE_HASH_STRING;  // the loader rebuilds a module of other sources
  namespace py = pybind11;
  m.def("softmax_forward", &softmax_forward, "softmax(scale x) with padding mask (bool, True = masked) or causal",
        py::arg("x"), py::arg("mask"), py::arg("scale"), py::arg("causal"));
  m.def("softmax_backward", &softmax_backward, "gradient of the scaled softmax", py::arg("grad"), py::arg("y"),
        py::arg("scale"));
  m.def("norm_forward", &norm_forward, "LayerNorm / RMSNorm forward -> (y, mean, rstd)", py::arg("x"),
        py::arg("weight"), py::arg("bias"), py::arg("eps"), py::arg("rms"));
  m.def("norm_backward", &norm_backward, "LayerNorm / RMSNorm backward -> (dx, dweight, dbias)", py::arg("grad"),
        py::arg("x"), py::arg("mean"), py::arg("rstd"), py::arg("weight"), py::arg("rms"), py::arg("has_bias"));
  m.def("bias_gelu_forward", &bias_gelu_forward, "gelu(x + bias)", py::arg("x"), py::arg("bias"));
  m.def("bias_gelu_backward", &bias_gelu_backward, "gradient of gelu(x + bias) wrt x", py::arg("grad"), py::arg("x"),
        py::arg("bias"));
  m.def("swiglu_forward", &swiglu_forward, "silu(gate) * up of x + bias = [gate | up]", py::arg("x"),
        py::arg("bias"));
  m.def("swiglu_backward", &swiglu_backward, "gradient of swiglu wrt x", py::arg("grad"), py::arg("x"),
        py::arg("bias"));
  m.def("wgrad_gemm_accumulate", &mf::wgrad_gemm_accumulate, "main += g^T x (fp32, cuBLAS, beta 1); false: no cuBLAS", py::arg("x"), py::arg("g"), py::arg("main"));  // wgrad_gemm.cu
  m.def("rope_apply", &rope_apply, "rotary embedding (rotate-half); backward=True applies the transpose",
        py::arg("x"), py::arg("cos"), py::arg("sin"), py::arg("backward"));
}
