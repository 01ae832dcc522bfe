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

}  // namespace cpu
}  // namespace mla_ext
