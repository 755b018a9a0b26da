// int4 weights times int8 activations with integer dot products: llama.cpp's Q4_1 x Q8_1
// scheme (the shipped GGUF's own), reading each weight once per pass whatever its rows.
//
// Weights: asymmetric int4 codes q (0..15) in groups of 32 inputs, w = (q - 8) s + z with a
// bfloat16 scale s and zero z per (output, group) (serving.models.quantized.Int4Linear).
// Activations: each row's group of 32 inputs rounded to int8 with its own scale d
// (x ~ d a, a in -127..127). Then per output, row and group
//     sum_j w_j x_j ~ s d (sum_j q_j a_j) + (z - 8 s) d (sum_j a_j),
// the first sum exact in int32, and a row's output adds its groups in order, with fused
// multiply-adds: acc = fma(float(isum), s * d, acc); acc = fma(z - 8 s, d sum a, acc).
//
// Every output lane does exactly that sequence on every code path (AVX-512 VNNI, AVX2 with
// or without AVX-VNNI, plain C++), and a row never reads another row: the result is bit for bit the same for a row
// whatever the rows beside it and whichever path this CPU takes.
//
// Layout (int4_tiles in serving/lean/tiles.py): tiles of 16 outputs; per (tile, group) 256
// bytes, four 64-byte blocks; block p's byte j holds V_p[j] in its low nibble and V_{p+4}[j]
// in its high one, where V_k[4 i + b] = q[16 t + i][32 g + 4 k + b]. Scales and zeros:
// bfloat16 [tiles, groups, 2, 16] (the tile's 16 scales, then its 16 zeros).

#include "lean.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace specops_lean {
namespace {

constexpr int64_t kTile = 16;
constexpr int64_t kTileBytes = 256;  // 16 outputs x 32 codes x 4 bits

inline float bf16_bits(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &wide, sizeof value);
  return value;
}

struct Problem {
  const uint8_t* tiles;
  const uint16_t* scales;  // bfloat16 bits [tiles, groups, 2, 16]
  const int8_t* a;
  const float* d;
  const float* da;
  float* out;
  int64_t rows, k, n, groups;
};

// The plain C++ path, and the definition the vector paths reproduce lane for lane.
void tile_plain(const Problem& p, int64_t t) {
  for (int64_t r = 0; r < p.rows; ++r) {
    float acc[kTile] = {};
    for (int64_t g = 0; g < p.groups; ++g) {
      const uint8_t* w = p.tiles + (t * p.groups + g) * kTileBytes;
      const uint16_t* sz = p.scales + (t * p.groups + g) * 2 * kTile;
      const int8_t* a = p.a + r * p.k + g * kGroup;
      const float d = p.d[r * p.groups + g], da = p.da[r * p.groups + g];
      for (int64_t i = 0; i < kTile; ++i) {
        int32_t isum = 0;
        for (int64_t kk = 0; kk < 8; ++kk) {
          for (int64_t b = 0; b < 4; ++b) {
            const int64_t byte = (kk % 4) * 64 + 4 * i + b;
            const int32_t q = kk < 4 ? (w[byte] & 0x0F) : (w[byte] >> 4);
            isum += q * static_cast<int32_t>(a[4 * kk + b]);
          }
        }
        const float s = bf16_bits(sz[i]), z = bf16_bits(sz[kTile + i]);
        acc[i] = std::fma(static_cast<float>(isum), s * d, acc[i]);
        acc[i] = std::fma(std::fma(s, -8.0f, z), da, acc[i]);
      }
    }
    std::memcpy(p.out + r * p.n + t * kTile, acc, sizeof acc);
  }
}

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
constexpr const char* kPath = "avx512-vnni";

inline __m512 bf16_to_f32(__m256i bits) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}

template <int R>
void rows_vnni(const Problem& p, int64_t t, int64_t r0) {
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  const __m512i low = _mm512_set1_epi8(0x0F);
  for (int64_t g = 0; g < p.groups; ++g) {
    const uint8_t* w = p.tiles + (t * p.groups + g) * kTileBytes;
    const uint16_t* sz = p.scales + (t * p.groups + g) * 2 * kTile;
    prefetch_ahead(w, kTileBytes);
    prefetch_ahead(sz, 2 * kTile * sizeof(uint16_t));
    __m512i v[8];
    for (int b = 0; b < 4; ++b) {
      const __m512i packed = _mm512_loadu_si512(w + 64 * b);
      v[b] = _mm512_and_si512(packed, low);
      v[b + 4] = _mm512_and_si512(_mm512_srli_epi16(packed, 4), low);
    }
    const __m512 s = bf16_to_f32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(sz)));
    const __m512 z = bf16_to_f32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(sz + kTile)));
    const __m512 m = _mm512_fmadd_ps(s, _mm512_set1_ps(-8.0f), z);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const int64_t row = r0 + r;
      const int8_t* a = p.a + row * p.k + g * kGroup;
      const __m512i isum = group_dot<kVnniChains<R>>(v, a, _mm512_setzero_si512());
      const __m512 sd = _mm512_mul_ps(s, _mm512_set1_ps(p.d[row * p.groups + g]));
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), sd, acc[r]);
      acc[r] = _mm512_fmadd_ps(m, _mm512_set1_ps(p.da[row * p.groups + g]), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(p.out + (r0 + r) * p.n + t * kTile, acc[r]);
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

inline __m256 bf16_to_f32(__m128i bits) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
}

// One half of a tile (8 outputs): 4-byte lanes, maddubs pairs summed in int16 (at most
// 8 x 2 x 15 x 127 = 30480, no overflow), then to int32; with AVX-VNNI, one vpdpbusd chain.
template <int R>
void rows_avx2(const Problem& p, int64_t t, int64_t r0, int half) {
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  const __m256i low = _mm256_set1_epi8(0x0F);
  [[maybe_unused]] const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t g = 0; g < p.groups; ++g) {
    const uint8_t* w = p.tiles + (t * p.groups + g) * kTileBytes + 32 * half;
    const uint16_t* sz = p.scales + (t * p.groups + g) * 2 * kTile + 8 * half;
    if (half == 0) {  // the second half reads what the first brought in
      prefetch_ahead(w, kTileBytes);
      prefetch_ahead(sz, 2 * kTile * sizeof(uint16_t));
    }
    __m256i v[8];
    for (int b = 0; b < 4; ++b) {
      const __m256i packed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 64 * b));
      v[b] = _mm256_and_si256(packed, low);
      v[b + 4] = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low);
    }
    const __m256 s = bf16_to_f32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sz)));
    const __m256 z = bf16_to_f32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sz + kTile)));
    const __m256 m = _mm256_fmadd_ps(s, _mm256_set1_ps(-8.0f), z);
    for (int r = 0; r < R; ++r) {
      const int64_t row = r0 + r;
      const int8_t* a = p.a + row * p.k + g * kGroup;
#if defined(__AVXVNNI__)
      __m256i isum = _mm256_setzero_si256();
      for (int kk = 0; kk < 8; ++kk)
        isum = _mm256_dpbusd_avx_epi32(isum, v[kk], _mm256_set1_epi32(quad(a, kk)));
#else
      __m256i even = _mm256_setzero_si256(), odd = _mm256_setzero_si256();
      for (int kk = 0; kk < 8; kk += 2) {
        even = _mm256_add_epi16(even, _mm256_maddubs_epi16(v[kk], _mm256_set1_epi32(quad(a, kk))));
        odd = _mm256_add_epi16(odd, _mm256_maddubs_epi16(v[kk + 1], _mm256_set1_epi32(quad(a, kk + 1))));
      }
      const __m256i pairs = _mm256_add_epi16(even, odd);
      const __m256i isum = _mm256_madd_epi16(pairs, ones);
#endif
      const __m256 sd = _mm256_mul_ps(s, _mm256_set1_ps(p.d[row * p.groups + g]));
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), sd, acc[r]);
      acc[r] = _mm256_fmadd_ps(m, _mm256_set1_ps(p.da[row * p.groups + g]), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r)
    _mm256_storeu_ps(p.out + (r0 + r) * p.n + t * kTile + 8 * half, acc[r]);
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

Tensor int4_mm(Tensor x, Tensor tiles, Tensor scales, bool plain) {
  const Activations q = quantise_input(x, false);
  check(tiles.dim() == 3 && tiles.is_contiguous() && tiles.scalar_type() == at::kByte &&
            tiles.size(2) == kTileBytes,
        "tiles must be contiguous uint8 [N / 16, K / 32, 256]");
  const int64_t rows = x.size(0), k = x.size(1), groups = tiles.size(1);
  const int64_t n = tiles.size(0) * kTile;
  check(k == groups * kGroup, "x's width must be the tiles' groups times 32");
  check(scales.is_contiguous() && scales.scalar_type() == at::kBFloat16 &&
            scales.numel() == tiles.size(0) * groups * 2 * kTile,
        "scales must be contiguous bfloat16 [N / 16, K / 32, 2, 16]");
  Tensor out = at::empty({rows, n}, x.options().dtype(at::kFloat));
  if (rows == 0) return out;
  const Problem problem{tiles.data_ptr<uint8_t>(),
                        reinterpret_cast<const uint16_t*>(scales.data_ptr<BFloat16>()),
                        q.a.data(), q.d.data(), q.da.data(), out.data_ptr<float>(), rows, k, n,
                        groups};
  for_tiles(tiles.size(0), [&](int64_t t) { plain ? tile_plain(problem, t) : tile(problem, t); });
  return out;
}

std::string int4_path() { return kPath; }

}  // namespace specops_lean
