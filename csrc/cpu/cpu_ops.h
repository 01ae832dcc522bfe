// CPU twins of the GPU kernels: same params structs, same semantics (plain C++17 + OpenMP).
#pragma once

#include <stddef.h>

#include "mla_ext/merge_attn_states.h"
#include "mla_ext/sparse_mla_decode.h"

namespace mla_ext {
namespace cpu {

// Number of worker threads the CPU implementation uses (its "processor count").
int num_threads();

void merge_attn_states(const MergeParams& p);
// S-way merge (merge_attn_states.h); p.num_states >= 1.
void merge_attn_states_n(const MergeNParams& p);

// sparse_mla_decode (DESIGN.md §4). p.num_splits must be resolved (1..kMaxSplits);
// with num_splits > 1, `workspace` holds decode_workspace_size(T, H, num_splits)
// bytes (any contents on entry; the layout of sparse_mla_decode.h). The caller
// validated p (csrc/torch/decode_params.h).
void sparse_mla_decode(const SparseDecodeParams& p, void* workspace);

}  // namespace cpu
}  // namespace mla_ext
