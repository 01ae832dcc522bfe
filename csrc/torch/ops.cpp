// Op schemas and CPU implementations (LibTorch stable ABI).
//
// Every op validates all of its arguments (common.h) before anything is
// launched or written, then calls the torch-free implementation.
#include "common.h"
#include "cpu_ops.h"

namespace mla_ext_torch {

void merge_attn_states_cpu(Tensor output, std::optional<Tensor> output_lse, Tensor prefix_output,
                           Tensor prefix_lse, Tensor suffix_output, Tensor suffix_lse) {
  const mla_ext::MergeParams p =
      make_merge_params(output, output_lse, prefix_output, prefix_lse, suffix_output, suffix_lse);
  mla_ext::cpu::merge_attn_states(p);
}

}  // namespace mla_ext_torch

STABLE_TORCH_LIBRARY(mla_ext, m) {
  // Argument order as vLLM's merge_attn_states so engines can swap it in.
  m.def(
      "merge_attn_states(Tensor(a!) output, Tensor(b!)? output_lse, Tensor prefix_output, "
      "Tensor prefix_lse, Tensor suffix_output, Tensor suffix_lse) -> ()");
}

STABLE_TORCH_LIBRARY_IMPL(mla_ext, CPU, m) {
  m.impl("merge_attn_states", TORCH_BOX(&mla_ext_torch::merge_attn_states_cpu));
}
