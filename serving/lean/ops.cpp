// The lean decode step's fused ops (serving/lean): everything in a Llama decoder layer but
// its matmuls, each one call, each computing a row exactly as it would alone.
//
// Row invariance is the point: every output row (and, in attention, every (row, head)
// pair) is computed by the same code in the same order whatever the number of rows that
// share the call, so a verification pass over a block gives each position bit for bit what
// a one-token pass gives there. Parallel work is split by rows or (row, head) pairs only,
// never inside a reduction.
//
// Built once per source, torch, compiler and CPU by serving/lean/build.py.

#include "lean.h"

#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace specops_lean {
namespace {

// Rows per parallel chunk: small passes run on the calling thread (starting the pool costs
// more than they do); the split never changes what a row computes.
inline int64_t grain(int64_t work_per_item) {
  return std::max<int64_t>(1, (int64_t{1} << 15) / std::max<int64_t>(1, work_per_item));
}

at::ScalarType out_type(bool bf16) { return bf16 ? at::kBFloat16 : at::kFloat; }

// ---------------------------------------------------------------------------------------
// x += delta (when given), then out = rms_norm(x) * w, row by row.

template <typename D, typename O>
void add_rms_norm_rows(float* x, const D* delta, const float* w, O* out, int64_t rows,
                       int64_t width, float eps) {
  at::parallel_for(0, rows, grain(width), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      float* row = x + r * width;
      if (delta != nullptr) {
        const D* add = delta + r * width;
        for (int64_t j = 0; j < width; ++j) row[j] += load(add, j);
      }
      float squares = 0.0f;
      for (int64_t j = 0; j < width; ++j) squares += row[j] * row[j];
      const float inverse = 1.0f / std::sqrt(squares / static_cast<float>(width) + eps);
      O* target = out + r * width;
      for (int64_t j = 0; j < width; ++j) store(target, j, row[j] * inverse * w[j]);
    }
  });
}

Tensor add_rms_norm(Tensor x, const c10::optional<Tensor>& delta, Tensor w, double eps,
                    bool bf16) {
  check(x.dim() == 2 && x.is_contiguous() && x.scalar_type() == at::kFloat,
        "x must be a contiguous float32 [rows, width]");
  check(w.is_contiguous() && w.scalar_type() == at::kFloat && w.numel() == x.size(1),
        "w must be float32 [width]");
  const int64_t rows = x.size(0), width = x.size(1);
  Tensor out = at::empty({rows, width}, x.options().dtype(out_type(bf16)));
  const bool has_delta = delta.has_value() && delta->defined();
  Tensor add = has_delta ? delta->contiguous() : Tensor();
  if (has_delta) check(add.numel() == x.numel(), "delta must match x");
  auto run = [&](auto* delta_ptr) {
    if (bf16)
      add_rms_norm_rows(x.data_ptr<float>(), delta_ptr, w.data_ptr<float>(),
                        out.data_ptr<BFloat16>(), rows, width, static_cast<float>(eps));
    else
      add_rms_norm_rows(x.data_ptr<float>(), delta_ptr, w.data_ptr<float>(),
                        out.data_ptr<float>(), rows, width, static_cast<float>(eps));
  };
  if (!has_delta)
    run(static_cast<const float*>(nullptr));
  else if (add.scalar_type() == at::kBFloat16)
    run(static_cast<const BFloat16*>(add.data_ptr<BFloat16>()));
  else
    run(static_cast<const float*>(add.data_ptr<float>()));
  return out;
}

// In place: x += delta.
Tensor add_into(Tensor x, Tensor delta) {
  check(x.is_contiguous() && x.scalar_type() == at::kFloat, "x must be contiguous float32");
  Tensor add = delta.contiguous();
  check(add.numel() == x.numel(), "delta must match x");
  float* row = x.data_ptr<float>();
  const int64_t n = x.numel();
  if (add.scalar_type() == at::kBFloat16) {
    const BFloat16* d = add.data_ptr<BFloat16>();
    for (int64_t j = 0; j < n; ++j) row[j] += static_cast<float>(d[j]);
  } else {
    const float* d = add.data_ptr<float>();
    for (int64_t j = 0; j < n; ++j) row[j] += d[j];
  }
  return x;
}

// ---------------------------------------------------------------------------------------
// silu(gate) * up for a [rows, 2 * inner] gate|up output.

template <typename I, typename O>
void silu_mul_rows(const I* gu, O* out, int64_t rows, int64_t inner) {
  at::parallel_for(0, rows, grain(4 * inner), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const I* gate = gu + r * 2 * inner;
      const I* up = gate + inner;
      O* target = out + r * inner;
      for (int64_t j = 0; j < inner; ++j) {
        const float g = load(gate, j);
        store(target, j, g / (1.0f + std::exp(-g)) * load(up, j));
      }
    }
  });
}

Tensor silu_mul(Tensor gu, bool bf16) {
  check(gu.dim() == 2 && gu.size(1) % 2 == 0, "gate|up must be [rows, 2 * inner]");
  Tensor in = gu.contiguous();
  const int64_t rows = in.size(0), inner = in.size(1) / 2;
  Tensor out = at::empty({rows, inner}, in.options().dtype(out_type(bf16)));
  auto run = [&](auto* src) {
    if (bf16)
      silu_mul_rows(src, out.data_ptr<BFloat16>(), rows, inner);
    else
      silu_mul_rows(src, out.data_ptr<float>(), rows, inner);
  };
  if (in.scalar_type() == at::kBFloat16)
    run(static_cast<const BFloat16*>(in.data_ptr<BFloat16>()));
  else
    run(static_cast<const float*>(in.data_ptr<float>()));
  return out;
}

// ---------------------------------------------------------------------------------------
// Rotary embeddings, the KV write and attention for a packed pass over several sequences.
//
// qkv [N, (heads + 2 * kv_heads) * d]; cos, sin [N, d / 2] (each row's own position);
// keys[s], values[s] [layers, kv_heads, capacity, d] (sequence s's cache); row n of sequence
// s sits at position starts[s] + (n - bounds[s]) and attends to positions 0..its own.

// One (row, head) pair's pieces, each a function so every pair runs the same code.
__attribute__((noinline)) float dot(const float* q, const float* k, int64_t d) {
  float sum = 0.0f;
  for (int64_t j = 0; j < d; ++j) sum += q[j] * k[j];
  return sum;
}
__attribute__((noinline)) void axpy(float p, const float* v, float* acc, int64_t d) {
  for (int64_t j = 0; j < d; ++j) acc[j] += p * v[j];
}

template <typename I, typename O>
void rope_attend_impl(const I* qkv, const float* cos, const float* sin,
                      const std::vector<float*>& keys, const std::vector<float*>& values,
                      const std::vector<int64_t>& starts, const std::vector<int64_t>& bounds,
                      int64_t layer, int64_t capacity, int64_t heads, int64_t kv_heads,
                      int64_t d, float scale, O* out) {
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
  std::vector<float> queries(rows * heads * d);
  auto rotate = [&](const I* src, const float* c, const float* si, float* dst) {
    for (int64_t j = 0; j < half; ++j) {
      const float a = load(src, j), b = load(src, j + half);
      dst[j] = a * c[j] - b * si[j];
      dst[j + half] = b * c[j] + a * si[j];
    }
  };
  // 1. Rotate the queries and keys, write keys and values into their caches (a few
  // thousand multiplies: on this thread).
  {
    for (int64_t n = 0; n < rows; ++n) {
      const I* row = qkv + n * width;
      const float* c = cos + n * half;
      const float* si = sin + n * half;
      for (int64_t h = 0; h < heads; ++h) rotate(row + h * d, c, si, &queries[(n * heads + h) * d]);
      const int64_t layer_base = (layer * kv_heads) * capacity;
      for (int64_t g = 0; g < kv_heads; ++g) {
        const int64_t at_pos = ((layer_base + g * capacity) + pos_of[n]) * d;
        rotate(row + (heads + g) * d, c, si, keys[seq_of[n]] + at_pos);
        float* v = values[seq_of[n]] + at_pos;
        const I* src = row + (heads + kv_heads + g) * d;
        for (int64_t j = 0; j < d; ++j) v[j] = load(src, j);
      }
    }
  }
  // 2. Each head of each sequence sweeps that sequence's cache once for a chunk of up to
  // kChunk of its rows (a verification block is one chunk: the keys and values are read
  // once per pass, not once per row; a long prefill is many, so the scores stay small and
  // the work splits across threads). Each (row, head) pair's arithmetic — its dot
  // products, softmax and weighted sum, positions in order — is the same whatever the rows
  // beside it.
  constexpr int64_t kChunk = 16;
  std::vector<std::array<int64_t, 3>> tasks;  // (sequence, head, first row of the chunk)
  for (int64_t s = 0; s < sequences; ++s)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t c = bounds[s]; c < bounds[s + 1]; c += kChunk) tasks.push_back({s, h, c});
  at::parallel_for(0, static_cast<int64_t>(tasks.size()), 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores, acc, inverse;
    for (int64_t task = begin; task < end; ++task) {
      const auto [s, h, first] = tasks[task];
      const int64_t g = h / group;
      const int64_t count = std::min(kChunk, bounds[s + 1] - first);
      const int64_t start = starts[s] + (first - bounds[s]);  // the chunk's first position
      const int64_t span = start + count;  // positions its last row sees
      const int64_t base = ((layer * kv_heads + g) * capacity) * d;
      const float* k = keys[s] + base;
      const float* v = values[s] + base;
      scores.resize(count * span);
      for (int64_t t = 0; t < span; ++t) {
        const float* kt = k + t * d;
        for (int64_t i = std::max<int64_t>(0, t - start); i < count; ++i)
          scores[i * span + t] = dot(&queries[((first + i) * heads + h) * d], kt, d) * scale;
      }
      acc.assign(count * d, 0.0f);
      inverse.resize(count);
      for (int64_t i = 0; i < count; ++i) {
        float* row = &scores[i * span];
        const int64_t visible = start + i + 1;
        float best = -3.0e38f;
        for (int64_t t = 0; t < visible; ++t) best = row[t] > best ? row[t] : best;
        float total = 0.0f;
        for (int64_t t = 0; t < visible; ++t) {
          row[t] = std::exp(row[t] - best);
          total += row[t];
        }
        inverse[i] = 1.0f / total;
      }
      for (int64_t t = 0; t < span; ++t) {
        const float* vt = v + t * d;
        for (int64_t i = std::max<int64_t>(0, t - start); i < count; ++i)
          axpy(scores[i * span + t], vt, &acc[i * d], d);
      }
      for (int64_t i = 0; i < count; ++i) {
        O* target = out + ((first + i) * heads + h) * d;
        for (int64_t j = 0; j < d; ++j) store(target, j, acc[i * d + j] * inverse[i]);
      }
    }
  });
}

Tensor rope_attend(Tensor qkv, Tensor cos, Tensor sin, at::TensorList keys,
                   at::TensorList values, at::IntArrayRef starts, at::IntArrayRef bounds,
                   int64_t layer, int64_t heads, int64_t kv_heads, double scale, bool bf16) {
  check(qkv.dim() == 2 && qkv.is_contiguous(), "qkv must be contiguous [rows, width]");
  check(keys.size() == values.size() && keys.size() == starts.size() &&
            bounds.size() == starts.size() + 1 && !keys.empty(),
        "one key cache, value cache and start per sequence; bounds one longer");
  check(heads % kv_heads == 0, "heads must be a multiple of kv_heads");
  const int64_t d = keys[0].size(3), capacity = keys[0].size(2);
  check(qkv.size(1) == (heads + 2 * kv_heads) * d, "qkv width must be (heads + 2 kv_heads) d");
  check(bounds.front() == 0 && bounds.back() == qkv.size(0), "bounds must cover the rows");
  check(cos.scalar_type() == at::kFloat && cos.is_contiguous() && sin.is_contiguous() &&
            cos.size(0) == qkv.size(0) && cos.size(1) == d / 2,
        "cos and sin must be contiguous float32 [rows, d / 2]");
  std::vector<float*> key_ptrs, value_ptrs;
  for (size_t s = 0; s < keys.size(); ++s) {
    check(keys[s].is_contiguous() && values[s].is_contiguous() &&
              keys[s].scalar_type() == at::kFloat && keys[s].sizes() == keys[0].sizes() &&
              values[s].sizes() == keys[0].sizes(),
          "caches must be contiguous float32 [layers, kv_heads, capacity, d], all alike");
    check(layer >= 0 && layer < keys[s].size(0) && keys[s].size(1) == kv_heads,
          "layer or kv_heads outside the cache");
    check(starts[s] >= 0 && starts[s] + (bounds[s + 1] - bounds[s]) <= capacity,
          "the pass runs past a cache's capacity");
    key_ptrs.push_back(keys[s].data_ptr<float>());
    value_ptrs.push_back(values[s].data_ptr<float>());
  }
  std::vector<int64_t> start_list(starts.begin(), starts.end());
  std::vector<int64_t> bound_list(bounds.begin(), bounds.end());
  Tensor out = at::empty({qkv.size(0), heads * d}, qkv.options().dtype(out_type(bf16)));
  auto run = [&](auto* src) {
    if (bf16)
      rope_attend_impl(src, cos.data_ptr<float>(), sin.data_ptr<float>(), key_ptrs, value_ptrs,
                       start_list, bound_list, layer, capacity, heads, kv_heads, d,
                       static_cast<float>(scale), out.data_ptr<BFloat16>());
    else
      rope_attend_impl(src, cos.data_ptr<float>(), sin.data_ptr<float>(), key_ptrs, value_ptrs,
                       start_list, bound_list, layer, capacity, heads, kv_heads, d,
                       static_cast<float>(scale), out.data_ptr<float>());
  };
  if (qkv.scalar_type() == at::kBFloat16)
    run(static_cast<const BFloat16*>(qkv.data_ptr<BFloat16>()));
  else
    run(static_cast<const float*>(qkv.data_ptr<float>()));
  return out;
}

// ---------------------------------------------------------------------------------------
// The whole decoder stack without returning to Python between layers, on the integer
// kernels (int4.cpp, int8.cpp: float32 inputs, rounded to int8 inside).
// weights: per layer, in order, the input norm, the q|k|v, output, gate|up and down
// matmuls' two tensors each (tiles and scales) and the
// post-attention norm (10 tensors). x [N, hidden] float32 is the residual stream, updated
// in place and returned (before the final norm).

Tensor stack(Tensor x, at::TensorList weights, int64_t bits, Tensor cos, Tensor sin,
             at::TensorList keys, at::TensorList values, at::IntArrayRef starts,
             at::IntArrayRef bounds, int64_t heads, int64_t kv_heads, double scale, double eps) {
  constexpr size_t per_layer = 10;
  check(bits == 4 || bits == 8, "bits must be 4 or 8");
  check(!weights.empty() && weights.size() % per_layer == 0, "10 weight tensors per layer");
  const int64_t layers = static_cast<int64_t>(weights.size() / per_layer);
  auto matmul = [&](const Tensor& input, const Tensor& codes, const Tensor& scales) {
    return bits == 4 ? int4_mm(input, codes, scales, false) : int8_mm(input, codes, scales, false);
  };
  const bool bf16 = false;  // both integer kernels take float32 and round to int8 themselves
  Tensor h = add_rms_norm(x, c10::nullopt, weights[0], eps, bf16);
  for (int64_t layer = 0; layer < layers; ++layer) {
    const Tensor* w = weights.data() + layer * per_layer;
    Tensor qkv = matmul(h, w[1], w[2]);
    Tensor attended = rope_attend(qkv, cos, sin, keys, values, starts, bounds, layer, heads,
                                  kv_heads, scale, bf16);
    h = add_rms_norm(x, matmul(attended, w[3], w[4]), w[9], eps, bf16);
    Tensor down = matmul(silu_mul(matmul(h, w[5], w[6]), bf16), w[7], w[8]);
    if (layer + 1 < layers)
      h = add_rms_norm(x, down, weights[(layer + 1) * per_layer], eps, bf16);
    else
      add_into(x, down);
  }
  return x;
}

}  // namespace
}  // namespace specops_lean

TORCH_LIBRARY(specops_lean, m) {
  m.def("add_rms_norm(Tensor(a!) x, Tensor? delta, Tensor w, float eps, bool bf16) -> Tensor");
  m.def("add_into(Tensor(a!) x, Tensor delta) -> Tensor(a!)");
  m.def("silu_mul(Tensor gu, bool bf16) -> Tensor");
  m.def(
      "rope_attend(Tensor qkv, Tensor cos, Tensor sin, Tensor[] keys, Tensor[] values, "
      "int[] starts, int[] bounds, int layer, int heads, int kv_heads, float scale, "
      "bool bf16) -> Tensor");
  m.def(
      "stack(Tensor(a!) x, Tensor[] weights, int bits, Tensor cos, Tensor sin, Tensor[] keys, "
      "Tensor[] values, int[] starts, int[] bounds, int heads, int kv_heads, float scale, "
      "float eps) -> Tensor(a!)");
  m.def("int4_mm(Tensor x, Tensor tiles, Tensor scales, bool plain) -> Tensor");
  // Which int4 path this build takes (a string is not a tensor: a plain function).
  m.def("int4_path() -> str", &specops_lean::int4_path);
  m.def("int8_mm(Tensor x, Tensor tiles, Tensor scales, bool plain) -> Tensor");
  m.def("int8_path() -> str", &specops_lean::int8_path);
}

TORCH_LIBRARY_IMPL(specops_lean, CPU, m) {
  using namespace specops_lean;
  m.impl("add_rms_norm", &add_rms_norm);
  m.impl("add_into", &add_into);
  m.impl("silu_mul", &silu_mul);
  m.impl("rope_attend", &rope_attend);
  m.impl("stack", &stack);
  m.impl("int4_mm", &int4_mm);
  m.impl("int8_mm", &int8_mm);
}
