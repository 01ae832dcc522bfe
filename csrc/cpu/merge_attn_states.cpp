// CPU twin of merge_attn_states.cuh: the same per-row rules (merge_row /
// merge_element / merge_n_row from merge_attn_states.h), parallel over
// (token, head) rows.
#include <stdint.h>

#include "cpu_ops.h"

#if defined(_OPENMP)
#include <omp.h>
#endif

namespace mla_ext {
namespace cpu {

int num_threads() {
#if defined(_OPENMP)
  return omp_get_max_threads();
#else
  return 1;
#endif
}

namespace {

template <typename E, typename O>
void merge_typed(const MergeParams& p) {
  using S = typename E::storage;
  using SO = typename O::storage;
  const int64_t rows = p.num_tokens * p.num_heads;
  const int64_t H = p.num_heads, D = p.head_size;
  const int64_t merge_tokens = p.has_prefill_tokens_with_context ? p.prefill_tokens_with_context : p.num_tokens;
  const float inv_scale = O::kScaled ? 1.f / *p.output_scale : 1.f;
#pragma omp parallel for schedule(static) if (rows * D > 32768)
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t t = row / H, h = row % H;
    const float lb = p.suffix_lse[t * p.suffix_lse_stride_token + h * p.suffix_lse_stride_head];
    const S* b = static_cast<const S*>(p.suffix_output) + t * p.suffix_stride_token + h * p.suffix_stride_head;
    SO* o = static_cast<SO*>(p.output) + t * p.output_stride_token + h * p.output_stride_head;
    if (t < merge_tokens) {
      const MergeRow r =
          merge_row(p.prefix_lse[t * p.prefix_lse_stride_token + h * p.prefix_lse_stride_head], lb);
      const S* a = static_cast<const S*>(p.prefix_output) + t * p.prefix_stride_token + h * p.prefix_stride_head;
      // Element-wise read-then-write: safe when output aliases an input.
      for (int64_t d = 0; d < D; ++d) o[d] = O::write(r, a[d], b[d], inv_scale);
      if (p.output_lse != nullptr)
        p.output_lse[t * p.output_lse_stride_token + h * p.output_lse_stride_head] = r.lse;
    } else {
      // Copy the suffix; the prefix is not read.
      const MergeRow r = copy_suffix_row(lb);
      for (int64_t d = 0; d < D; ++d) o[d] = O::write(r, S(), b[d], inv_scale);
      if (p.output_lse != nullptr)
        p.output_lse[t * p.output_lse_stride_token + h * p.output_lse_stride_head] = r.lse;
    }
  }
}

template <typename E>
void merge_dispatch_output(const MergeParams& p) {
  switch (p.output_kind) {
    case MergeOutput::kSameAsInput: merge_typed<E, SameOutput<E>>(p); break;
    case MergeOutput::kFp8E4M3FN: merge_typed<E, Fp8Output<E, false>>(p); break;
    case MergeOutput::kFp8E4M3FNUZ: merge_typed<E, Fp8Output<E, true>>(p); break;
  }
}

// merge_attn_states_n: one row at a time; the head dim in blocks of kBlock
// elements accumulated in fp32 (every state's block is read before the
// output block is written, so the output may alias a state).
template <typename E>
void merge_n_typed(const MergeNParams& p) {
  using S = typename E::storage;
  constexpr int64_t kBlock = 256;
  const int64_t rows = p.num_tokens * p.num_heads;
  const int64_t H = p.num_heads, D = p.head_size, NS = p.num_states;
#pragma omp parallel for schedule(static) if (rows * D * NS > 32768)
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t t = row / H, h = row % H;
    const float* lse_row = p.lses + t * p.lses_stride_token + h * p.lses_stride_head;
    const int64_t lss = p.lses_stride_state;
    const MergeNRow r = merge_n_row(NS, [&](int64_t s) { return lse_row[s * lss]; });
    const S* vrow = static_cast<const S*>(p.values) + t * p.values_stride_token + h * p.values_stride_head;
    S* o = static_cast<S*>(p.output) + t * p.output_stride_token + h * p.output_stride_head;
    const float sink = p.attn_sink != nullptr ? p.attn_sink[h * p.attn_sink_stride] : neg_inf();
    float lse = r.lse;
    if (r.mode == MergeMode::kPrefixOnly && sink == neg_inf()) {
      const S* v = vrow + r.selected * p.values_stride_state;
      for (int64_t d = 0; d < D; ++d) o[d] = v[d];
    } else if (r.mode == MergeMode::kMix || r.mode == MergeMode::kPrefixOnly) {
      float sum = 0.f;
      for (int64_t s = 0; s < NS; ++s) {
        const float l = lse_row[s * lss];
        if (!lse_is_empty(l)) sum += fast_exp(l - r.max_lse);
      }
      const float inv = 1.f / (sum + fast_exp(sink - r.max_lse));
      float acc[kBlock];
      for (int64_t d0 = 0; d0 < D; d0 += kBlock) {
        const int64_t n = D - d0 < kBlock ? D - d0 : kBlock;
        for (int64_t i = 0; i < n; ++i) acc[i] = 0.f;
        for (int64_t s = 0; s < NS; ++s) {
          const float l = lse_row[s * lss];
          if (lse_is_empty(l)) continue;  // empty states are never read
          const float w = fast_exp(l - r.max_lse);
          const S* v = vrow + s * p.values_stride_state + d0;
          for (int64_t i = 0; i < n; ++i) acc[i] += w * E::load(v[i]);
        }
        for (int64_t i = 0; i < n; ++i) o[d0 + i] = E::store(acc[i] * inv);
      }
      lse = r.max_lse + fast_log(sum);
    } else {
      const S fill = E::store(r.mode == MergeMode::kZero ? 0.f : quiet_nan());
      for (int64_t d = 0; d < D; ++d) o[d] = fill;
    }
    if (p.output_lse != nullptr) p.output_lse[t * p.output_lse_stride_token + h * p.output_lse_stride_head] = lse;
  }
}

}  // namespace

void merge_attn_states(const MergeParams& p) {
  if (p.num_tokens <= 0 || p.num_heads <= 0 || p.head_size <= 0) return;
  switch (p.dtype) {
    case DType::kFloat32: merge_dispatch_output<Float32Elem>(p); break;
    case DType::kFloat16: merge_dispatch_output<Float16Elem>(p); break;
    case DType::kBFloat16: merge_dispatch_output<BFloat16Elem>(p); break;
  }
}

void merge_attn_states_n(const MergeNParams& p) {
  if (p.num_states <= 0 || p.num_tokens <= 0 || p.num_heads <= 0 || p.head_size <= 0) return;
  switch (p.dtype) {
    case DType::kFloat32: merge_n_typed<Float32Elem>(p); break;
    case DType::kFloat16: merge_n_typed<Float16Elem>(p); break;
    case DType::kBFloat16: merge_n_typed<BFloat16Elem>(p); break;
  }
}

}  // namespace cpu
}  // namespace mla_ext
