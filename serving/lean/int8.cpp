// int8 weights times int8 activations with integer dot products: llama.cpp's Q8_0 x Q8_0
// (the GGUF's output matrix), with one scale per output as Int8Linear keeps it.
//
// Weights: symmetric int8 codes w (-127..127) with a scale s per output. Activations: each
// row's group of 32 inputs rounded to int8 with its own scale d (lean.h). Per output and row
//     sum_j w_j x_j ~ s (sum_g d_g isum_g),   isum_g = sum over the group of w_j a_j (exact),
// the groups added in order with fused multiply-adds (acc = fma(float(isum_g), d_g, acc)),
// then times s. Every path (AVX-512 VNNI, AVX2 with or without AVX-VNNI, plain C++) does
// exactly that per lane, and a row never reads another row: bit for bit the same whatever
// the rows beside it.
//
// Layout (int8_tiles in serving/lean/tiles.py): tiles of 16 outputs; per (tile, group) eight 64-byte
// blocks, V_k[4 i + b] = w[16 t + i][32 g + 4 k + b] (signed). VNNI multiplies unsigned by
// signed bytes, so it flips each code's top bit (w + 128) and takes 128 sum(a) back off;
// AVX2's maddubs takes |w| and a with w's sign (its int16 pairs stay within 2 x 127 x 127).

#include "lean.h"

#include <vector>

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace specops_lean {
namespace {

constexpr int64_t kTile = 16;
constexpr int64_t kTileBytes = 512;  // 16 outputs x 32 codes

struct Problem {
  const int8_t* tiles;
  const float* scales;  // [N]
  const int8_t* a;
  const float* d;
  const int32_t* sums;
  float* out;
  int64_t rows, k, n, groups;
};

void tile_plain(const Problem& p, int64_t t) {
  for (int64_t r = 0; r < p.rows; ++r) {
    float acc[kTile] = {};
    for (int64_t g = 0; g < p.groups; ++g) {
      const int8_t* w = p.tiles + (t * p.groups + g) * kTileBytes;
      const int8_t* a = p.a + r * p.k + g * kGroup;
      const float d = p.d[r * p.groups + g];
      for (int64_t i = 0; i < kTile; ++i) {
        int32_t isum = 0;
        for (int64_t kk = 0; kk < 8; ++kk)
          for (int64_t b = 0; b < 4; ++b)
            isum += static_cast<int32_t>(w[kk * 64 + 4 * i + b]) * a[4 * kk + b];
        acc[i] = std::fma(static_cast<float>(isum), d, acc[i]);
      }
    }
    for (int64_t i = 0; i < kTile; ++i)
      p.out[r * p.n + t * kTile + i] = acc[i] * p.scales[t * kTile + i];
  }
}

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
constexpr const char* kPath = "avx512-vnni";

template <int R>
void rows_vnni(const Problem& p, int64_t t, int64_t r0) {
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  for (int64_t g = 0; g < p.groups; ++g) {
    const int8_t* w = p.tiles + (t * p.groups + g) * kTileBytes;
    prefetch_ahead(w, kTileBytes);
    __m512i v[8];
    for (int kk = 0; kk < 8; ++kk)
      v[kk] = _mm512_xor_si512(_mm512_loadu_si512(w + 64 * kk), flip);  // w + 128
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const int64_t row = r0 + r;
      const int8_t* a = p.a + row * p.k + g * kGroup;
      // w + 128 against a: the chain starts at -128 sum(a) to take that back off.
      const __m512i isum =
          group_dot<kVnniChains<R>>(v, a, _mm512_set1_epi32(-128 * p.sums[row * p.groups + g]));
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_set1_ps(p.d[row * p.groups + g]),
                               acc[r]);
    }
  }
  const __m512 s = _mm512_loadu_ps(p.scales + t * kTile);
  for (int r = 0; r < R; ++r)
    _mm512_storeu_ps(p.out + (r0 + r) * p.n + t * kTile, _mm512_mul_ps(acc[r], s));
}

void tile(const Problem& p, int64_t t) {
  for_row_chunks<kVnniRows>(p.rows,
                            [&](auto r, int64_t r0) { rows_vnni<decltype(r)::value>(p, t, r0); });
}

#elif defined(__AVX2__) && defined(__FMA__)
#if defined(__AVXVNNI__)
constexpr const char* kPath = "avx-vnni";  // AVX2 with 256-bit vpdpbusd
#else
constexpr const char* kPath = "avx2";
#endif

template <int R>
void rows_avx2(const Problem& p, int64_t t, int64_t r0, int half) {
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  [[maybe_unused]] const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t g = 0; g < p.groups; ++g) {
    const int8_t* w = p.tiles + (t * p.groups + g) * kTileBytes + 32 * half;
    if (half == 0) prefetch_ahead(w, kTileBytes);  // the second half reads what the first read
#if defined(__AVXVNNI__)
    __m256i v[8];
    const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
    for (int kk = 0; kk < 8; ++kk)  // w + 128, unsigned as vpdpbusd takes it
      v[kk] = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 64 * kk)),
                               flip);
    for (int r = 0; r < R; ++r) {
      const int64_t row = r0 + r;
      const int8_t* a = p.a + row * p.k + g * kGroup;
      // The chain starts at -128 sum(a) to take the flip back off.
      __m256i isum = _mm256_set1_epi32(-128 * p.sums[row * p.groups + g]);
      for (int kk = 0; kk < 8; ++kk)
        isum = _mm256_dpbusd_avx_epi32(isum, v[kk], _mm256_set1_epi32(quad(a, kk)));
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(p.d[row * p.groups + g]),
                               acc[r]);
    }
#else
    __m256i v[8], magnitude[8];
    for (int kk = 0; kk < 8; ++kk) {
      v[kk] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 64 * kk));
      magnitude[kk] = _mm256_sign_epi8(v[kk], v[kk]);  // |w|
    }
    for (int r = 0; r < R; ++r) {
      const int64_t row = r0 + r;
      const int8_t* a = p.a + row * p.k + g * kGroup;
      __m256i even = _mm256_setzero_si256(), odd = _mm256_setzero_si256();
      for (int kk = 0; kk < 8; kk += 2) {
        const __m256i x0 = _mm256_sign_epi8(_mm256_set1_epi32(quad(a, kk)), v[kk]);
        const __m256i x1 = _mm256_sign_epi8(_mm256_set1_epi32(quad(a, kk + 1)), v[kk + 1]);
        even = _mm256_add_epi32(even, _mm256_madd_epi16(_mm256_maddubs_epi16(magnitude[kk], x0), ones));
        odd = _mm256_add_epi32(odd, _mm256_madd_epi16(_mm256_maddubs_epi16(magnitude[kk + 1], x1), ones));
      }
      const __m256i isum = _mm256_add_epi32(even, odd);
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(p.d[row * p.groups + g]),
                               acc[r]);
    }
#endif
  }
  const __m256 s = _mm256_loadu_ps(p.scales + t * kTile + 8 * half);
  for (int r = 0; r < R; ++r)
    _mm256_storeu_ps(p.out + (r0 + r) * p.n + t * kTile + 8 * half, _mm256_mul_ps(acc[r], s));
}

void tile(const Problem& p, int64_t t) {
  for (int half = 0; half < 2; ++half)
    for_row_chunks(p.rows, [&](auto r, int64_t r0) {
      rows_avx2<decltype(r)::value>(p, t, r0, half);
    });
}

#else
constexpr const char* kPath = "plain";
void tile(const Problem& p, int64_t t) { tile_plain(p, t); }
#endif

}  // namespace

Tensor int8_mm(Tensor x, Tensor tiles, Tensor scales, bool plain) {
  const Activations q = quantise_input(x, true);
  check(tiles.dim() == 3 && tiles.is_contiguous() && tiles.scalar_type() == at::kChar &&
            tiles.size(2) == kTileBytes,
        "int8 tiles must be contiguous int8 [N / 16, K / 32, 512]");
  const int64_t rows = x.size(0), k = x.size(1), groups = tiles.size(1);
  const int64_t n = tiles.size(0) * kTile;
  check(k == groups * kGroup, "x's width must be the tiles' groups times 32");
  check(scales.is_contiguous() && scales.scalar_type() == at::kFloat && scales.numel() == n,
        "int8 scales must be contiguous float32 [N]");
  Tensor out = at::empty({rows, n}, x.options().dtype(at::kFloat));
  if (rows == 0) return out;
  const Problem problem{tiles.data_ptr<int8_t>(), scales.data_ptr<float>(), q.a.data(),
                        q.d.data(), q.sums.data(), out.data_ptr<float>(), rows, k, n, groups};
  for_tiles(tiles.size(0), [&](int64_t t) { plain ? tile_plain(problem, t) : tile(problem, t); });
  return out;
}

std::string int8_path() { return kPath; }

}  // namespace specops_lean
