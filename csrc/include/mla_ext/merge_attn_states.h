// merge_attn_states: parameters and the per-row combine rule (DESIGN.md §3).
//
// Shared verbatim by the GPU kernel (merge_attn_states.cuh) and the CPU twin
// (csrc/cpu/merge_attn_states.cpp), so both implement one rule. No GPU or torch
// includes here.
#pragma once

#include <math.h>
#include <stdint.h>

#include "mla_ext/numerics.h"

namespace mla_ext {

enum class DType : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

inline int dtype_size(DType d) { return d == DType::kFloat32 ? 4 : 2; }

// All strides are in elements of the tensor they belong to, 64-bit.
// Values: [num_tokens, num_heads, head_size], last dim contiguous.
// LSE: [num_tokens, num_heads] fp32, any strides (natural log).
struct MergeParams {
  DType dtype = DType::kBFloat16;
  int64_t num_tokens = 0;
  int64_t num_heads = 0;
  int64_t head_size = 0;

  void* output = nullptr;
  int64_t output_stride_token = 0, output_stride_head = 0;
  float* output_lse = nullptr;  // optional
  int64_t output_lse_stride_token = 0, output_lse_stride_head = 0;

  const void* prefix_output = nullptr;
  int64_t prefix_stride_token = 0, prefix_stride_head = 0;
  const float* prefix_lse = nullptr;
  int64_t prefix_lse_stride_token = 0, prefix_lse_stride_head = 0;

  const void* suffix_output = nullptr;
  int64_t suffix_stride_token = 0, suffix_stride_head = 0;
  const float* suffix_lse = nullptr;
  int64_t suffix_lse_stride_token = 0, suffix_lse_stride_head = 0;
};

// How one (token, head) row is combined.
enum class MergeMode : int {
  kMix = 0,         // out = wp * prefix + ws * suffix
  kPrefixOnly = 1,  // suffix empty: out = prefix exactly
  kSuffixOnly = 2,  // prefix empty: out = suffix exactly
  kZero = 3,        // both empty: out = 0
  kNaN = 4,         // an LSE is NaN: out = NaN
};

struct MergeRow {
  MergeMode mode;
  float prefix_weight;  // valid for kMix
  float suffix_weight;  // valid for kMix
  float lse;            // the merged LSE
};

// The combine rule for one row from the two LSEs. +inf means "no keys" (the
// convention of some attention libraries) and is treated like -inf. An empty
// side is *selected away*, never multiplied by a zero weight, so NaN or garbage
// in its values cannot reach the output.
MLA_EXT_HD MergeRow merge_row(float prefix_lse, float suffix_lse) {
  const float inf = pos_inf();
  float a = prefix_lse == inf ? -inf : prefix_lse;
  float b = suffix_lse == inf ? -inf : suffix_lse;
  MergeRow r;
  r.prefix_weight = 0.f;
  r.suffix_weight = 0.f;
  if (is_nan(a) || is_nan(b)) {
    r.mode = MergeMode::kNaN;
    r.lse = quiet_nan();
  } else if (a == -inf && b == -inf) {
    r.mode = MergeMode::kZero;
    r.lse = -inf;
  } else if (b == -inf) {
    r.mode = MergeMode::kPrefixOnly;
    r.lse = a;
  } else if (a == -inf) {
    r.mode = MergeMode::kSuffixOnly;
    r.lse = b;
  } else {
    float m = a > b ? a : b;
    float wa = fast_exp(a - m);
    float wb = fast_exp(b - m);
    float sum = wa + wb;
    float inv = 1.f / sum;
    r.mode = MergeMode::kMix;
    r.prefix_weight = wa * inv;
    r.suffix_weight = wb * inv;
    r.lse = m + fast_log(sum);
  }
  return r;
}

// Element storage and conversion per dtype (bf16/fp16 carried as bits).
struct Float32Elem {
  using storage = float;
  MLA_EXT_HD static float load(storage v) { return v; }
  MLA_EXT_HD static storage store(float v) { return v; }
};
struct BFloat16Elem {
  using storage = uint16_t;
  MLA_EXT_HD static float load(storage v) { return bf16_to_float(v); }
  MLA_EXT_HD static storage store(float v) { return float_to_bf16(v); }
};
struct Float16Elem {
  using storage = uint16_t;
  MLA_EXT_HD static float load(storage v) { return fp16_to_float(v); }
  MLA_EXT_HD static storage store(float v) { return float_to_fp16(v); }
};

// One output element of a row under `r`. Selected sides are copied bit-exactly.
template <typename E>
MLA_EXT_HD typename E::storage merge_element(const MergeRow& r, typename E::storage p,
                                             typename E::storage s) {
  switch (r.mode) {
    case MergeMode::kPrefixOnly: return p;
    case MergeMode::kSuffixOnly: return s;
    case MergeMode::kZero: return E::store(0.f);
    case MergeMode::kNaN: return E::store(quiet_nan());
    default: return E::store(E::load(p) * r.prefix_weight + E::load(s) * r.suffix_weight);
  }
}

}  // namespace mla_ext
