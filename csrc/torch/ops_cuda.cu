// CUDA (and, hipified, ROCm) implementations of the ops (LibTorch stable ABI).
// Launches on the caller's current stream; allocates nothing; never syncs.
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/accelerator.h>

#include "common.h"
#include "mla_ext/merge_attn_states.cuh"

namespace mla_ext_torch {

namespace {

// Current stream of `device_index` as the runtime's stream type.
mla_ext::gpuStream_t current_stream(int32_t device_index) {
  void* stream = nullptr;
  TORCH_ERROR_CODE_CHECK(aoti_torch_get_current_cuda_stream(device_index, &stream));
  return static_cast<mla_ext::gpuStream_t>(stream);
}

// Multiprocessor count per device, read once (the current device is guarded).
int sm_count(int32_t device_index) {
  static int cache[256] = {0};
  if (device_index < 0 || device_index >= 256) return mla_ext::current_device_sm_count();
  if (cache[device_index] == 0) cache[device_index] = mla_ext::current_device_sm_count();
  return cache[device_index];
}

void check_status(mla_ext::Status s, const char* op) {
  if (s == mla_ext::Status::kSuccess) return;
  const char* detail = s == mla_ext::Status::kLaunchFailed ? mlaGetErrorString(mlaGetLastError()) : "";
  STD_TORCH_CHECK(false, op, ": ", mla_ext::status_string(s), " ", detail);
}

}  // namespace

void merge_attn_states_cuda(Tensor output, std::optional<Tensor> output_lse, Tensor prefix_output,
                            Tensor prefix_lse, Tensor suffix_output, Tensor suffix_lse) {
  const mla_ext::MergeParams p =
      make_merge_params(output, output_lse, prefix_output, prefix_lse, suffix_output, suffix_lse);
  if (p.num_tokens == 0 || p.num_heads == 0 || p.head_size == 0) return;
  const int32_t dev = output.get_device_index();
  torch::stable::accelerator::DeviceGuard guard(dev);
  check_status(mla_ext::launch_merge_attn_states(p, sm_count(dev), current_stream(dev)),
               "merge_attn_states");
}

}  // namespace mla_ext_torch

STABLE_TORCH_LIBRARY_IMPL(mla_ext, CUDA, m) {
  m.impl("merge_attn_states", TORCH_BOX(&mla_ext_torch::merge_attn_states_cuda));
}
