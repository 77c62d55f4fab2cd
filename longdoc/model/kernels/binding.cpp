// The kernels' Python module. Every argument of the four entry points is keyword-only and named as
// in attention.h, so that a call names what it passes: two tensors of the same shape passed in each
// other's place cannot bind silently (longdoc.model.attention.CompiledSoftmax calls them).

#include <torch/extension.h>

#include "attention.h"
#include "products.h"

namespace py = pybind11;
namespace kernels = longdoc::attention;

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  module.def("use_own_products", &kernels::use_own_products,
             "q k^T and weights @ values on products.cpp's AVX-512 code, not BLAS; returns whether in effect",
             py::arg("on"));
  module.def("uses_own_products", &kernels::uses_own_products, "Whether use_own_products(True) is in effect");
  module.def("attention_forward", &kernels::attention_forward, "One softmax of global-local attention, scores to context",
             py::kw_only(), py::arg("query"), py::arg("query_scale"), py::arg("first_keys"), py::arg("first_values"),
             py::arg("window_block"), py::arg("second_keys"), py::arg("second_values"), py::arg("relative"),
             py::arg("ids"), py::arg("carried"), py::arg("mask_bias"), py::arg("scale"), py::arg("keep"),
             py::arg("keep_scale"), py::arg("summed_out"), py::arg("probs_out"), py::arg("context_out"),
             py::arg("key_ranges"));
  module.def("talking_heads_forward", &kernels::talking_heads_forward, "attention_forward with talking heads",
             py::kw_only(), py::arg("query"), py::arg("query_scale"), py::arg("first_keys"), py::arg("first_values"),
             py::arg("window_block"), py::arg("second_keys"), py::arg("second_values"), py::arg("relative"),
             py::arg("ids"), py::arg("carried"), py::arg("mask_bias"), py::arg("scale"), py::arg("pre"),
             py::arg("post"), py::arg("keep"), py::arg("keep_scale"), py::arg("summed_out"), py::arg("probs_out"),
             py::arg("context_out"), py::arg("key_ranges"));
  module.def("attention_backward", &kernels::attention_backward, "The gradients of attention_forward's inputs",
             py::kw_only(), py::arg("query"), py::arg("query_scale"), py::arg("first_keys"), py::arg("first_values"),
             py::arg("window_block"), py::arg("second_keys"), py::arg("second_values"), py::arg("probs"),
             py::arg("keep"), py::arg("keep_scale"), py::arg("grad_context"), py::arg("grad_summed"),
             py::arg("scale"), py::arg("grad_scores_out"), py::arg("grad_query"), py::arg("grad_first_keys"),
             py::arg("grad_first_values"), py::arg("grad_second_keys"), py::arg("grad_second_values"),
             py::arg("key_ranges"));
  module.def("talking_heads_backward", &kernels::talking_heads_backward, "The gradients of talking_heads_forward's inputs",
             py::kw_only(), py::arg("query"), py::arg("query_scale"), py::arg("first_keys"), py::arg("first_values"),
             py::arg("window_block"), py::arg("second_keys"), py::arg("second_values"), py::arg("probs"),
             py::arg("summed"), py::arg("keep"), py::arg("keep_scale"), py::arg("pre"), py::arg("post"),
             py::arg("grad_context"), py::arg("grad_summed"), py::arg("scale"), py::arg("grad_scores_out"),
             py::arg("grad_pre"), py::arg("grad_post"), py::arg("grad_query"), py::arg("grad_first_keys"),
             py::arg("grad_first_values"), py::arg("grad_second_keys"), py::arg("grad_second_values"),
             py::arg("key_ranges"));
}
