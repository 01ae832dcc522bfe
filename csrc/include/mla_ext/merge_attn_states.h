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

// Output element type of merge_attn_states (the inputs stay fp32/fp16/bf16).
enum class MergeOutput : int32_t {
  kSameAsInput = 0,  // output dtype = input dtype
  kFp8E4M3FN = 1,    // OCP e4m3fn (NVIDIA, gfx950), saturated to +-448
  kFp8E4M3FNUZ = 2,  // e4m3fnuz (gfx942), saturated to +-240
};

inline int merge_output_size(DType in, MergeOutput out) {
  return out == MergeOutput::kSameAsInput ? dtype_size(in) : 1;
}

// All strides are in elements of the tensor they belong to, 64-bit.
// Values: [num_tokens, num_heads, head_size], last dim contiguous; head_size
// below 2^31 (the GPU launcher returns kInvalidArgument otherwise).
// LSE: [num_tokens, num_heads] fp32, any strides (natural log).
struct MergeParams {
  DType dtype = DType::kBFloat16;
  int64_t num_tokens = 0;
  int64_t num_heads = 0;
  int64_t head_size = 0;

  void* output = nullptr;
  int64_t output_stride_token = 0, output_stride_head = 0;
  float* output_lse = nullptr;  // optional; must share no element with prefix_lse / suffix_lse
  int64_t output_lse_stride_token = 0, output_lse_stride_head = 0;

  const void* prefix_output = nullptr;
  int64_t prefix_stride_token = 0, prefix_stride_head = 0;
  const float* prefix_lse = nullptr;
  int64_t prefix_lse_stride_token = 0, prefix_lse_stride_head = 0;

  const void* suffix_output = nullptr;
  int64_t suffix_stride_token = 0, suffix_stride_head = 0;
  const float* suffix_lse = nullptr;
  int64_t suffix_lse_stride_token = 0, suffix_lse_stride_head = 0;

  // ---- appended in C API version 2; all-zero keeps the version 1 behaviour ----
  // Output element type: the input dtype, or FP8 e4m3 scaled by `output_scale`
  // (out = saturate(merged / scale), computed as merged * (1 / scale)).
  MergeOutput output_kind = MergeOutput::kSameAsInput;
  // Nonzero: tokens t >= prefill_tokens_with_context (>= 0) copy the suffix
  // (values and LSE, the prefix is not read) instead of merging; zero: every
  // token merges.
  int32_t has_prefill_tokens_with_context = 0;
  int64_t prefill_tokens_with_context = 0;
  // FP8 outputs: one fp32 per-tensor scale, read from memory (device memory on
  // the GPU) by the kernel, so a captured graph replays with a new scale.
  const float* output_scale = nullptr;
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

// A token at or after prefill_tokens_with_context: the suffix is copied as is
// (its LSE verbatim, +inf and NaN included); the prefix is not read.
MLA_EXT_HD MergeRow copy_suffix_row(float suffix_lse) {
  MergeRow r;
  r.mode = MergeMode::kSuffixOnly;
  r.prefix_weight = 0.f;
  r.suffix_weight = 0.f;
  r.lse = suffix_lse;
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
  // Two values rounded at once: low half = lo (one instruction on sm_80+).
  MLA_EXT_HD static uint32_t store2(float lo, float hi) { return pack_bf16x2(lo, hi); }
};
struct Float16Elem {
  using storage = uint16_t;
  MLA_EXT_HD static float load(storage v) { return fp16_to_float(v); }
  MLA_EXT_HD static storage store(float v) { return float_to_fp16(v); }
  MLA_EXT_HD static uint32_t store2(float lo, float hi) {
    return uint32_t(float_to_fp16(lo)) | (uint32_t(float_to_fp16(hi)) << 16);
  }
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

// The merged value of one element as fp32 (the FP8 output path quantises it).
template <typename E>
MLA_EXT_HD float merge_value(const MergeRow& r, typename E::storage p, typename E::storage s) {
  switch (r.mode) {
    case MergeMode::kPrefixOnly: return E::load(p);
    case MergeMode::kSuffixOnly: return E::load(s);
    case MergeMode::kZero: return 0.f;
    case MergeMode::kNaN: return quiet_nan();
    default: return E::load(p) * r.prefix_weight + E::load(s) * r.suffix_weight;
  }
}

// Output element writers. `inv_scale` is 1 / output_scale (FP8 only).
// write: one element under any mode; from_float: a merged fp32 value (kMix).
template <typename E>
struct SameOutput {  // output dtype = input dtype; selected sides bit-exact
  using storage = typename E::storage;
  static constexpr bool kScaled = false;
  MLA_EXT_HD static storage from_float(float v, float) { return E::store(v); }
  MLA_EXT_HD static storage write(const MergeRow& r, typename E::storage p, typename E::storage s, float) {
    return merge_element<E>(r, p, s);
  }
};
template <typename E, bool FNUZ>
struct Fp8Output {  // saturate(merged * inv_scale) as e4m3fn / e4m3fnuz
  using storage = uint8_t;
  static constexpr bool kScaled = true;
  MLA_EXT_HD static storage from_float(float v, float inv_scale) {
    return float_to_fp8_e4m3_sat<FNUZ>(v * inv_scale);
  }
  MLA_EXT_HD static storage write(const MergeRow& r, typename E::storage p, typename E::storage s,
                                  float inv_scale) {
    return from_float(merge_value<E>(r, p, s), inv_scale);
  }
};

// ---------------------------------------------------------------------------
// merge_attn_states_n: S partial states over disjoint key sets at once.
//
//   values [S, T, H, D] (any state/token/head strides, last dim contiguous),
//   lses [S, T, H] fp32 (any strides); output [T, H, D] of the values' dtype,
//   output_lse [T, H] fp32 optional. Rule per (t, h), with +inf read as -inf:
//     any lse NaN             -> output NaN, lse NaN
//     every state empty       -> output 0, lse -inf
//     exactly one non-empty   -> that state's values copied exactly, its lse
//     otherwise               m = max lse, w_s = exp(lse_s - m) over the
//                             non-empty states (empty ones are never read),
//                             output = sum w_s v_s / sum w_s, lse = m + log(sum w_s)
// Optional attention sink (DeepSeek V4), one fp32 logit per head: the
// denominator gains exp(sink[h] - m) exactly as in sparse_mla_decode, the LSE
// excludes it: output = sum w_s v_s / (sum w_s + exp(sink[h] - m)). With
// partial states that each ran *without* the sink, this equals a single
// decode over the union *with* it (the sink enters once). A one-state row is
// then scaled rather than copied (unless the sink is -inf); every-state-empty
// rows stay 0 / -inf.
// ---------------------------------------------------------------------------
struct MergeNParams {
  DType dtype = DType::kBFloat16;
  int64_t num_states = 0;
  int64_t num_tokens = 0;
  int64_t num_heads = 0;
  int64_t head_size = 0;

  void* output = nullptr;
  int64_t output_stride_token = 0, output_stride_head = 0;
  float* output_lse = nullptr;  // optional; must share no element with lses
  int64_t output_lse_stride_token = 0, output_lse_stride_head = 0;

  const void* values = nullptr;
  int64_t values_stride_state = 0, values_stride_token = 0, values_stride_head = 0;
  const float* lses = nullptr;
  int64_t lses_stride_state = 0, lses_stride_token = 0, lses_stride_head = 0;

  const float* attn_sink = nullptr;  // optional [num_heads] fp32 logits
  int64_t attn_sink_stride = 0;
};

struct MergeNRow {
  MergeMode mode;    // kMix, kZero, kNaN, or kPrefixOnly meaning "select state `selected`"
  int64_t selected;  // the only non-empty state (kPrefixOnly)
  float max_lse;     // kMix: the largest lse
  float lse;         // kZero / kNaN / kPrefixOnly: the merged lse
};

MLA_EXT_HD bool lse_is_empty(float l) { return l == neg_inf() || l == pos_inf(); }

// First pass over one row's S LSEs (`lse_at(s)` reads state s). The values
// are read afterwards, once, by the caller.
template <typename LseAt>
MLA_EXT_HD MergeNRow merge_n_row(int64_t num_states, const LseAt& lse_at) {
  MergeNRow r;
  r.mode = MergeMode::kZero;
  r.selected = 0;
  r.max_lse = neg_inf();
  r.lse = neg_inf();
  int64_t count = 0;
  bool nan = false;
  for (int64_t s = 0; s < num_states; ++s) {
    const float l = lse_at(s);
    if (is_nan(l)) {
      nan = true;
    } else if (!lse_is_empty(l)) {
      ++count;
      r.selected = s;
      r.max_lse = l > r.max_lse ? l : r.max_lse;
    }
  }
  if (nan) {
    r.mode = MergeMode::kNaN;
    r.lse = quiet_nan();
  } else if (count == 1) {
    r.mode = MergeMode::kPrefixOnly;
    r.lse = r.max_lse;
  } else if (count > 1) {
    r.mode = MergeMode::kMix;
  }
  return r;
}

}  // namespace mla_ext
