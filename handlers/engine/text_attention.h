// Shared by the per-text attention kernels (text_attention.cpp, text_attention_bf16.cpp): the
// block sizes, a text's span and one thread's scratch.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <cstdint>
#include <vector>

namespace hfserve_text_attention {

using Vec = at::vec::Vectorized<float>;
constexpr int64_t KEY_BLOCK = Vec::size();  // keys (or output columns) per vector
constexpr int64_t QUERY_BLOCK = 8;          // queries per register block: 8 independent sums
constexpr int64_t QUERY_TILE = 64;          // queries whose scores are held at once
constexpr int64_t TILE_ROWS = 16;           // an AMX tile: 16 rows of 64 bytes
constexpr int64_t TILE_KEYS = 32;           // keys per AMX product: 32 bfloat16 in a row of the left tile

struct Span {
  int64_t row, start, length;
};

inline constexpr int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// Scratch of one thread, sized for the longest short text.
struct Scratch {
  int64_t dim, dim_padded, keys_padded;
  std::vector<float> query, keys_t, values, scores;
  std::vector<uint16_t> key_pairs, value_pairs, probs, zeros, query_bits;  // bfloat16 bits, for the pair kernels
  Scratch(int64_t longest, int64_t dim)
      : dim(dim), dim_padded(round_up(dim, KEY_BLOCK)), keys_padded(round_up(longest, TILE_KEYS)),
        query(round_up(longest, QUERY_BLOCK) * dim), keys_t(dim * keys_padded),
        values(keys_padded * dim_padded), scores(QUERY_TILE * keys_padded), key_pairs(dim * keys_padded),
        value_pairs(keys_padded * dim_padded), probs(QUERY_TILE * keys_padded), zeros(dim),
        query_bits(round_up(longest, TILE_ROWS) * dim) {}
};

// The bfloat16 kernels (AVX512-BF16 pairs, AMX tiles where the CPU has them) over every (span,
// head); false, with nothing written, where this build or these inputs cannot take them.
bool attend_texts_bf16(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                       const std::vector<Span>& spans, float scale, bool causal, at::Tensor& out);

}  // namespace hfserve_text_attention
