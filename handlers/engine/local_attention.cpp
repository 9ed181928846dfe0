// Sliding-window attention at the cost of its window (hfserve::local_attention).
//
// transformers runs a sliding-window layer (ModernBERT's local layers, Gemma 3's sliding ones) as
// full attention under a banded mask, scoring T x T pairs to keep about T x window of them. This
// operator cuts the queries into blocks and hands SDPA each block with only the keys within
// `window` of it and the matching part of the mask: the same answer wherever the mask allows
// nothing farther than `window` (every sliding mask transformers makes), at the window's cost. A
// text no longer than a block is one SDPA call, as before.
//
// query (rows, heads, T, D), key and value (rows, kv_heads, T, D), any strides; mask (rows, 1 or
// heads, T, T), boolean or additive, or none (transformers gives none only where the window reaches
// every key: all pairs attend). Returns (rows, T, heads, D), contiguous, the layout
// the attention's output projection reads. The reference it is tested against is
// handlers/engine/local_attention.py's `banded`.
#include <ATen/ops/empty.h>
#include <ATen/ops/scaled_dot_product_attention.h>
#include <torch/library.h>

#include <algorithm>
#include <optional>

namespace hfserve_local_attention {
namespace {

constexpr int64_t kBlock = 64;  // queries per SDPA call: each reaches kBlock + 2 x window keys

at::Tensor local_attention(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                           const std::optional<at::Tensor>& mask, int64_t window, double scale) {
  const int64_t rows = query.size(0), heads = query.size(1), tokens = query.size(2), dim = query.size(3);
  const bool grouped = key.size(1) != heads;
  auto out = at::empty({rows, tokens, heads, dim}, query.options());
  for (int64_t start = 0; start < tokens; start += kBlock) {
    const int64_t end = std::min(tokens, start + kBlock);
    const int64_t from = std::max<int64_t>(0, start - window), to = std::min(tokens, end + window);
    std::optional<at::Tensor> allowed;
    if (mask.has_value()) allowed = mask->narrow(2, start, end - start).narrow(3, from, to - from);
    const auto attended = at::scaled_dot_product_attention(
        query.narrow(2, start, end - start), key.narrow(2, from, to - from), value.narrow(2, from, to - from),
        allowed, 0.0, false, scale, grouped);
    out.narrow(1, start, end - start).copy_(attended.transpose(1, 2));
  }
  return out;
}

}  // namespace
}  // namespace hfserve_local_attention

TORCH_LIBRARY_FRAGMENT(hfserve, m) {
  m.def("local_attention(Tensor query, Tensor key, Tensor value, Tensor? mask, int window, float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(hfserve, CPU, m) { m.impl("local_attention", &hfserve_local_attention::local_attention); }
