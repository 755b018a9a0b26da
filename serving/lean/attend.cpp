// Rotary embeddings, the KV write and attention for a packed pass over several sequences
// (the lean step's attention op, registered in ops.cpp).
//
// qkv [N, (heads + 2 * kv_heads) * d]; cos, sin [N, d / 2] (each row's own position);
// keys[s] [layers, kv_heads, capacity_s / kBlock, d, kBlock] (sequence s's keys, transposed in
// blocks of kBlock positions: a position's key is a column of its block, so a query's
// scores for a block's positions are one chain of multiply-adds, a lane per position);
// values[s] [layers, kv_heads, capacity_s, d] (each cache its own capacity). Row n of
// sequence s sits at position starts[s] + (n - bounds[s]) and attends to positions 0..its own.
//
// Exact by construction: a (row, head) pair's scores, softmax and weighted sum run the same
// lane-wise arithmetic in the same order whatever else shares the call. Pairs that read the
// same keys and values (a verification block's rows, the query heads of one KV head) are
// computed side by side in bundles, each loaded key block and value row serving every pair
// of the bundle, but no pair's arithmetic touches another's: bundling changes what is
// loaded once, not what is computed. Compiled without -ffast-math (serving/lean/build.py):
// the order written is the order run; a*b + c contracts to one fused multiply-add wherever
// it is written, in every instantiation alike. exp is this file's own, lane-wise.

#include "lean.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <vector>

namespace specops_lean {
namespace {

constexpr int64_t kBlock = 16;   // key positions per transposed block (serving/lean/cache.py)
constexpr int64_t kChunk = 16;   // rows of one sequence per task at most

// The CPU's vector width in floats. Every function below computes lane by lane (a lane is a
// position of a key block, or an element of a head's output), so the width changes how many
// lanes one instruction carries, never what a lane computes.
#if defined(__AVX512F__)
constexpr int64_t kWidth = 16;
#elif defined(__AVX__)
constexpr int64_t kWidth = 8;
#else
constexpr int64_t kWidth = 4;
#endif
constexpr int64_t kParts = kBlock / kWidth;  // vectors per key block
// (row, head) pairs computed side by side at most: as many as keep their accumulators in
// the vector registers (32 with AVX-512, 16 below).
constexpr int kBundle = kWidth == 16 ? 4 : 2;

using Vec = float __attribute__((vector_size(kWidth * sizeof(float))));
using IntVec = int32_t __attribute__((vector_size(kWidth * sizeof(int32_t))));

inline Vec load_vec(const float* p) {
  Vec v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store_vec(float* p, Vec v) { std::memcpy(p, &v, sizeof v); }
inline Vec splat(float x) { return Vec{} + x; }

// e^x lane by lane for x <= 0, within 2 ulp: 2^n times a degree-6 polynomial of the
// remainder (|r| <= ln 2 / 2). Below -86 it is 0 (no subnormals: they would cost a
// microcode assist on every multiply that meets one).
inline Vec exp_vec(Vec x) {
  x = x < -100.0f ? splat(-100.0f) : x;  // every lane finite below
  const Vec t = x * 1.44269504088896341f;
  const Vec n = (t + 12582912.0f) - 12582912.0f;  // round to nearest (|t| < 2^22)
  Vec r = x - n * 0.693145751953125f;             // ln 2 in two parts
  r = r - n * 1.42860682030941723e-6f;
  Vec p = splat(1.0f / 720.0f);
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const IntVec bits = (__builtin_convertvector(n, IntVec) + 127) << 23;
  Vec two_n;
  std::memcpy(&two_n, &bits, sizeof two_n);
  return x < -86.0f ? splat(0.0f) : p * two_n;
}

// B pairs' scaled scores for one key block: lane p of pair b's scores is q_b's dot product
// with position p's key, its d terms in four interleaved chains (j mod 4) added pairwise.
template <int B>
void block_scores(const float* const* q, const float* block, int64_t d, float scale,
                  float* const* out) {
  for (int64_t part = 0; part < kParts; ++part) {
    Vec c[B][4] = {};
    int64_t j = 0;
    for (; j + 4 <= d; j += 4)
      for (int64_t m = 0; m < 4; ++m) {
        const Vec k = load_vec(block + (j + m) * kBlock + part * kWidth);
        for (int b = 0; b < B; ++b) c[b][m] = q[b][j + m] * k + c[b][m];
      }
    for (; j < d; ++j) {  // a width off the multiples of 4: the same chains, j mod 4
      const Vec k = load_vec(block + j * kBlock + part * kWidth);
      for (int b = 0; b < B; ++b) c[b][j % 4] = q[b][j] * k + c[b][j % 4];
    }
    for (int b = 0; b < B; ++b)
      store_vec(out[b] + part * kWidth, ((c[b][0] + c[b][1]) + (c[b][2] + c[b][3])) * scale);
  }
}

// B pairs' weighted sums of values v[t] (rows of width D = d): pair b's output element j is
// one chain over its positions t < visible[b], in order. Positions every pair sees are run
// side by side; each pair's own tail after.
template <int B, int64_t D>
void weighted_sums(const float* const* weights, const int64_t* visible, const float* v,
                   float* const* out) {
  constexpr int64_t kVecs = D / kWidth;
  Vec acc[B][kVecs] = {};
  int64_t common = visible[0];
  for (int b = 1; b < B; ++b) common = std::min(common, visible[b]);
  for (int64_t t = 0; t < common; ++t) {
    const float* vt = v + t * D;
    for (int64_t m = 0; m < kVecs; ++m) {
      const Vec vm = load_vec(vt + m * kWidth);
      for (int b = 0; b < B; ++b) acc[b][m] = weights[b][t] * vm + acc[b][m];
    }
  }
  for (int b = 0; b < B; ++b) {
    for (int64_t t = common; t < visible[b]; ++t)
      for (int64_t m = 0; m < kVecs; ++m)
        acc[b][m] = weights[b][t] * load_vec(v + t * D + m * kWidth) + acc[b][m];
    for (int64_t m = 0; m < kVecs; ++m) store_vec(out[b] + m * kWidth, acc[b][m]);
  }
}

// The same for any width d, the accumulators in memory: whole vectors, then the elements
// past the last one (each element's chain is the same either way).
template <int B>
void weighted_sums_any(const float* const* weights, const int64_t* visible, const float* v,
                       int64_t d, float* const* out) {
  const int64_t vecs = d / kWidth, tail = vecs * kWidth;
  for (int b = 0; b < B; ++b) {
    std::vector<Vec> acc(vecs, Vec{});
    std::vector<float> rest(d - tail, 0.0f);
    for (int64_t t = 0; t < visible[b]; ++t) {
      const float w = weights[b][t];
      const float* vt = v + t * d;
      for (int64_t m = 0; m < vecs; ++m) acc[m] = w * load_vec(vt + m * kWidth) + acc[m];
      for (int64_t j = tail; j < d; ++j) rest[j - tail] = w * vt[j] + rest[j - tail];
    }
    for (int64_t m = 0; m < vecs; ++m) store_vec(out[b] + m * kWidth, acc[m]);
    for (int64_t j = tail; j < d; ++j) out[b][j] = rest[j - tail];
  }
}

template <int B>
void weighted(const float* const* weights, const int64_t* visible, const float* v, int64_t d,
              float* const* out) {
  if (d == 64)
    weighted_sums<B, 64>(weights, visible, v, out);
  else if (d == 128)
    weighted_sums<B, 128>(weights, visible, v, out);
  else
    weighted_sums_any<B>(weights, visible, v, d, out);
}

// One bundle: B pairs of one sequence and KV head. q[b] the pair's rotated query,
// visible[b] its positions (0..its own), out[b] where its d outputs go (float32 scratch).
template <int B>
void attend_bundle(const float* const* q, const int64_t* visible, const float* keys,
                   const float* values, int64_t d, float scale, std::vector<float>& scratch,
                   float* const* out) {
  int64_t most = 0;
  for (int b = 0; b < B; ++b) most = std::max(most, visible[b]);
  const int64_t stride = (most + kBlock - 1) / kBlock * kBlock;
  scratch.resize(B * stride);
  float* scores[B];
  for (int b = 0; b < B; ++b) scores[b] = scratch.data() + b * stride;
  // 1. Scores, a key block at a time (every block up to the bundle's last: lanes past a
  // pair's own positions are computed and then ignored).
  for (int64_t block = 0; block * kBlock < most; ++block) {
    float* at[B];
    for (int b = 0; b < B; ++b) at[b] = scores[b] + block * kBlock;
    block_scores<B>(q, keys + block * d * kBlock, d, scale, at);
  }
  // 2. Each pair's softmax weights over its own positions (the rest 0) and their total:
  // lane sums over the blocks, then the block's 16 lanes added in one fixed tree.
  float inverse[B];
  for (int b = 0; b < B; ++b) {
    float* s = scores[b];
    for (int64_t t = visible[b]; t < stride; ++t) s[t] = -3.0e38f;
    Vec most_vec = splat(-3.0e38f);  // the largest score (a maximum: any order)
    for (int64_t t = 0; t < stride; t += kWidth) {
      const Vec x = load_vec(s + t);
      most_vec = x > most_vec ? x : most_vec;
    }
    float lanes[kWidth];
    store_vec(lanes, most_vec);
    const float best = *std::max_element(lanes, lanes + kWidth);
    Vec total[kParts] = {};
    for (int64_t t = 0; t < stride; t += kBlock)
      for (int64_t part = 0; part < kParts; ++part) {
        const Vec e = exp_vec(load_vec(s + t + part * kWidth) - best);
        store_vec(s + t + part * kWidth, e);
        total[part] = total[part] + e;
      }
    float sums[kBlock];
    for (int64_t part = 0; part < kParts; ++part) store_vec(sums + part * kWidth, total[part]);
    for (int64_t width = kBlock / 2; width > 0; width /= 2)
      for (int64_t i = 0; i < width; ++i) sums[i] = sums[i] + sums[i + width];
    inverse[b] = 1.0f / sums[0];
  }
  // 3. The weighted sums of the values, then scaled by 1 / total.
  const float* weights[B];
  for (int b = 0; b < B; ++b) weights[b] = scores[b];
  weighted<B>(weights, visible, values, d, out);
  for (int b = 0; b < B; ++b)
    for (int64_t j = 0; j < d; ++j) out[b][j] = out[b][j] * inverse[b];
}

template <typename I, typename O>
void rope_attend_impl(const I* qkv, const float* cos, const float* sin,
                      const std::vector<float*>& keys, const std::vector<float*>& values,
                      const std::vector<int64_t>& starts, const std::vector<int64_t>& bounds,
                      const std::vector<int64_t>& capacities, int64_t layer, int64_t heads,
                      int64_t kv_heads, int64_t d, float scale, O* out) {
  const int64_t rows = bounds.back();
  const int64_t sequences = static_cast<int64_t>(starts.size());
  const int64_t half = d / 2, width = (heads + 2 * kv_heads) * d;
  const int64_t group = heads / kv_heads;
  std::vector<int64_t> seq_of(rows), pos_of(rows);
  for (int64_t s = 0; s < sequences; ++s)
    for (int64_t n = bounds[s]; n < bounds[s + 1]; ++n) {
      seq_of[n] = s;
      pos_of[n] = starts[s] + (n - bounds[s]);
    }
  std::vector<float> queries(rows * heads * d), key(d);
  auto rotate = [&](const I* src, const float* c, const float* si, float* dst) {
    for (int64_t j = 0; j < half; ++j) {
      const float a = load(src, j), b = load(src, j + half);
      dst[j] = a * c[j] - b * si[j];
      dst[j + half] = b * c[j] + a * si[j];
    }
  };
  // 1. Rotate the queries and keys, write keys (a column of their block) and values into
  // their caches (a few thousand multiplies: on this thread).
  for (int64_t n = 0; n < rows; ++n) {
    const I* row = qkv + n * width;
    const float* c = cos + n * half;
    const float* si = sin + n * half;
    for (int64_t h = 0; h < heads; ++h) rotate(row + h * d, c, si, &queries[(n * heads + h) * d]);
    const int64_t pos = pos_of[n], capacity = capacities[seq_of[n]];
    const int64_t blocks = capacity / kBlock;
    for (int64_t g = 0; g < kv_heads; ++g) {
      rotate(row + (heads + g) * d, c, si, key.data());
      float* block =
          keys[seq_of[n]] + ((layer * kv_heads + g) * blocks + pos / kBlock) * d * kBlock;
      // A block's first position clears it: never-written lanes could hold subnormals or
      // NaN, and a block's lanes past a row's last position are computed (then ignored).
      if (pos % kBlock == 0) std::fill(block, block + d * kBlock, 0.0f);
      for (int64_t j = 0; j < d; ++j) block[j * kBlock + pos % kBlock] = key[j];
      float* v = values[seq_of[n]] + ((layer * kv_heads + g) * capacity + pos) * d;
      const I* src = row + (heads + kv_heads + g) * d;
      for (int64_t j = 0; j < d; ++j) v[j] = load(src, j);
    }
  }
  // 2. Tasks: per sequence and KV head, its rows in chunks of up to kChunk, the chunk's
  // (row, head) pairs in bundles of up to kBundle (a verification block's rows and the
  // query heads sharing a KV head read its keys and values once per bundle).
  struct Task {
    int64_t sequence, kv_head, first_pair, pairs, first_row;
  };
  std::vector<Task> tasks;
  for (int64_t s = 0; s < sequences; ++s)
    for (int64_t g = 0; g < kv_heads; ++g)
      for (int64_t c = bounds[s]; c < bounds[s + 1]; c += kChunk) {
        const int64_t pairs = std::min(kChunk, bounds[s + 1] - c) * group;
        for (int64_t p = 0; p < pairs; p += kBundle)
          tasks.push_back({s, g, p, std::min<int64_t>(kBundle, pairs - p), c});
      }
  at::parallel_for(0, static_cast<int64_t>(tasks.size()), 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scratch, outputs(kBundle * d);
    for (int64_t index = begin; index < end; ++index) {
      const Task& task = tasks[index];
      const float* q[kBundle];
      int64_t visible[kBundle];
      float* result[kBundle];
      O* target[kBundle];
      for (int64_t b = 0; b < task.pairs; ++b) {
        const int64_t pair = task.first_pair + b;
        const int64_t n = task.first_row + pair / group;  // the pair's row
        const int64_t h = task.kv_head * group + pair % group;
        q[b] = &queries[(n * heads + h) * d];
        visible[b] = pos_of[n] + 1;
        result[b] = outputs.data() + b * d;
        target[b] = out + (n * heads + h) * d;
      }
      const int64_t at = (layer * kv_heads + task.kv_head);
      const int64_t capacity = capacities[task.sequence], blocks = capacity / kBlock;
      const float* k = keys[task.sequence] + at * blocks * d * kBlock;
      const float* v = values[task.sequence] + at * capacity * d;
      switch (task.pairs) {
        case 1: attend_bundle<1>(q, visible, k, v, d, scale, scratch, result); break;
        case 2: attend_bundle<2>(q, visible, k, v, d, scale, scratch, result); break;
        case 3: attend_bundle<3>(q, visible, k, v, d, scale, scratch, result); break;
        case 4: attend_bundle<4>(q, visible, k, v, d, scale, scratch, result); break;
        default: check(false, "a bundle of more than four pairs"); break;
      }
      for (int64_t b = 0; b < task.pairs; ++b)
        for (int64_t j = 0; j < d; ++j) store(target[b], j, result[b][j]);
    }
  });
}

at::ScalarType out_type(bool bf16) { return bf16 ? at::kBFloat16 : at::kFloat; }

}  // namespace

Tensor rope_attend(Tensor qkv, Tensor cos, Tensor sin, at::TensorList keys,
                   at::TensorList values, at::IntArrayRef starts, at::IntArrayRef bounds,
                   int64_t layer, int64_t heads, int64_t kv_heads, double scale, bool bf16) {
  check(qkv.dim() == 2 && qkv.is_contiguous(), "qkv must be contiguous [rows, width]");
  check(keys.size() == values.size() && keys.size() == starts.size() &&
            bounds.size() == starts.size() + 1 && !keys.empty(),
        "one key cache, value cache and start per sequence; bounds one longer");
  check(heads > 0 && kv_heads > 0 && heads % kv_heads == 0,
        "heads must be a positive multiple of kv_heads");
  check(keys[0].dim() == 5 && keys[0].size(4) == kBlock && values[0].dim() == 4,
        "keys must be [layers, kv_heads, capacity / 16, d, 16], values [layers, kv_heads, "
        "capacity, d]");
  const int64_t d = values[0].size(3);
  check(d % 2 == 0, "the head width must be even (rotary embeddings rotate pairs)");
  check(qkv.size(1) == (heads + 2 * kv_heads) * d, "qkv width must be (heads + 2 kv_heads) d");
  check(bounds.front() == 0 && bounds.back() == qkv.size(0), "bounds must cover the rows");
  check(cos.scalar_type() == at::kFloat && cos.is_contiguous() && sin.is_contiguous() &&
            cos.size(0) == qkv.size(0) && cos.size(1) == d / 2,
        "cos and sin must be contiguous float32 [rows, d / 2]");
  std::vector<float*> key_ptrs, value_ptrs;
  std::vector<int64_t> capacities;
  for (size_t s = 0; s < keys.size(); ++s) {
    // Each sequence's cache holds its own capacity (a long request's grew); the layers,
    // KV heads and width are the model's, alike for all.
    check(keys[s].is_contiguous() && values[s].is_contiguous() &&
              keys[s].scalar_type() == at::kFloat && values[s].scalar_type() == at::kFloat &&
              keys[s].dim() == 5 && values[s].dim() == 4 &&
              keys[s].size(0) == keys[0].size(0) && values[s].size(0) == keys[0].size(0) &&
              values[s].size(1) == keys[s].size(1) && values[s].size(3) == d &&
              keys[s].size(3) == d && keys[s].size(4) == kBlock,
          "caches must be contiguous float32 of the same layers, KV heads and width");
    const int64_t capacity = values[s].size(2);
    check(keys[s].size(2) * kBlock == capacity,
          "keys and values must hold the same positions of the same width");
    check(layer >= 0 && layer < keys[s].size(0) && keys[s].size(1) == kv_heads,
          "layer or kv_heads outside the cache");
    check(starts[s] >= 0 && starts[s] + (bounds[s + 1] - bounds[s]) <= capacity,
          "the pass runs past a cache's capacity");
    key_ptrs.push_back(keys[s].data_ptr<float>());
    value_ptrs.push_back(values[s].data_ptr<float>());
    capacities.push_back(capacity);
  }
  std::vector<int64_t> start_list(starts.begin(), starts.end());
  std::vector<int64_t> bound_list(bounds.begin(), bounds.end());
  Tensor out = at::empty({qkv.size(0), heads * d}, qkv.options().dtype(out_type(bf16)));
  auto run = [&](auto* src) {
    if (bf16)
      rope_attend_impl(src, cos.data_ptr<float>(), sin.data_ptr<float>(), key_ptrs, value_ptrs,
                       start_list, bound_list, capacities, layer, heads, kv_heads, d,
                       static_cast<float>(scale), out.data_ptr<BFloat16>());
    else
      rope_attend_impl(src, cos.data_ptr<float>(), sin.data_ptr<float>(), key_ptrs, value_ptrs,
                       start_list, bound_list, capacities, layer, heads, kv_heads, d,
                       static_cast<float>(scale), out.data_ptr<float>());
  };
  if (qkv.scalar_type() == at::kBFloat16)
    run(static_cast<const BFloat16*>(qkv.data_ptr<BFloat16>()));
  else
    run(static_cast<const float*>(qkv.data_ptr<float>()));
  return out;
}

}  // namespace specops_lean
