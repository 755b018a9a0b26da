// The lean decode step's fused ops (serving/lean): everything in a Llama decoder layer but
// its matmuls and attention (attend.cpp), each one call, each computing a row exactly as it
// would alone; the whole stack in one call; a draft head's greedy draft in one call; the ops'
// registration.
//
// Row invariance is the point: every output row is computed by the same code in the same order whatever the number of rows that
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

// ---------------------------------------------------------------------------------------
// A draft head's greedy drafts in one call (serving/lean/head_step.py), every matmul on the
// integer kernels of `bits`. From the predicted feature f [1, hidden], k rounds of: the
// logits over the head's vocabulary (out), their argmax (the first of equal maxima, as
// torch's), and but for the last round the head fed (f, that draft) at position start + i:
// fc over [f | embed[draft]] (+ bias), the block (`block`: stack's 10 tensors), the final
// norm (when given) -> the next f. The KV rows it writes are the caller's to rewind.
// Returns the k argmax indices into the head's vocabulary (int64).

Tensor head_draft(Tensor feature, int64_t k, const c10::optional<Tensor>& vocab_ids,
                  Tensor embed, Tensor fc_tiles, Tensor fc_scales,
                  const c10::optional<Tensor>& fc_bias, at::TensorList block, int64_t bits,
                  const c10::optional<Tensor>& final_norm, Tensor out_tiles, Tensor out_scales,
                  Tensor cos, Tensor sin, Tensor keys, Tensor values, int64_t start,
                  int64_t heads, int64_t kv_heads, double scale, double eps) {
  check(bits == 4 || bits == 8, "bits must be 4 or 8");
  check(k >= 1, "k must be >= 1");
  check(feature.dim() == 2 && feature.size(0) == 1 && feature.scalar_type() == at::kFloat,
        "feature must be float32 [1, hidden]");
  auto matmul = [&](const Tensor& input, const Tensor& codes, const Tensor& scales) {
    return bits == 4 ? int4_mm(input, codes, scales, false) : int8_mm(input, codes, scales, false);
  };
  const bool reduced = vocab_ids.has_value() && vocab_ids->defined();
  Tensor drafts = at::empty({k}, feature.options().dtype(at::kLong));
  int64_t* out = drafts.data_ptr<int64_t>();
  Tensor f = feature.contiguous();
  std::array<Tensor, 1> key_list{keys};
  std::array<Tensor, 1> value_list{values};
  for (int64_t i = 0; i < k; ++i) {
    Tensor logits = matmul(f, out_tiles, out_scales).contiguous();  // [1, vocab]
    const float* row = logits.data_ptr<float>();
    const int64_t width = logits.size(1);
    int64_t best = 0;
    for (int64_t j = 1; j < width; ++j)
      if (row[j] > row[best]) best = j;
    out[i] = best;
    if (i + 1 == k) break;
    const int64_t token = reduced ? vocab_ids->data_ptr<int64_t>()[best] : best;
    Tensor x = matmul(at::cat({f, embed.narrow(0, token, 1)}, 1), fc_tiles, fc_scales);
    if (fc_bias.has_value() && fc_bias->defined()) x.add_(*fc_bias);
    x = x.contiguous();
    const int64_t position = start + i;
    std::array<int64_t, 1> starts{position};
    std::array<int64_t, 2> bounds{0, 1};
    stack(x, block, bits, cos.narrow(0, position, 1), sin.narrow(0, position, 1), key_list,
          value_list, starts, bounds, heads, kv_heads, scale, eps);
    f = (final_norm.has_value() && final_norm->defined())
            ? add_rms_norm(x, c10::nullopt, *final_norm, eps, false)
            : x;
  }
  return drafts;
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
  m.def(
      "head_draft(Tensor feature, int k, Tensor? vocab_ids, Tensor embed, Tensor fc_tiles, "
      "Tensor fc_scales, Tensor? fc_bias, Tensor[] block, int bits, Tensor? final_norm, "
      "Tensor out_tiles, Tensor out_scales, Tensor cos, Tensor sin, Tensor(a!) keys, "
      "Tensor(b!) values, int start, int heads, int kv_heads, float scale, float eps) -> Tensor");
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
  m.impl("head_draft", &head_draft);
  m.impl("int4_mm", &int4_mm);
  m.impl("int8_mm", &int8_mm);
}
