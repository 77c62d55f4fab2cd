// The score pass of global-local attention in one sweep over each row (CPU, float32).
//
// Eager PyTorch makes five passes over a score tensor of 25M floats at 4096 tokens (write the
// gathered relative terms, add them, add the carried scores, add the mask into the weights'
// buffer, softmax), each a round trip through memory. Here each row is read once into a
// thread-local buffer and written twice: the summed scores (carried to the next layer under
// residual attention) and the attention weights.
//
//   summed[r, c] = scores[r, c] + relative[r, ids[r', c]] + carried[r, c]
//   probs[r, c]  = softmax_c(scale * summed[r, c] + mask_bias[r', c])
//
// scores, carried, summed_out, probs_out: [B, h, M, N]; relative: [B, h, M, R]; ids, mask_bias:
// [B, M, N], the same for every head (r' is r without its head). relative and ids, carried,
// summed_out and probs_out are optional (without probs_out: the sum alone). Every row is read
// whole before it is written, so probs_out may be the scores' or the carried tensor, and
// summed_out the scores' (in place).
#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace {

// exp(x) as pure arithmetic (Cephes' expf: Cody-Waite range reduction, degree-6 polynomial,
// relative error below 2e-7), so that the compiler vectorises the loops that call it; 0 below
// -87 (where float's exp underflows), which is where masked keys land.
inline float exp_approx(float x) {
  const float low = x < -87.0f ? -87.0f : x;  // (comparisons, not fmin/fmax, which must honour NaN and do not vectorise)
  const float clamped = low > 88.0f ? 88.0f : low;
  const float n = std::floor(clamped * 1.44269504088896341f + 0.5f);
  float r = clamped - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float power;
  std::memcpy(&power, &bits, sizeof(power));
  return x < -87.0f ? 0.0f : p * power;
}

// One row: summed = s + table[id] + carry (the terms present; stored unless summed is null), then
// probs = softmax(factor * summed + mask). A template per combination of terms, so that the first
// loop has no branches: it reads the row's inputs once, and the other two work in x (in L1).
// Restrict-qualified and outside the parallel loop's closure, so that every loop vectorises;
// summed and probs may alias s or carry (each row is read before it is written).
template <bool kRelative, bool kCarry, bool kSummed, bool kSoftmax>
void one_row(const float* s, const float* __restrict table, const int32_t* __restrict id, const float* carry,
             const float* __restrict mask, const float factor, const int64_t width, float* __restrict x,
             float* summed, float* probs) {
  if (!kSoftmax) {  // the sum alone (talking heads mix the heads before their softmax)
    for (int64_t c = 0; c < width; ++c) {
      float value = s[c];
      if (kRelative) value += table[id[c]];
      if (kCarry) value += carry[c];
      summed[c] = value;
    }
    return;
  }
  float largest = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : largest)
  for (int64_t c = 0; c < width; ++c) {
    float value = s[c];
    if (kRelative) value += table[id[c]];
    if (kCarry) value += carry[c];
    if (kSummed) summed[c] = value;
    value = factor * value + mask[c];
    x[c] = value;
    largest = value > largest ? value : largest;
  }
  float total = 0.0f;
#pragma omp simd reduction(+ : total)
  for (int64_t c = 0; c < width; ++c) {
    x[c] = exp_approx(x[c] - largest);
    total += x[c];
  }
  const float inverse = 1.0f / total;
#pragma omp simd
  for (int64_t c = 0; c < width; ++c) probs[c] = x[c] * inverse;
}

using RowFunction = void (*)(const float*, const float*, const int32_t*, const float*, const float*, float,
                             int64_t, float*, float*, float*);

template <bool kRelative, bool kCarry, bool kSummed>
RowFunction with_softmax(bool softmax) {
  return softmax ? one_row<kRelative, kCarry, kSummed, true> : one_row<kRelative, kCarry, kSummed, false>;
}

template <bool kRelative, bool kCarry>
RowFunction with_summed(bool summed, bool softmax) {
  return summed ? with_softmax<kRelative, kCarry, true>(softmax) : with_softmax<kRelative, kCarry, false>(softmax);
}

template <bool kRelative>
RowFunction with_carry(bool carry, bool summed, bool softmax) {
  return carry ? with_summed<kRelative, true>(summed, softmax) : with_summed<kRelative, false>(summed, softmax);
}

RowFunction row_function(bool relative, bool carry, bool summed, bool softmax) {
  return relative ? with_carry<true>(carry, summed, softmax) : with_carry<false>(carry, summed, softmax);
}

const float* data_or_null(const c10::optional<at::Tensor>& tensor) {
  return tensor.has_value() ? tensor->data_ptr<float>() : nullptr;
}

void check(const at::Tensor& tensor, const char* name, at::ScalarType dtype, int64_t dims) {
  TORCH_CHECK(tensor.device().is_cpu(), name, " must be on the CPU");
  TORCH_CHECK(tensor.scalar_type() == dtype, name, " has the wrong dtype");
  TORCH_CHECK(tensor.dim() == dims, name, " must have ", dims, " dimensions");
  TORCH_CHECK(tensor.is_contiguous(), name, " must be contiguous");
}

}  // namespace

void scores_softmax(const at::Tensor& scores, const c10::optional<at::Tensor>& relative,
                    const c10::optional<at::Tensor>& ids, const c10::optional<at::Tensor>& carried,
                    const at::Tensor& mask_bias, double scale, const c10::optional<at::Tensor>& summed_out,
                    const c10::optional<at::Tensor>& probs_out) {
  check(scores, "scores", at::kFloat, 4);
  const int64_t batch = scores.size(0), heads = scores.size(1), rows = scores.size(2), width = scores.size(3);
  check(mask_bias, "mask_bias", at::kFloat, 3);
  TORCH_CHECK(mask_bias.sizes() == at::IntArrayRef({batch, rows, width}), "mask_bias must be [B, M, N]");
  TORCH_CHECK(probs_out.has_value() || summed_out.has_value(), "nothing to write: no summed_out, no probs_out");
  for (const auto* optional : {&carried, &summed_out, &probs_out}) {
    if (optional->has_value()) {
      check(**optional, "carried/summed_out/probs_out", at::kFloat, 4);
      TORCH_CHECK((*optional)->sizes() == scores.sizes(), "carried, summed_out and probs_out must have the scores' shape");
    }
  }
  TORCH_CHECK(relative.has_value() == ids.has_value(), "relative and ids come together");
  int64_t vocab = 0;
  if (relative.has_value()) {
    check(*relative, "relative", at::kFloat, 4);
    check(*ids, "ids", at::kLong, 3);
    vocab = relative->size(3);
    TORCH_CHECK(relative->sizes().slice(0, 3) == scores.sizes().slice(0, 3), "relative must be [B, h, M, R]");
    TORCH_CHECK(ids->sizes() == mask_bias.sizes(), "ids must be [B, M, N]");
  }

  const float* scores_data = scores.data_ptr<float>();
  const float* relative_data = data_or_null(relative);
  const int64_t* ids_data = ids.has_value() ? ids->data_ptr<int64_t>() : nullptr;
  const float* carried_data = data_or_null(carried);
  const float* mask_data = mask_bias.data_ptr<float>();
  float* summed_data = summed_out.has_value() ? summed_out->data_ptr<float>() : nullptr;
  float* probs_data = probs_out.has_value() ? probs_out->data_ptr<float>() : nullptr;
  const float factor = static_cast<float>(scale);

  const RowFunction process = row_function(relative_data != nullptr, carried_data != nullptr, summed_data != nullptr,
                                             probs_data != nullptr);
  // Rows of one (batch, query) outside, heads inside: the ids and mask row stay in cache for all heads.
  at::parallel_for(0, batch * rows, 16, [&](int64_t begin, int64_t end) {
    std::vector<float> buffer(width);
    std::vector<int32_t> id_buffer(ids_data ? width : 0);
    float* x = buffer.data();
    int32_t* id = id_buffer.data();
    for (int64_t shared_row = begin; shared_row < end; ++shared_row) {
      const int64_t b = shared_row / rows, m = shared_row % rows;
      const float* mask = mask_data + shared_row * width;
      // 32-bit ids, once for all heads: the compiler vectorises a gather with them, not with 64-bit ones.
      if (ids_data) {
        const int64_t* wide = ids_data + shared_row * width;
        for (int64_t c = 0; c < width; ++c) id[c] = static_cast<int32_t>(wide[c]);
      }
      for (int64_t head = 0; head < heads; ++head) {
        const int64_t row = (b * heads + head) * rows + m;
        const int64_t offset = row * width;
        process(scores_data + offset, relative_data ? relative_data + row * vocab : nullptr,
                ids_data ? id : nullptr, carried_data ? carried_data + offset : nullptr, mask, factor, width, x,
                summed_data ? summed_data + offset : nullptr, probs_data ? probs_data + offset : nullptr);
      }
    }
  });
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  module.def("scores_softmax", &scores_softmax, "Summed attention scores and their masked softmax in one pass");
}
