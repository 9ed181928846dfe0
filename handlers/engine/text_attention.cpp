// Attention over each packed text alone (hfserve::text_attention).
//
// A packed row holds several texts; SDPA's CPU kernel scores every query of the row against every
// key and the block-diagonal mask then throws most of the scores away. This operator finds each
// text's span from the row's segment ids and scores its queries against its own keys only, in
// float32 register blocks, for every (text, head) pair on torch's intra-op threads. Texts longer
// than `dense_from` tokens go to SDPA on their own slice, where its kernels run at their rate.
//
// query (rows, heads, T, D), key and value (rows, kv_heads, T, D), any strides; segments (rows, T),
// 0 marking padding (its outputs are zero). Returns (rows, T, heads, D), contiguous, the layout the
// attention's output projection reads. The reference it is tested against is
// handlers/engine/text_attention.py's `reference`.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <immintrin.h>
#include <cmath>
#include <limits>
#include <vector>

namespace {

using Vec = at::vec::Vectorized<float>;
constexpr int64_t KEY_BLOCK = Vec::size();  // keys (or output columns) per vector
constexpr int64_t QUERY_BLOCK = 8;          // queries per register block: 8 independent sums
constexpr int64_t QUERY_TILE = 64;          // queries whose scores are held at once

struct Span {
  int64_t row, start, length;
};

int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

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

// Scratch of one thread, sized for the longest short text.
struct Scratch {
  int64_t dim, dim_padded, keys_padded;
  std::vector<float> query, keys_t, values, scores;
  std::vector<uint16_t> key_pairs, value_pairs, probs, zeros;  // bfloat16 bits, for the AVX512-BF16 kernel
  Scratch(int64_t longest, int64_t dim)
      : dim(dim), dim_padded(round_up(dim, KEY_BLOCK)), keys_padded(round_up(longest, KEY_BLOCK)),
        query(round_up(longest, QUERY_BLOCK) * dim), keys_t(dim * keys_padded),
        values(keys_padded * dim_padded), scores(QUERY_TILE * keys_padded), key_pairs(dim * keys_padded),
        value_pairs(keys_padded * dim_padded), probs(QUERY_TILE * keys_padded), zeros(dim) {}
};

// scores[i][j] = query[i] . keys_t[:, j] for `rows` queries (a multiple of QUERY_BLOCK).
void score(const float* query, int64_t rows, int64_t dim, const float* keys_t, int64_t keys, float* scores) {
  for (int64_t i = 0; i < rows; i += QUERY_BLOCK) {
    for (int64_t j = 0; j < keys; j += KEY_BLOCK) {
      Vec acc[QUERY_BLOCK];
      for (auto& sum : acc) sum = Vec(0.f);
      for (int64_t d = 0; d < dim; ++d) {
        const Vec key = Vec::loadu(keys_t + d * keys + j);
#pragma GCC unroll 8
        for (int64_t r = 0; r < QUERY_BLOCK; ++r) acc[r] = at::vec::fmadd(Vec(query[(i + r) * dim + d]), key, acc[r]);
      }
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
    for (auto& sum : acc) sum = Vec(0.f);
    for (int64_t j = 0; j < length; ++j) {
      const Vec value = Vec::loadu(values + j * dim_padded + d0);
#pragma GCC unroll 8
      for (int64_t r = 0; r < QUERY_BLOCK; ++r) acc[r] = at::vec::fmadd(Vec(scores[(i + r) * keys + j]), value, acc[r]);
    }
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

#if defined(__AVX512BF16__)
// The same over bfloat16 inputs with AVX512-BF16's pair dot products: query and key pairs along the
// head dim for the scores, probability and value pairs along the keys for the output; the softmax
// in float32 between them, its probabilities rounded to bfloat16 as SDPA's CPU kernel rounds them.
inline __m512bh pair(const uint16_t* at) {
  int32_t bits;
  std::memcpy(&bits, at, sizeof bits);
  return (__m512bh)_mm512_set1_epi32(bits);
}

// Key pairs: each key's (d, d + 1) values are one 32-bit word, laid out word by word across the
// keys. Value pairs: keys t and t + 1 interleaved, value by value.
void pack_pairs(const uint16_t* k, int64_t kt, const uint16_t* v, int64_t vt, int64_t length, Scratch& s) {
  const int64_t words = s.dim / 2, keys = round_up(length, KEY_BLOCK), dp = s.dim_padded;
  auto* key_words = reinterpret_cast<uint32_t*>(s.key_pairs.data());
  std::fill(key_words, key_words + words * keys, 0u);
  for (int64_t t = 0; t < length; ++t) {
    const auto* row = reinterpret_cast<const uint32_t*>(k + t * kt);
    for (int64_t w = 0; w < words; ++w) key_words[w * keys + t] = row[w];
  }
  std::fill(s.value_pairs.begin(), s.value_pairs.begin() + round_up(length, 2) * dp, 0);
  if (s.dim % 32 != 0) {
    for (int64_t t = 0; t < length; ++t)
      for (int64_t d = 0; d < s.dim; ++d) s.value_pairs[(t >> 1) * dp * 2 + d * 2 + (t & 1)] = v[t * vt + d];
    return;
  }
  // 32 values of two keys at a time: (a0, b0, a1, b1, ...) from rows a and b.
  alignas(64) static const uint16_t low[32] = {0, 32, 1, 33, 2, 34, 3, 35, 4, 36, 5, 37, 6, 38, 7, 39,
                                               8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
  const __m512i to_low = _mm512_load_si512(low), to_high = _mm512_add_epi16(to_low, _mm512_set1_epi16(16));
  for (int64_t t = 0; t < length; t += 2) {
    uint16_t* dst = s.value_pairs.data() + (t >> 1) * dp * 2;
    for (int64_t d = 0; d < s.dim; d += 32) {
      const __m512i a = _mm512_loadu_si512(v + t * vt + d);
      const __m512i b = t + 1 < length ? _mm512_loadu_si512(v + (t + 1) * vt + d) : _mm512_setzero_si512();
      _mm512_storeu_si512(dst + d * 2, _mm512_permutex2var_epi16(a, to_low, b));
      _mm512_storeu_si512(dst + d * 2 + 32, _mm512_permutex2var_epi16(a, to_high, b));
    }
  }
}

// Each score row's softmax numerators as bfloat16 pairs, and 1 / its sum (applied to its output).
void softmax_pairs(float* scores, int64_t rows, int64_t keys, int64_t first_query, int64_t length, bool causal,
                   uint16_t* probs, float* inverse) {
  for (int64_t i = 0; i < rows; ++i) {
    float* row = scores + i * keys;
    const int64_t visible = causal ? std::min(first_query + i + 1, length) : length;
    const __m512 hidden = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    auto load = [&](int64_t j) {  // the keys past `visible` read as -inf
      const int64_t seen = std::clamp<int64_t>(visible - j, 0, KEY_BLOCK);
      return _mm512_mask_loadu_ps(hidden, static_cast<__mmask16>((1u << seen) - 1), row + j);
    };
    __m512 top = hidden;
    for (int64_t j = 0; j < keys; j += KEY_BLOCK) top = _mm512_max_ps(top, load(j));
    const Vec highest(_mm512_reduce_max_ps(top));
    Vec total(0.f);
    for (int64_t j = 0; j < keys; j += KEY_BLOCK) {
      const Vec e = (Vec(load(j)) - highest).exp_u20();
      total = total + e;
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(probs + i * keys + j), (__m256i)_mm512_cvtneps_pbh(e));
    }
    inverse[i] = 1.f / _mm512_reduce_add_ps(total);
  }
}

// QUERY_BLOCK queries against `lanes` vectors of keys from key j: two vectors share each query pair's
// broadcast (the loads, not the dot products, bound one vector's loop).
template <int lanes>
void score_block(const uint16_t* const* query, int64_t dim, const uint16_t* key_pairs, int64_t keys, int64_t j,
                 float scale, float* scores) {
  __m512 acc[QUERY_BLOCK][lanes];
  for (auto& row : acc)
    for (auto& sum : row) sum = _mm512_setzero_ps();
  for (int64_t d = 0; d < dim; d += 2) {
    __m512bh key[lanes];
    for (int l = 0; l < lanes; ++l)
      key[l] = (__m512bh)_mm512_loadu_si512(key_pairs + (d >> 1) * keys * 2 + (j + l * KEY_BLOCK) * 2);
#pragma GCC unroll 8
    for (int64_t r = 0; r < QUERY_BLOCK; ++r) {
      const __m512bh q = pair(query[r] + d);
      for (int l = 0; l < lanes; ++l) acc[r][l] = _mm512_dpbf16_ps(acc[r][l], q, key[l]);
    }
  }
  for (int64_t r = 0; r < QUERY_BLOCK; ++r)
    for (int l = 0; l < lanes; ++l)
      _mm512_storeu_ps(scores + r * keys + j + l * KEY_BLOCK, _mm512_mul_ps(acc[r][l], _mm512_set1_ps(scale)));
}

void score_pairs(const uint16_t* const* query, int64_t dim, const uint16_t* key_pairs, int64_t keys, float scale,
                 float* scores) {
  int64_t j = 0;
  for (; j + 2 * KEY_BLOCK <= keys; j += 2 * KEY_BLOCK) score_block<2>(query, dim, key_pairs, keys, j, scale, scores);
  if (j < keys) score_block<1>(query, dim, key_pairs, keys, j, scale, scores);
}

// Output columns [d0, d0 + lanes * 16) of QUERY_BLOCK rows: probability pairs times value pairs.
template <int lanes>
void weigh_block(const uint16_t* probs, const float* inverse, int64_t keys, int64_t length,
                 const uint16_t* value_pairs, int64_t dim, int64_t dp, int64_t d0, int64_t real_rows,
                 at::BFloat16* const* dst) {
  __m512 acc[QUERY_BLOCK][lanes];
  for (auto& row : acc)
    for (auto& sum : row) sum = _mm512_setzero_ps();
  for (int64_t j = 0; j < length; j += 2) {
    __m512bh value[lanes];
    for (int l = 0; l < lanes; ++l)
      value[l] = (__m512bh)_mm512_loadu_si512(value_pairs + (j >> 1) * dp * 2 + (d0 + l * KEY_BLOCK) * 2);
#pragma GCC unroll 8
    for (int64_t r = 0; r < QUERY_BLOCK; ++r) {
      const __m512bh p = pair(probs + r * keys + j);
      for (int l = 0; l < lanes; ++l) acc[r][l] = _mm512_dpbf16_ps(acc[r][l], p, value[l]);
    }
  }
  for (int64_t r = 0; r < real_rows; ++r) {
    for (int l = 0; l < lanes; ++l) {
      const int64_t first = d0 + l * KEY_BLOCK, kept = std::clamp<int64_t>(dim - first, 0, KEY_BLOCK);
      const __m512 scaled = _mm512_mul_ps(acc[r][l], _mm512_set1_ps(inverse[r]));
      _mm256_mask_storeu_epi16(dst[r] + first, static_cast<__mmask16>((1u << kept) - 1),
                               (__m256i)_mm512_cvtneps_pbh(scaled));
    }
  }
}

void weigh_pairs(const uint16_t* probs, const float* inverse, int64_t keys, int64_t length, const uint16_t* value_pairs,
                 int64_t dim, int64_t dp, int64_t real_rows, at::BFloat16* const* dst) {
  int64_t d0 = 0;
  for (; d0 + 2 * KEY_BLOCK <= dp; d0 += 2 * KEY_BLOCK)
    weigh_block<2>(probs, inverse, keys, length, value_pairs, dim, dp, d0, real_rows, dst);
  if (d0 < dp) weigh_block<1>(probs, inverse, keys, length, value_pairs, dim, dp, d0, real_rows, dst);
}

void attend_text_bf16(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const Span& span, int64_t head,
                      int64_t kv_head, float scale, bool causal, Scratch& s, at::BFloat16* out, int64_t heads) {
  auto base = [&](const at::Tensor& x, int64_t h) {
    return reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>()) + span.row * x.stride(0) + h * x.stride(1) +
           span.start * x.stride(2);
  };
  const int64_t dim = s.dim, length = span.length, keys = round_up(length, KEY_BLOCK), tokens = q.size(2);
  const uint16_t* qp = base(q, head);
  pack_pairs(base(k, kv_head), k.stride(2), base(v, kv_head), v.stride(2), length, s);
  for (int64_t first = 0; first < length; first += QUERY_TILE) {
    const int64_t rows = std::min(QUERY_TILE, round_up(length - first, QUERY_BLOCK));
    for (int64_t i = 0; i < rows; i += QUERY_BLOCK) {
      const uint16_t* query[QUERY_BLOCK];
      for (int64_t r = 0; r < QUERY_BLOCK; ++r)
        query[r] = first + i + r < length ? qp + (first + i + r) * q.stride(2) : s.zeros.data();
      score_pairs(query, dim, s.key_pairs.data(), keys, scale, s.scores.data() + i * keys);
    }
    float inverse[QUERY_TILE];
    softmax_pairs(s.scores.data(), rows, keys, first, length, causal, s.probs.data(), inverse);
    for (int64_t i = 0; i < rows; i += QUERY_BLOCK) {
      const int64_t real_rows = std::min(QUERY_BLOCK, length - first - i);
      at::BFloat16* dst[QUERY_BLOCK];
      for (int64_t r = 0; r < real_rows; ++r)
        dst[r] = out + ((span.row * tokens + span.start + first + i + r) * heads + head) * dim;
      weigh_pairs(s.probs.data() + i * keys, inverse + i, keys, length, s.value_pairs.data(), dim, s.dim_padded,
                  real_rows, dst);
    }
  }
}
#endif

// Whether the pair kernel takes these inputs: bfloat16, an even head dim, each head's values contiguous.
bool takes_pairs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
#if defined(__AVX512BF16__)
  return q.scalar_type() == at::kBFloat16 && q.size(3) % 2 == 0 && q.stride(3) == 1 && k.stride(3) == 1 &&
         v.stride(3) == 1;
#else
  return false;
#endif
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
#if defined(__AVX512BF16__)
  if (takes_pairs(query, key, value)) {
    at::BFloat16* out_data = out.data_ptr<at::BFloat16>();
    at::parallel_for(0, at::get_num_threads(), 1, [&](int64_t, int64_t) {
      Scratch scratch(longest, dim);
      for (int64_t item = next++; item < items; item = next++) {
        const int64_t head = item % heads;
        attend_text_bf16(query, key, value, short_spans[item / heads], head, head / group, static_cast<float>(scale),
                         causal, scratch, out_data, heads);
      }
    });
    return out;
  }
#endif
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

TORCH_LIBRARY(hfserve, m) {
  m.def("text_attention(Tensor query, Tensor key, Tensor value, Tensor segments, float scale, bool causal, "
        "int dense_from) -> Tensor");
}

TORCH_LIBRARY_IMPL(hfserve, CPU, m) { m.impl("text_attention", &text_attention); }
