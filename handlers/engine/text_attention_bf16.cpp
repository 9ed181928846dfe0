// The bfloat16 kernels of hfserve::text_attention (text_attention.cpp holds the operator).
//
// With AVX512-BF16, pair dot products: query and key pairs along the head dim for the scores,
// probability and value pairs along the keys for the output, the softmax in float32 between them
// and its probabilities rounded to bfloat16 as SDPA's CPU kernel rounds them. With AMX, the two
// products on tiles, in the same layouts.
#include "text_attention.h"

#include <ATen/Parallel.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <limits>

namespace hfserve_text_attention {

#if defined(__AVX512BF16__)
namespace {

// Two adjacent bfloat16 values, broadcast to every 32-bit lane (the left operand of a pair product).
inline __m512bh pair(const uint16_t* at) {
  int32_t bits;
  std::memcpy(&bits, at, sizeof bits);
  return (__m512bh)_mm512_set1_epi32(bits);
}

// Key pairs: each key's (d, d + 1) values are one 32-bit word, laid out word by word across the
// keys. Value pairs: keys t and t + 1 interleaved, value by value.
void pack_pairs(const uint16_t* k, int64_t kt, const uint16_t* v, int64_t vt, int64_t length, int64_t keys, Scratch& s) {
  const int64_t words = s.dim / 2, dp = s.dim_padded;
  auto* key_words = reinterpret_cast<uint32_t*>(s.key_pairs.data());
  std::fill(key_words, key_words + words * keys, 0u);
  for (int64_t t = 0; t < length; ++t) {
    const auto* row = reinterpret_cast<const uint32_t*>(k + t * kt);
    for (int64_t w = 0; w < words; ++w) key_words[w * keys + t] = row[w];
  }
  std::fill(s.value_pairs.begin(), s.value_pairs.begin() + keys * dp, 0);  // padded keys: 0 (their weights are 0)
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
                   float scale, uint16_t* probs, float* inverse) {
  for (int64_t i = 0; i < rows; ++i) {
    float* row = scores + i * keys;
    const int64_t visible = causal ? std::min(first_query + i + 1, length) : length;
    const __m512 hidden = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    auto load = [&](int64_t j) {  // the keys past `visible` read as -inf
      const int64_t seen = std::clamp<int64_t>(visible - j, 0, KEY_BLOCK);
      const __m512 scaled = _mm512_mul_ps(_mm512_loadu_ps(row + j), _mm512_set1_ps(scale));
      return _mm512_mask_blend_ps(static_cast<__mmask16>((1u << seen) - 1), hidden, scaled);
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

// acc[r][l] += rows[r][k, k + 1] . columns' pair row k / 2, vector l, for k < depth: the pair dot
// products both of a text's products are made of. `lanes` vectors share each row's broadcast (the
// loads, not the dot products, bound one vector's loop).
template <int lanes>
void pair_product(const uint16_t* const* rows, int64_t depth, const uint16_t* columns, int64_t pair_row,
                  __m512 (&acc)[QUERY_BLOCK][lanes]) {
  for (auto& row : acc)
    for (auto& sum : row) sum = _mm512_setzero_ps();
  for (int64_t k = 0; k < depth; k += 2) {
    __m512bh column[lanes];
    for (int l = 0; l < lanes; ++l)
      column[l] = (__m512bh)_mm512_loadu_si512(columns + (k >> 1) * pair_row + l * KEY_BLOCK * 2);
#pragma GCC unroll 8
    for (int64_t r = 0; r < QUERY_BLOCK; ++r) {
      const __m512bh left = pair(rows[r] + k);
      for (int l = 0; l < lanes; ++l) acc[r][l] = _mm512_dpbf16_ps(acc[r][l], left, column[l]);
    }
  }
}

// QUERY_BLOCK queries' scores against `lanes` vectors of keys from key j.
template <int lanes>
void score_block(const uint16_t* const* query, int64_t dim, const uint16_t* key_pairs, int64_t keys, int64_t j,
                 float* scores) {
  __m512 acc[QUERY_BLOCK][lanes];
  pair_product<lanes>(query, dim, key_pairs + j * 2, keys * 2, acc);
  for (int64_t r = 0; r < QUERY_BLOCK; ++r)
    for (int l = 0; l < lanes; ++l) _mm512_storeu_ps(scores + r * keys + j + l * KEY_BLOCK, acc[r][l]);
}

void score_pairs(const uint16_t* const* query, int64_t dim, const uint16_t* key_pairs, int64_t keys, float* scores) {
  int64_t j = 0;
  for (; j + 2 * KEY_BLOCK <= keys; j += 2 * KEY_BLOCK) score_block<2>(query, dim, key_pairs, keys, j, scores);
  if (j < keys) score_block<1>(query, dim, key_pairs, keys, j, scores);
}

// Output columns [d0, d0 + lanes * 16) of QUERY_BLOCK rows: probability pairs times value pairs.
template <int lanes>
void weigh_block(const uint16_t* probs, const float* inverse, int64_t keys, int64_t length,
                 const uint16_t* value_pairs, int64_t dim, int64_t dp, int64_t d0, int64_t real_rows,
                 at::BFloat16* const* dst) {
  const uint16_t* rows[QUERY_BLOCK];
  for (int64_t r = 0; r < QUERY_BLOCK; ++r) rows[r] = probs + r * keys;
  __m512 acc[QUERY_BLOCK][lanes];
  pair_product<lanes>(rows, length, value_pairs + d0 * 2, dp * 2, acc);
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

#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
// The two products on AMX tiles where the CPU has them: tile 0 accumulates 16 x 16 float32, tile 1
// holds 16 rows of 32 bfloat16 (queries or probabilities), tile 2 the 16 pairs of rows they meet
// (key pairs or value pairs), in the layouts pack_pairs writes.
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t bytes_per_row[16] = {64, 64, 64};
  uint8_t rows[16] = {16, 16, 16};
};

bool tiles_allowed() {  // Linux lends AMX's tile data to a process that asks (torch's oneDNN asks too)
  static const bool allowed = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
  return allowed;
}

// Tile 0 = 16 rows of `left` (`left_row` elements apart) times the pair rows of `right` (`right_row`
// elements apart), over `depth` bfloat16 of each left row.
void tile_product(const uint16_t* left, int64_t left_row, const uint16_t* right, int64_t right_row, int64_t depth) {
  _tile_zero(0);
  for (int64_t k = 0; k < depth; k += TILE_KEYS) {
    _tile_loadd(1, left + k, left_row * 2);
    _tile_loadd(2, right + (k >> 1) * right_row, right_row * 2);
    _tile_dpbf16ps(0, 1, 2);
  }
}

void score_tiles(const uint16_t* query, int64_t rows, int64_t dim, const uint16_t* key_pairs, int64_t keys,
                 float* scores) {
  for (int64_t i = 0; i < rows; i += TILE_ROWS)
    for (int64_t j = 0; j < keys; j += KEY_BLOCK) {
      tile_product(query + i * dim, dim, key_pairs + j * 2, keys * 2, dim);
      _tile_stored(0, scores + i * keys + j, keys * 4);
    }
}

void weigh_tiles(const uint16_t* probs, const float* inverse, int64_t rows, int64_t keys,
                 const uint16_t* value_pairs, int64_t dim, int64_t dp, int64_t real_rows, at::BFloat16* const* dst) {
  alignas(64) float block[TILE_ROWS * KEY_BLOCK];
  for (int64_t i = 0; i < rows; i += TILE_ROWS)
    for (int64_t d0 = 0; d0 < dp; d0 += KEY_BLOCK) {
      tile_product(probs + i * keys, keys, value_pairs + d0 * 2, dp * 2, keys);
      _tile_stored(0, block, KEY_BLOCK * 4);
      const auto kept = static_cast<__mmask16>((1u << std::min<int64_t>(dim - d0, KEY_BLOCK)) - 1);
      for (int64_t r = 0; r < TILE_ROWS && i + r < real_rows; ++r) {
        const __m512 scaled = _mm512_mul_ps(_mm512_load_ps(block + r * KEY_BLOCK), _mm512_set1_ps(inverse[i + r]));
        _mm256_mask_storeu_epi16(dst[i + r] + d0, kept, (__m256i)_mm512_cvtneps_pbh(scaled));
      }
    }
}
#endif

void attend_text_bf16(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const Span& span, int64_t head,
                      int64_t kv_head, float scale, bool causal, bool tiles, Scratch& s, at::BFloat16* out,
                      int64_t heads) {
  auto base = [&](const at::Tensor& x, int64_t h) {
    return reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>()) + span.row * x.stride(0) + h * x.stride(1) +
           span.start * x.stride(2);
  };
  const int64_t dim = s.dim, length = span.length, tokens = q.size(2);
  const int64_t keys = round_up(length, tiles ? TILE_KEYS : KEY_BLOCK);
  const uint16_t* qp = base(q, head);
  pack_pairs(base(k, kv_head), k.stride(2), base(v, kv_head), v.stride(2), length, keys, s);
  if (tiles) {  // the queries as whole tile rows, zeros past the text
    for (int64_t t = 0; t < length; ++t) std::memcpy(s.query_bits.data() + t * dim, qp + t * q.stride(2), dim * 2);
    std::fill(s.query_bits.begin() + length * dim, s.query_bits.begin() + round_up(length, TILE_ROWS) * dim, 0);
  }
  for (int64_t first = 0; first < length; first += QUERY_TILE) {
    const int64_t rows = std::min(QUERY_TILE, round_up(length - first, TILE_ROWS));
    const int64_t real_rows = std::min(rows, length - first);
    at::BFloat16* dst[QUERY_TILE];
    for (int64_t r = 0; r < real_rows; ++r)
      dst[r] = out + ((span.row * tokens + span.start + first + r) * heads + head) * dim;
    float inverse[QUERY_TILE];
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
    if (tiles) {
      score_tiles(s.query_bits.data() + first * dim, rows, dim, s.key_pairs.data(), keys, s.scores.data());
      softmax_pairs(s.scores.data(), real_rows, keys, first, length, causal, scale, s.probs.data(), inverse);
      weigh_tiles(s.probs.data(), inverse, rows, keys, s.value_pairs.data(), dim, s.dim_padded, real_rows, dst);
      continue;
    }
#endif
    for (int64_t i = 0; i < rows; i += QUERY_BLOCK) {
      const uint16_t* query[QUERY_BLOCK];
      for (int64_t r = 0; r < QUERY_BLOCK; ++r)
        query[r] = first + i + r < length ? qp + (first + i + r) * q.stride(2) : s.zeros.data();
      score_pairs(query, dim, s.key_pairs.data(), keys, s.scores.data() + i * keys);
    }
    softmax_pairs(s.scores.data(), real_rows, keys, first, length, causal, scale, s.probs.data(), inverse);
    for (int64_t i = 0; i < rows; i += QUERY_BLOCK)
      weigh_pairs(s.probs.data() + i * keys, inverse + i, keys, length, s.value_pairs.data(), dim, s.dim_padded,
                  std::min(QUERY_BLOCK, real_rows - i), dst + i);
  }
}
// Whether AMX's tiles take this head dim (a whole number of 32-wide products) on this CPU.
bool takes_tiles(int64_t dim) {
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
  return dim % TILE_KEYS == 0 && tiles_allowed();
#else
  return false;
#endif
}

}  // namespace

bool attend_texts_bf16(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                       const std::vector<Span>& spans, float scale, bool causal, at::Tensor& out) {
  // bfloat16, an even head dim, each head's values contiguous
  if (query.scalar_type() != at::kBFloat16 || query.size(3) % 2 != 0 || query.stride(3) != 1 || key.stride(3) != 1 ||
      value.stride(3) != 1)
    return false;
  const int64_t heads = query.size(1), group = heads / key.size(1), dim = query.size(3);
  const int64_t items = static_cast<int64_t>(spans.size()) * heads, longest = spans.front().length;
  const bool tiles = takes_tiles(dim);
  at::BFloat16* out_data = out.data_ptr<at::BFloat16>();
  std::atomic<int64_t> next{0};
  at::parallel_for(0, at::get_num_threads(), 1, [&](int64_t, int64_t) {
    Scratch scratch(longest, dim);
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
    const TileConfig config;
    if (tiles) _tile_loadconfig(&config);  // at each call: oneDNN sets its own in between
#endif
    for (int64_t item = next++; item < items; item = next++) {
      const int64_t head = item % heads;
      attend_text_bf16(query, key, value, spans[item / heads], head, head / group, scale, causal, tiles, scratch,
                       out_data, heads);
    }
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
    if (tiles) _tile_release();
#endif
  });
  return true;
}

#else  // no AVX512-BF16 in this build: the float32 kernel serves bfloat16 too

bool attend_texts_bf16(const at::Tensor&, const at::Tensor&, const at::Tensor&, const std::vector<Span>&, float, bool,
                       at::Tensor&) {
  return false;
}

#endif

}  // namespace hfserve_text_attention
