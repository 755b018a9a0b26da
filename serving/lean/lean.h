// What the lean step's C++ files share: bfloat16 by its bits, the error check, and the
// int4 matmul the decoder stack calls (int4.cpp).
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include <cstdint>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace specops_lean {

using at::BFloat16;
using at::Tensor;

// bfloat16 by its bits, so the compiler vectorises the loops that convert (rounding to
// nearest even, as torch's own conversion; no NaN reaches these ops).
inline float load(const float* p, int64_t i) { return p[i]; }
inline float load(const BFloat16* p, int64_t i) {
  const uint32_t bits = static_cast<uint32_t>(p[i].x) << 16;
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}
inline void store(float* p, int64_t i, float v) { p[i] = v; }
inline void store(BFloat16* p, int64_t i, float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  bits += 0x7FFFu + ((bits >> 16) & 1u);
  p[i].x = static_cast<uint16_t>(bits >> 16);
}

inline void check(bool ok, const char* what) { TORCH_CHECK(ok, "specops lean op: ", what); }

constexpr int64_t kGroup = 32;  // inputs per activation scale (and per int4 weight scale)

// Each row's groups rounded to int8: a [rows, K], d [rows, G], d * sum(a) [rows, G] and,
// where asked for, sum(a) [rows, G].
template <typename I>
inline void quantise_rows(const I* x, int64_t rows, int64_t k, int8_t* a, float* d, float* da,
                          int32_t* sums = nullptr) {
  const int64_t groups = k / kGroup;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t base = r * k + g * kGroup;
      float values[kGroup];
      float largest = 0.0f;
      for (int64_t j = 0; j < kGroup; ++j) {
        values[j] = load(x, base + j);
        largest = std::max(largest, std::fabs(values[j]));
      }
      const float scale = largest / 127.0f;
      const float inverse = scale > 0.0f ? 127.0f / largest : 0.0f;
      int32_t total = 0;
      for (int64_t j = 0; j < kGroup; ++j) {
        const float rounded = std::nearbyint(values[j] * inverse);
        const int32_t code = static_cast<int32_t>(std::max(-127.0f, std::min(127.0f, rounded)));
        a[base + j] = static_cast<int8_t>(code);
        total += code;
      }
      d[r * groups + g] = scale;
      da[r * groups + g] = scale * static_cast<float>(total);
      if (sums != nullptr) sums[r * groups + g] = total;
    }
  }
}

// A float32 or bfloat16 [rows, K] input rounded to int8 by quantise_rows, for the integer
// kernels (int4.cpp, int8.cpp).
struct Activations {
  std::vector<int8_t> a;
  std::vector<float> d, da;
  std::vector<int32_t> sums;  // filled where asked for
};

inline Activations quantise_input(const Tensor& x, bool with_sums) {
  check(x.dim() == 2 && x.is_contiguous() &&
            (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16),
        "x must be contiguous float32 or bfloat16 [rows, K]");
  const int64_t rows = x.size(0), k = x.size(1), groups = k / kGroup;
  Activations q{std::vector<int8_t>(rows * k), std::vector<float>(rows * groups),
                std::vector<float>(rows * groups),
                std::vector<int32_t>(with_sums ? rows * groups : 0)};
  int32_t* sums = with_sums ? q.sums.data() : nullptr;
  if (x.scalar_type() == at::kBFloat16)
    quantise_rows(x.data_ptr<BFloat16>(), rows, k, q.a.data(), q.d.data(), q.da.data(), sums);
  else
    quantise_rows(x.data_ptr<float>(), rows, k, q.a.data(), q.d.data(), q.da.data(), sums);
  return q;
}

// The last rows of a pass, fewer than a chunk: run(std::integral_constant<int, R>, first
// row) with R = left.
template <int R, typename Run>
inline void run_rest(int64_t left, int64_t r0, Run& run) {
  if constexpr (R > 0) {
    if (left == R)
      run(std::integral_constant<int, R>{}, r0);
    else
      run_rest<R - 1>(left, r0, run);
  }
}

// rows in chunks of Max (four unless a kernel's registers hold more), then the rest in one
// call: run(std::integral_constant<int, R>, first row). A kernel templated on R computes
// each row the same way whatever R is.
template <int Max = 4, typename Run>
inline void for_row_chunks(int64_t rows, Run run) {
  int64_t r0 = 0;
  for (; r0 + Max <= rows; r0 += Max) run(std::integral_constant<int, Max>{}, r0);
  run_rest<Max - 1>(rows - r0, r0, run);
}

// Every output tile through tile(t), split across threads by tiles only.
template <typename Tile>
inline void for_tiles(int64_t count, Tile tile) {
  at::parallel_for(0, count, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) tile(t);
  });
}

// Four int8 activations as one int32 (what a broadcast lane multiplies by).
inline int32_t quad(const int8_t* a, int kk) {
  int32_t value;
  std::memcpy(&value, a + 4 * kk, sizeof value);
  return value;
}

// Weights stream through a kernel once per pass, in order: ask for the bytes kPrefetch
// steps ahead of the ones in hand (a step: one group of one tile; 32 of them are 8 KiB of
// int4 codes), so the loads of a compute-bound step (several rows) overlap the memory
// traffic of the steps after it. Measured with the eight-row chunks: a `cpu-int4` 8-token
// pass ~20 % faster, a one-token one no slower (docs/lean.md, fourth round). A thread's
// last steps ask for its neighbour's bytes, or past the end: a prefetch never faults.
constexpr int kPrefetch = 32;
inline void prefetch_ahead(const void* here, int64_t step_bytes) {
  const char* ahead = static_cast<const char*>(here) + kPrefetch * step_bytes;
  for (int64_t line = 0; line < step_bytes; line += 64) __builtin_prefetch(ahead + line, 0, 3);
}

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
// One row's group of 32 inputs against a tile's eight blocks of codes (unsigned bytes, as
// VNNI multiplies them) added to start: 16 int32 sums, exact, so how the eight products
// are chained changes nothing. Chains: four short chains hide a lone row's latency; with
// many rows side by side one chain each saves the adds and the registers.
template <int Chains>
inline __m512i group_dot(const __m512i* v, const int8_t* a, __m512i start) {
  if constexpr (Chains == 1) {
    __m512i c = start;
    for (int kk = 0; kk < 8; ++kk) c = _mm512_dpbusd_epi32(c, v[kk], _mm512_set1_epi32(quad(a, kk)));
    return c;
  } else {
    static_assert(Chains == 4, "one chain or four");
    const __m512i zero = _mm512_setzero_si512();
    __m512i c0 = _mm512_dpbusd_epi32(start, v[0], _mm512_set1_epi32(quad(a, 0)));
    __m512i c1 = _mm512_dpbusd_epi32(zero, v[1], _mm512_set1_epi32(quad(a, 1)));
    __m512i c2 = _mm512_dpbusd_epi32(zero, v[2], _mm512_set1_epi32(quad(a, 2)));
    __m512i c3 = _mm512_dpbusd_epi32(zero, v[3], _mm512_set1_epi32(quad(a, 3)));
    c0 = _mm512_dpbusd_epi32(c0, v[4], _mm512_set1_epi32(quad(a, 4)));
    c1 = _mm512_dpbusd_epi32(c1, v[5], _mm512_set1_epi32(quad(a, 5)));
    c2 = _mm512_dpbusd_epi32(c2, v[6], _mm512_set1_epi32(quad(a, 6)));
    c3 = _mm512_dpbusd_epi32(c3, v[7], _mm512_set1_epi32(quad(a, 7)));
    return _mm512_add_epi32(_mm512_add_epi32(c0, c1), _mm512_add_epi32(c2, c3));
  }
}

// Rows side by side in the VNNI kernels: eight fit the registers with one chain each.
constexpr int kVnniRows = 8;
template <int R>
constexpr int kVnniChains = R >= 4 ? 1 : 4;
#endif

// Rotary embeddings, the KV write and attention for a packed pass (attend.cpp).
Tensor rope_attend(Tensor qkv, Tensor cos, Tensor sin, at::TensorList keys,
                   at::TensorList values, at::IntArrayRef starts, at::IntArrayRef bounds,
                   int64_t layer, int64_t heads, int64_t kv_heads, double scale, bool bf16);

// x [rows, K] float32 or bfloat16 times int8 tiles (int8.cpp's layout), per-output scales
// float32 [N] -> [rows, N] float32.
Tensor int8_mm(Tensor x, Tensor tiles, Tensor scales, bool plain);
std::string int8_path();

// x [rows, K] float32 or bfloat16 times int4 tiles (int4.cpp's layout) -> [rows, N] float32.
// plain: the portable path whatever this CPU has (tests compare the vector path with it).
Tensor int4_mm(Tensor x, Tensor tiles, Tensor scales, bool plain);
// Which path int4_mm takes on this build: "avx512-vnni", "avx-vnni" (AVX2 with 256-bit
// vpdpbusd), "avx2" or "plain".
std::string int4_path();

}  // namespace specops_lean
