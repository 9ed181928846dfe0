// Attention over each packed text alone (hfserve::text_attention).
//
// A packed row holds several texts; SDPA's CPU kernel scores every query of the row against every
// key and the block-diagonal mask then throws most of the scores away. This operator finds each
// text's span from the row's segment ids and scores its queries against its own keys only, in
// float32 register blocks (bfloat16 ones in text_attention_bf16.cpp), for every (text, head) pair on
// torch's intra-op threads. Texts longer
// than `dense_from` tokens go to SDPA on their own slice, where its kernels run at their rate.
//
// query (rows, heads, T, D), key and value (rows, kv_heads, T, D), any strides; segments (rows, T),
// 0 marking padding (its outputs are zero). Returns (rows, T, heads, D), contiguous, the layout the
// attention's output projection reads. The reference it is tested against is
// handlers/engine/text_attention.py's `reference`.
#include "text_attention.h"

#include <ATen/Parallel.h>
#include <ATen/Dispatch.h>
#include <ATen/ops/scaled_dot_product_attention.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <vector>

namespace hfserve_text_attention {
namespace {

std::vector<Span> spans_of(const at::Tensor& segments) {
  const auto ids = segments.to(at::kLong).contiguous();
  const int64_t rows = ids.size(0), tokens = ids.size(1);
  const int64_t* data = ids.data_ptr<int64_t>();
  std::vector<Span> spans;
  for (int64_t b = 0; b < rows; ++b) {
    const int64_t* row = data + b * tokens;
    for (int64_t t = 0; t < tokens;) {
      int64_t end = t + 1;
      while (end < tokens && row[end] == row[t]) ++end;
      if (row[t] > 0) spans.push_back({b, t, end - t});
      t = end;
    }
  }
  return spans;
}

// acc[r] += a[r * a_row + k] * b[k * b_row : +KEY_BLOCK] for k < depth: both of a text's products
// in float32, QUERY_BLOCK rows of `a` broadcast against one vector of `b`.
void product(const float* a, int64_t a_row, const float* b, int64_t b_row, int64_t depth, Vec (&acc)[QUERY_BLOCK]) {
  for (auto& sum : acc) sum = Vec(0.f);
  for (int64_t k = 0; k < depth; ++k) {
    const Vec column = Vec::loadu(b + k * b_row);
#pragma GCC unroll 8
    for (int64_t r = 0; r < QUERY_BLOCK; ++r) acc[r] = at::vec::fmadd(Vec(a[r * a_row + k]), column, acc[r]);
  }
}

// scores[i][j] = query[i] . keys_t[:, j] for `rows` queries (a multiple of QUERY_BLOCK).
void score(const float* query, int64_t rows, int64_t dim, const float* keys_t, int64_t keys, float* scores) {
  for (int64_t i = 0; i < rows; i += QUERY_BLOCK) {
    for (int64_t j = 0; j < keys; j += KEY_BLOCK) {
      Vec acc[QUERY_BLOCK];
      product(query + i * dim, dim, keys_t + j, keys, dim, acc);
      for (int64_t r = 0; r < QUERY_BLOCK; ++r) acc[r].store(scores + (i + r) * keys + j);
    }
  }
}

// Each score row in place: softmax over its first `visible` keys, zeros after.
void softmax_rows(float* scores, int64_t rows, int64_t keys, int64_t first_query, int64_t length, bool causal) {
  for (int64_t i = 0; i < rows; ++i) {
    float* row = scores + i * keys;
    const int64_t visible = causal ? std::min(first_query + i + 1, length) : length;
    std::fill(row + visible, row + keys, -std::numeric_limits<float>::infinity());
    Vec top(-std::numeric_limits<float>::infinity());
    for (int64_t j = 0; j < keys; j += KEY_BLOCK) top = at::vec::maximum(top, Vec::loadu(row + j));
    const Vec highest(at::vec::vec_reduce_all<float>([](Vec& a, Vec& b) { return at::vec::maximum(a, b); }, top));
    Vec total(0.f);
    for (int64_t j = 0; j < keys; j += KEY_BLOCK) {
      const Vec e = (Vec::loadu(row + j) - highest).exp_u20();
      e.store(row + j);
      total = total + e;
    }
    const Vec inverse(1.f / at::vec::vec_reduce_all<float>([](Vec& a, Vec& b) { return a + b; }, total));
    for (int64_t j = 0; j < keys; j += KEY_BLOCK) (Vec::loadu(row + j) * inverse).store(row + j);
  }
}

// out rows [i, i + QUERY_BLOCK) = scores rows . values, written as scalar_t where they are real tokens.
template <typename scalar_t>
void weigh_values(const float* scores, int64_t keys, int64_t length, const float* values, int64_t dim,
                  int64_t dim_padded, int64_t i, int64_t real_rows, scalar_t* const* dst) {
  for (int64_t d0 = 0; d0 < dim_padded; d0 += KEY_BLOCK) {
    Vec acc[QUERY_BLOCK];
    product(scores + i * keys, keys, values + d0, dim_padded, length, acc);
    float lanes[KEY_BLOCK];
    for (int64_t r = 0; r < real_rows; ++r) {
      acc[r].store(lanes);
      for (int64_t c = 0; c < KEY_BLOCK && d0 + c < dim; ++c) dst[r][d0 + c] = static_cast<scalar_t>(lanes[c]);
    }
  }
}

template <typename scalar_t>
void attend_text(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const Span& span, int64_t head,
                 int64_t kv_head, float scale, bool causal, Scratch& s, scalar_t* out, int64_t heads) {
  const int64_t dim = s.dim, length = span.length, keys = round_up(length, KEY_BLOCK);
  const auto* qp = q.data_ptr<scalar_t>() + span.row * q.stride(0) + head * q.stride(1) + span.start * q.stride(2);
  const auto* kp = k.data_ptr<scalar_t>() + span.row * k.stride(0) + kv_head * k.stride(1) + span.start * k.stride(2);
  const auto* vp = v.data_ptr<scalar_t>() + span.row * v.stride(0) + kv_head * v.stride(1) + span.start * v.stride(2);
  std::fill(s.query.begin() + length * dim, s.query.begin() + round_up(length, QUERY_BLOCK) * dim, 0.f);
  const int64_t qt = q.stride(2), qd = q.stride(3), kt = k.stride(2), kd = k.stride(3), vt = v.stride(2),
                vd = v.stride(3);
  float* query = s.query.data();
  float* keys_t = s.keys_t.data();
  float* values = s.values.data();
  for (int64_t t = 0; t < length; ++t)
    for (int64_t d = 0; d < dim; ++d) {
      query[t * dim + d] = static_cast<float>(qp[t * qt + d * qd]) * scale;
      keys_t[d * keys + t] = static_cast<float>(kp[t * kt + d * kd]);
      values[t * s.dim_padded + d] = static_cast<float>(vp[t * vt + d * vd]);
    }
  const int64_t tokens = q.size(2);
  for (int64_t first = 0; first < length; first += QUERY_TILE) {
    const int64_t rows = std::min(QUERY_TILE, round_up(length - first, QUERY_BLOCK));
    score(s.query.data() + first * dim, rows, dim, s.keys_t.data(), keys, s.scores.data());
    softmax_rows(s.scores.data(), rows, keys, first, length, causal);
    for (int64_t i = 0; i < rows; i += QUERY_BLOCK) {
      const int64_t real_rows = std::min(QUERY_BLOCK, length - first - i);
      scalar_t* dst[QUERY_BLOCK];
      for (int64_t r = 0; r < real_rows; ++r)
        dst[r] = out + ((span.row * tokens + span.start + first + i + r) * heads + head) * dim;
      weigh_values<scalar_t>(s.scores.data(), keys, length, s.values.data(), dim, s.dim_padded, i, real_rows, dst);
    }
  }
}

// The long texts: SDPA over each one's own slice.
void attend_dense(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const Span& span, double scale,
                  bool causal, at::Tensor& out) {
  auto slice = [&](const at::Tensor& x) { return x.narrow(0, span.row, 1).narrow(2, span.start, span.length); };
  const bool grouped = q.size(1) != k.size(1);
  auto attended = at::scaled_dot_product_attention(slice(q), slice(k), slice(v), {}, 0.0, causal, scale, grouped);
  out.narrow(0, span.row, 1).narrow(1, span.start, span.length).copy_(attended.transpose(1, 2));
}

at::Tensor text_attention(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                          const at::Tensor& segments, double scale, bool causal, int64_t dense_from) {
  TORCH_CHECK(query.dim() == 4 && key.dim() == 4 && value.dim() == 4, "text_attention: 4-D query, key, value");
  TORCH_CHECK(segments.dim() == 2 && segments.size(0) == query.size(0) && segments.size(1) == query.size(2),
              "text_attention: segments must be (rows, tokens) of the query");
  TORCH_CHECK(query.size(1) % key.size(1) == 0, "text_attention: heads must be a multiple of kv heads");
  const int64_t heads = query.size(1), group = heads / key.size(1), dim = query.size(3);
  auto out = at::zeros({query.size(0), query.size(2), heads, dim}, query.options());
  std::vector<Span> short_spans;
  for (const Span& span : spans_of(segments)) {
    if (span.length > dense_from) {
      attend_dense(query, key, value, span, scale, causal, out);
    } else {
      short_spans.push_back(span);
    }
  }
  if (short_spans.empty()) return out;
  // The longest first, pulled from one counter: threads stay busy to the end.
  std::sort(short_spans.begin(), short_spans.end(), [](const Span& a, const Span& b) { return a.length > b.length; });
  const int64_t longest = short_spans.front().length, items = static_cast<int64_t>(short_spans.size()) * heads;
  std::atomic<int64_t> next{0};
  if (attend_texts_bf16(query, key, value, short_spans, static_cast<float>(scale), causal, out)) return out;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, query.scalar_type(), "text_attention", [&] {
    scalar_t* out_data = out.data_ptr<scalar_t>();
    at::parallel_for(0, at::get_num_threads(), 1, [&](int64_t, int64_t) {
      Scratch scratch(longest, dim);
      for (int64_t item = next++; item < items; item = next++) {
        const Span& span = short_spans[item / heads];
        const int64_t head = item % heads;
        attend_text<scalar_t>(query, key, value, span, head, head / group, static_cast<float>(scale), causal,
                              scratch, out_data, heads);
      }
    });
  });
  return out;
}

}  // namespace
}  // namespace hfserve_text_attention

TORCH_LIBRARY(hfserve, m) {
  m.def("text_attention(Tensor query, Tensor key, Tensor value, Tensor segments, float scale, bool causal, "
        "int dense_from) -> Tensor");
}

TORCH_LIBRARY_IMPL(hfserve, CPU, m) { m.impl("text_attention", &hfserve_text_attention::text_attention); }
