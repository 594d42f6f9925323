// The Python module megatron_fused_kernels: registers the bindings (bindings.h; one
// bind_<op>.cpp per op: argument checks, output allocation, the launch). A new binding is a
// declaration in bindings.h, its bind_<op>.cpp, and one m.def line here.
#include <torch/csrc/utils/pybind.h>

#include "bindings.h"
#include "source_hash.h"

namespace mfb = megatron_fused_bind;

#ifdef MEGATRON_FUSED_CPU_STUB
#include <map>
#include <string>

namespace megatron_fused {
std::map<std::string, int> stub_launches();  // cpu_stub/launchers_stub.cpp
}
#endif

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "Megatron fused CUDA kernels (csrc/fused): softmax, norms, bias activations, rotary embedding, AdamW";
  m.attr("SOURCE_HASH") = MEGATRON_FUSED_SOURCE_HASH_STRING;  // the loader rebuilds a module of other sources
  namespace py = pybind11;
  // c10::ValueError -> ValueError and any other c10::Error -> RuntimeError, for this module's
  // functions whether or not pybind11 shares torch's exception translators with it
  py::register_local_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const c10::ValueError& e) {
      PyErr_SetString(PyExc_ValueError, e.what_without_backtrace());
    } catch (const c10::Error& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what_without_backtrace());
    }
  });
  m.def("softmax_forward", &mfb::softmax_forward, "softmax(scale x) with padding mask (bool, True = masked) or causal",
        py::arg("x"), py::arg("mask"), py::arg("scale"), py::arg("causal"));
  m.def("softmax_backward", &mfb::softmax_backward, "gradient of the scaled softmax", py::arg("grad"), py::arg("y"),
        py::arg("scale"), py::arg("causal") = false);
  m.def("norm_forward", &mfb::norm_forward, "LayerNorm / RMSNorm forward -> (y, mean, rstd)", py::arg("x"),
        py::arg("weight"), py::arg("bias"), py::arg("eps"), py::arg("rms"));
  m.def("norm_backward", &mfb::norm_backward, "LayerNorm / RMSNorm backward -> (dx, dweight, dbias)", py::arg("grad"),
        py::arg("x"), py::arg("mean"), py::arg("rstd"), py::arg("weight"), py::arg("rms"), py::arg("has_bias"));
  m.def("bias_gelu_forward", &mfb::bias_gelu_forward, "gelu(x + bias)", py::arg("x"), py::arg("bias"));
  m.def("bias_gelu_backward", &mfb::bias_gelu_backward, "gradients of gelu(x + bias) -> (dx, dbias or None)",
        py::arg("grad"), py::arg("x"), py::arg("bias"));
  m.def("swiglu_forward", &mfb::swiglu_forward, "silu(gate) * up of x + bias = [gate | up]", py::arg("x"),
        py::arg("bias"));
#ifndef MEGATRON_FUSED_CPU_STUB  // bind_wgrad.cpp: cuBLAS, not in the CPU test build
  m.def("wgrad_gemm_accumulate", &megatron_fused::wgrad_gemm_accumulate, "main += g^T x (fp32, cuBLAS; accumulate false: main = g^T x); false: no cuBLAS", py::arg("x"), py::arg("g"), py::arg("main"), py::arg("accumulate") = true);
#endif
  m.def("swiglu_backward", &mfb::swiglu_backward, "gradients of swiglu -> (dx, dbias or None)", py::arg("grad"),
        py::arg("x"), py::arg("bias"));
  m.def("rope_apply", &mfb::rope_apply, "rotary embedding (rotate-half); backward=True applies the transpose",
        py::arg("x"), py::arg("cos"), py::arg("sin"), py::arg("backward"));
  m.def("adamw_step", &mfb::adamw_step, "one precision-aware multi-tensor AdamW step, in place (writes params too)",
        py::arg("mains"), py::arg("grads"), py::arg("exp_avgs"), py::arg("exp_avg_sqs"), py::arg("params"),
        py::arg("divisor"), py::arg("beta1"), py::arg("beta2"), py::arg("eps"), py::arg("step_size"),
        py::arg("inv_bc2_sqrt"), py::arg("decay"));
#ifdef MEGATRON_FUSED_CPU_STUB
  m.def("_stub_launches", &megatron_fused::stub_launches, "{launcher: calls} (the CPU test build only)");
#endif
}
