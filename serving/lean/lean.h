// What the lean step's C++ files share: bfloat16 by its bits, the error check, and the
// int4 matmul the decoder stack calls (int4.cpp).
#pragma once

#include <ATen/ATen.h>
#include <c10/util/BFloat16.h>

#include <cstdint>
#include <cstring>
#include <string>

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

// x [rows, K] float32 or bfloat16 times int4 tiles (int4.cpp's layout) -> [rows, N] float32.
// plain: the portable path whatever this CPU has (tests compare the vector path with it).
Tensor int4_mm(Tensor x, Tensor tiles, Tensor scales, bool plain);
// Which path int4_mm takes on this build: "avx512-vnni", "avx2" or "plain".
std::string int4_path();

}  // namespace specops_lean
