// Attention for up to 16 rows of one sequence and one head, the rows in vector lanes.
//
// A verification pass attends with every row to (nearly) the same cached positions. Lane l
// holds row l: per position the query-key dot products of all rows are one chain of
// fused multiply-adds over the head's dimensions, the softmax and the weighted sum of
// values are lane-wise too. So a block of rows costs about what one row costs, and each
// lane's arithmetic — its order, its operations — is the same whatever the other lanes
// hold: a row gets bit for bit what it gets alone. A position a row may not see is skipped
// by a select (its weight is exactly 0, and adding 0 changes nothing).
//
// The lanes are GCC vector types (one zmm register on AVX-512, two ymm on AVX2): every
// operation below is element-wise over lanes, and compiled without -ffast-math
// (serving/lean/build.py) nothing is reordered across positions or dimensions.

#include "lean.h"

#include <cstdint>
#include <cstring>
#include <vector>

namespace specops_lean {
namespace {

constexpr int kLanes = 16;
typedef float Lanes __attribute__((vector_size(kLanes * sizeof(float))));
typedef int32_t Ints __attribute__((vector_size(kLanes * sizeof(int32_t))));

inline Lanes splat(float x) { return Lanes{} + x; }
inline Lanes load_lanes(const float* p) {
  Lanes v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store_lanes(float* p, Lanes v) { std::memcpy(p, &v, sizeof v); }

// exp(x) for -69 <= x <= 0 from + - * and bit moves only (Cephes' single-precision
// polynomial, ~2 ulp), lane by lane.
inline Lanes exp_lanes(Lanes x) {
  // Round x log2(e) to the nearest integer n by the 1.5 x 2^23 trick (exact for |n| < 2^22).
  const Lanes shifted = x * 1.44269504088896341f + 12582912.0f;
  const Lanes n = shifted - 12582912.0f;
  Lanes r = x - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  Lanes p = splat(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const Lanes y = p * (r * r) + r + 1.0f;
  const Ints power = (((Ints)shifted - 0x4B400000) + 127) << 23;  // 2^n, by its bits
  return y * (Lanes)power;
}

}  // namespace

void attend_rows(const float* queries, int64_t query_stride, const float* keys,
                 const float* values, int64_t start, int64_t count, int64_t d, float scale,
                 float* out, int64_t out_stride, std::vector<float>& scratch) {
  check(count >= 1 && count <= kLanes, "attend_rows takes 1 to 16 rows");
  const int64_t span = start + count;  // positions the last row sees
  // Scratch: queries transposed [d][16], then weights [span][16].
  scratch.assign((d + span) * kLanes, 0.0f);
  float* qt = scratch.data();
  float* weights = qt + d * kLanes;
  for (int64_t l = 0; l < count; ++l)
    for (int64_t j = 0; j < d; ++j) qt[j * kLanes + l] = queries[l * query_stride + j];
  Ints last;  // the last position each lane sees (-1: an unused lane)
  for (int l = 0; l < kLanes; ++l) last[l] = l < count ? static_cast<int32_t>(start + l) : -1;

  // Scores: per position, a chain of multiply-adds over the dimensions in order; four
  // positions at a time keep four independent chains in flight.
  const Lanes scaled = splat(scale);
  int64_t t = 0;
  for (; t + 4 <= span; t += 4) {
    Lanes s0{}, s1{}, s2{}, s3{};
    const float* k0 = keys + t * d;
    for (int64_t j = 0; j < d; ++j) {
      const Lanes q = load_lanes(qt + j * kLanes);
      s0 = s0 + q * k0[j];
      s1 = s1 + q * k0[d + j];
      s2 = s2 + q * k0[2 * d + j];
      s3 = s3 + q * k0[3 * d + j];
    }
    store_lanes(weights + t * kLanes, s0 * scaled);
    store_lanes(weights + (t + 1) * kLanes, s1 * scaled);
    store_lanes(weights + (t + 2) * kLanes, s2 * scaled);
    store_lanes(weights + (t + 3) * kLanes, s3 * scaled);
  }
  for (; t < span; ++t) {
    Lanes s0{};
    const float* k0 = keys + t * d;
    for (int64_t j = 0; j < d; ++j) s0 = s0 + load_lanes(qt + j * kLanes) * k0[j];
    store_lanes(weights + t * kLanes, s0 * scaled);
  }

  // Softmax per lane over the positions it sees.
  Lanes best = splat(-3.0e38f), total{};
  for (t = 0; t < span; ++t) {
    const Lanes s = load_lanes(weights + t * kLanes);
    best = (static_cast<int32_t>(t) <= last) & (s > best) ? s : best;
  }
  // A weight below e^-69 (~1e-30 of the largest) counts as 0, and positions a lane does
  // not see are 0 without being computed: no lane ever holds a subnormal, an infinity or
  // the garbage of an unused lane (each would cost a microcode assist per operation).
  for (t = 0; t < span; ++t) {
    const Lanes x = load_lanes(weights + t * kLanes) - best;
    const Ints kept = (static_cast<int32_t>(t) <= last) & (x >= -69.0f);
    const Lanes e = exp_lanes(kept ? x : Lanes{});
    const Lanes w = kept ? e : Lanes{};
    store_lanes(weights + t * kLanes, w);
    total = total + w;
  }

  // The weighted sum of values, positions in order, four dimensions at a time.
  const Lanes inverse = 1.0f / total;
  for (int64_t j0 = 0; j0 < d; j0 += 4) {
    const int64_t width = d - j0 < 4 ? d - j0 : 4;
    Lanes a[4] = {};
    for (t = 0; t < span; ++t) {
      const Lanes w = load_lanes(weights + t * kLanes);
      const float* vt = values + t * d + j0;
      for (int64_t j = 0; j < width; ++j) a[j] = a[j] + w * vt[j];
    }
    for (int64_t j = 0; j < width; ++j) {
      const Lanes result = a[j] * inverse;
      for (int64_t l = 0; l < count; ++l) out[l * out_stride + j0 + j] = result[l];
    }
  }
}

}  // namespace specops_lean
