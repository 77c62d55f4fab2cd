// The kernels' Python module. Each entry point takes its operands record (attention.h) as keyword
// arguments, every field by its name and none left out, converted once into the record: a call names
// what it passes, so two tensors of the same shape passed in each other's place cannot bind silently
// (longdoc.model.backends.cpu calls them).

#include <torch/extension.h>

#include <functional>
#include <map>
#include <string>

#include "attention.h"
#include "products.h"

namespace py = pybind11;
namespace kernels = longdoc::attention;

namespace {

// The fields of an operands record that an entry point takes, by name: `operator()` makes the record
// from keyword arguments, refusing (TypeError, as Python would) a name it does not know and one left out.
template <typename Operands>
class Keywords {
 public:
  // `member`: a field of Operands or of the record it extends (SoftmaxOperands).
  template <typename Field, typename Record>
  Keywords& field(const char* name, Field Record::*member) {
    setters_[name] = [member](Operands& operands, py::handle value) { operands.*member = py::cast<Field>(value); };
    return *this;
  }

  // These fields and those of `more`.
  Keywords with(const Keywords& more) const {
    Keywords both = *this;
    both.setters_.insert(more.setters_.begin(), more.setters_.end());
    return both;
  }

  Operands operator()(const py::kwargs& given) const {
    Operands operands;
    for (const auto& [key, value] : given) {
      const auto name = py::cast<std::string>(key);
      const auto setter = setters_.find(name);
      if (setter == setters_.end()) throw py::type_error("unexpected keyword argument '" + name + "'");
      setter->second(operands, value);
    }
    for (const auto& [name, setter] : setters_) {
      if (!given.contains(name)) throw py::type_error("missing keyword argument '" + name + "'");
    }
    return operands;
  }

 private:
  std::map<std::string, std::function<void(Operands&, py::handle)>> setters_;
};

using Softmax = kernels::SoftmaxOperands;
using Forward = kernels::ForwardOperands;
using Backward = kernels::BackwardOperands;

// The fields a forward and its backward both take (the mixes only with talking heads: talking()).
template <typename Operands>
Keywords<Operands> softmax_keywords() {
  return Keywords<Operands>()
      .field("query", &Softmax::query).field("query_scale", &Softmax::query_scale)
      .field("first_keys", &Softmax::first_keys).field("first_values", &Softmax::first_values)
      .field("window_block", &Softmax::window_block).field("second_keys", &Softmax::second_keys)
      .field("second_values", &Softmax::second_values).field("scale", &Softmax::scale)
      .field("keep", &Softmax::keep).field("keep_scale", &Softmax::keep_scale)
      .field("key_ranges", &Softmax::key_ranges);
}

template <typename Operands>
Keywords<Operands> talking(Keywords<Operands> keywords) {
  return keywords.with(Keywords<Operands>().field("pre", &Softmax::pre).field("post", &Softmax::post));
}

Keywords<Forward> forward_keywords() {
  return softmax_keywords<Forward>()
      .field("relative", &Forward::relative).field("ids", &Forward::ids).field("carried", &Forward::carried)
      .field("mask_bias", &Forward::mask_bias).field("summed_out", &Forward::summed_out)
      .field("probs_out", &Forward::probs_out).field("context_out", &Forward::context_out);
}

Keywords<Backward> backward_keywords() {
  return softmax_keywords<Backward>()
      .field("probs", &Backward::probs).field("grad_context", &Backward::grad_context)
      .field("grad_summed", &Backward::grad_summed).field("grad_scores_out", &Backward::grad_scores_out)
      .field("grad_query", &Backward::grad_query).field("grad_first_keys", &Backward::grad_first_keys)
      .field("grad_first_values", &Backward::grad_first_values)
      .field("grad_second_keys", &Backward::grad_second_keys)
      .field("grad_second_values", &Backward::grad_second_values);
}

template <typename Operands>
void bind(py::module_& module, const char* name, void (*entry)(const Operands&), Keywords<Operands> keywords,
          const char* doc) {
  module.def(name, [entry, keywords](const py::kwargs& given) { entry(keywords(given)); }, doc);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  module.def("use_own_products", &kernels::use_own_products,
             "q k^T and weights @ values on products.cpp's AVX-512 or AVX2 code, not BLAS; returns whether in effect",
             py::arg("on"));
  module.def("uses_own_products", &kernels::uses_own_products, "Whether use_own_products(True) is in effect");
  const auto talking_backward = Keywords<Backward>().field("summed", &Backward::summed)
      .field("grad_pre", &Backward::grad_pre).field("grad_post", &Backward::grad_post);
  bind(module, "attention_forward", &kernels::attention_forward, forward_keywords(),
       "One softmax of global-local attention, scores to context (keyword arguments: ForwardOperands' fields)");
  bind(module, "talking_heads_forward", &kernels::talking_heads_forward, talking(forward_keywords()),
       "attention_forward with talking heads (ForwardOperands' fields, pre and post included)");
  bind(module, "attention_backward", &kernels::attention_backward, backward_keywords(),
       "The gradients of attention_forward's inputs (keyword arguments: BackwardOperands' fields)");
  bind(module, "talking_heads_backward", &kernels::talking_heads_backward,
       talking(backward_keywords()).with(talking_backward),
       "The gradients of talking_heads_forward's inputs (BackwardOperands' fields, the mixes' included)");
}
