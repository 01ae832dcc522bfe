// CPU twin of merge_attn_states.cuh: the same per-row rule (merge_row /
// merge_element from merge_attn_states.h), parallel over (token, head) rows.
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

template <typename E>
void merge_typed(const MergeParams& p) {
  using S = typename E::storage;
  const int64_t rows = p.num_tokens * p.num_heads;
  const int64_t H = p.num_heads, D = p.head_size;
#pragma omp parallel for schedule(static) if (rows * D > 32768)
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t t = row / H, h = row % H;
    const MergeRow r = merge_row(
        p.prefix_lse[t * p.prefix_lse_stride_token + h * p.prefix_lse_stride_head],
        p.suffix_lse[t * p.suffix_lse_stride_token + h * p.suffix_lse_stride_head]);
    const S* a = static_cast<const S*>(p.prefix_output) + t * p.prefix_stride_token + h * p.prefix_stride_head;
    const S* b = static_cast<const S*>(p.suffix_output) + t * p.suffix_stride_token + h * p.suffix_stride_head;
    S* o = static_cast<S*>(p.output) + t * p.output_stride_token + h * p.output_stride_head;
    // Element-wise read-then-write: safe when output aliases an input.
    for (int64_t d = 0; d < D; ++d) o[d] = merge_element<E>(r, a[d], b[d]);
    if (p.output_lse != nullptr)
      p.output_lse[t * p.output_lse_stride_token + h * p.output_lse_stride_head] = r.lse;
  }
}

}  // namespace

void merge_attn_states(const MergeParams& p) {
  if (p.num_tokens <= 0 || p.num_heads <= 0 || p.head_size <= 0) return;
  switch (p.dtype) {
    case DType::kFloat32: merge_typed<Float32Elem>(p); break;
    case DType::kFloat16: merge_typed<Float16Elem>(p); break;
    case DType::kBFloat16: merge_typed<BFloat16Elem>(p); break;
  }
}

}  // namespace cpu
}  // namespace mla_ext
