// Op schemas and CPU implementations (LibTorch stable ABI).
//
// Every op validates all of its arguments (common.h, decode_params.h) before
// anything is launched or written, then calls the torch-free implementation.
#include "common.h"
#include "cpu_ops.h"
#include "decode_params.h"

#if defined(MLA_EXT_WITH_GPU)
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/accelerator.h>

#include "gpu_ops.h"
#endif

namespace mla_ext_torch {

void merge_attn_states_cpu(Tensor output, std::optional<Tensor> output_lse, Tensor prefix_output,
                           Tensor prefix_lse, Tensor suffix_output, Tensor suffix_lse,
                           std::optional<int64_t> prefill_tokens_with_context, std::optional<Tensor> output_scale) {
  const mla_ext::MergeParams p = make_merge_params(output, output_lse, prefix_output, prefix_lse, suffix_output,
                                                   suffix_lse, prefill_tokens_with_context, output_scale);
  mla_ext::cpu::merge_attn_states(p);
}

void merge_attn_states_n_cpu(Tensor output, std::optional<Tensor> output_lse, Tensor values, Tensor lses,
                             std::optional<Tensor> attn_sink) {
  const mla_ext::MergeNParams p = make_merge_n_params(output, output_lse, values, lses, attn_sink);
  mla_ext::cpu::merge_attn_states_n(p);
}

void sparse_mla_decode_cpu(Tensor q, Tensor kv_cache, Tensor indices, std::string kv_format,
                           double softmax_scale, Tensor output, Tensor workspace,
                           std::optional<Tensor> lengths, std::optional<Tensor> extra_kv_cache,
                           std::optional<Tensor> extra_indices, std::optional<Tensor> extra_lengths,
                           std::optional<Tensor> attn_sink, std::optional<Tensor> lse, int64_t num_splits) {
  const mla_ext::SparseDecodeParams p = make_decode_params(
      q, kv_cache, indices, kv_format, softmax_scale, output, workspace, lengths, extra_kv_cache,
      extra_indices, extra_lengths, attn_sink, lse, num_splits, [] { return mla_ext::cpu::num_threads(); });
  mla_ext::cpu::sparse_mla_decode(p, workspace.data_ptr());
}

#if defined(MLA_EXT_WITH_GPU)
namespace {

// Current CUDA/HIP stream of `device` from torch's stable C shim.
void* current_stream(int32_t device) {
  void* stream = nullptr;
  TORCH_ERROR_CODE_CHECK(aoti_torch_get_current_cuda_stream(device, &stream));
  return stream;
}

// Makes `device` current for the scope, without the guard object's cost (a heap
// allocation and device queries through the shim) when it already is: the
// common case, which matters for a ~10 us eager call.
class DeviceGuardIfNeeded {
 public:
  explicit DeviceGuardIfNeeded(int32_t device) {
    if (torch::stable::accelerator::getCurrentDeviceIndex() != device) guard_.emplace(device);
  }

 private:
  std::optional<torch::stable::accelerator::DeviceGuard> guard_;
};

void check_launch_status(int status, const char* op) {
  if (status == int(mla_ext::Status::kSuccess)) return;
  const char* detail = status == int(mla_ext::Status::kLaunchFailed) ? mla_ext_gpu::last_error_string() : "";
  fail(op, ": ", mla_ext::status_string(mla_ext::Status(status)), " ", detail);
}

int cuda_processor_count(int64_t device_index) {
  const int n = mla_ext_gpu::processor_count(int(device_index));
  MLA_CHECK(n > 0, "sparse_mla_decode_workspace_size", "expected a valid CUDA device index, got ",
            device_index);
  return n;
}

// The GPU kernel's alignment needs (sparse_mla_decode.cuh), checked before the
// launch so a violation names the argument.
void check_decode_gpu_alignment(const mla_ext::SparseDecodeParams& p) {
  const char* op = "sparse_mla_decode";
  auto a16 = [](const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15u) == 0; };
  MLA_CHECK(a16(p.q) && (p.q_stride_token % 8) == 0 && (p.q_stride_head % 8) == 0, op,
            "expected q rows 16-byte aligned on the GPU (data pointer 16-byte aligned, token and head strides "
            "multiples of 8 elements), got strides (", p.q_stride_token, ", ", p.q_stride_head, ")");
  auto check_set = [&](const mla_ext::KvSet& s, const char* name) {
    if (s.cache == nullptr) return;
    MLA_CHECK(a16(s.cache) && (s.page_stride_bytes % 16) == 0, op, "expected ", name,
              " 16-byte aligned on the GPU (data pointer and page stride), got a page stride of ",
              s.page_stride_bytes, " bytes");
    MLA_CHECK(mla_ext::kv_layout(p.kv_format) == mla_ext::KvFormat::kFP8DsMlaV4 ||
                  (s.token_stride_bytes % 16) == 0,
              op, "expected ", name, " token stride to be a multiple of 16 bytes on the GPU, got ",
              s.token_stride_bytes, " bytes");
  };
  check_set(p.main, "kv_cache");
  check_set(p.extra, "extra_kv_cache");
}

}  // namespace

void merge_attn_states_cuda(Tensor output, std::optional<Tensor> output_lse, Tensor prefix_output,
                            Tensor prefix_lse, Tensor suffix_output, Tensor suffix_lse,
                            std::optional<int64_t> prefill_tokens_with_context, std::optional<Tensor> output_scale) {
  const mla_ext::MergeParams p = make_merge_params(output, output_lse, prefix_output, prefix_lse, suffix_output,
                                                   suffix_lse, prefill_tokens_with_context, output_scale);
  if (p.num_tokens == 0 || p.num_heads == 0 || p.head_size == 0) return;
  const int32_t dev = output.get_device_index();
  const DeviceGuardIfNeeded guard(dev);
  check_launch_status(mla_ext_gpu::launch_merge_attn_states(p, dev, current_stream(dev)),
                      "merge_attn_states");
}

void merge_attn_states_n_cuda(Tensor output, std::optional<Tensor> output_lse, Tensor values, Tensor lses,
                             std::optional<Tensor> attn_sink) {
  const mla_ext::MergeNParams p = make_merge_n_params(output, output_lse, values, lses, attn_sink);
  if (p.num_tokens == 0 || p.num_heads == 0 || p.head_size == 0) return;
  const int32_t dev = output.get_device_index();
  const DeviceGuardIfNeeded guard(dev);
  check_launch_status(mla_ext_gpu::launch_merge_attn_states_n(p, dev, current_stream(dev)),
                      "merge_attn_states_n");
}

void sparse_mla_decode_cuda(Tensor q, Tensor kv_cache, Tensor indices, std::string kv_format,
                            double softmax_scale, Tensor output, Tensor workspace,
                            std::optional<Tensor> lengths, std::optional<Tensor> extra_kv_cache,
                            std::optional<Tensor> extra_indices, std::optional<Tensor> extra_lengths,
                            std::optional<Tensor> attn_sink, std::optional<Tensor> lse, int64_t num_splits) {
  // q is queried only after make_decode_params checked it is defined (None).
  const mla_ext::SparseDecodeParams p = make_decode_params(
      q, kv_cache, indices, kv_format, softmax_scale, output, workspace, lengths, extra_kv_cache,
      extra_indices, extra_lengths, attn_sink, lse, num_splits,
      [&] { return mla_ext_gpu::processor_count(q.get_device_index()); },
      [&](const mla_ext::SparseDecodeParams& pp) { return mla_ext_gpu::decode_wide16_rows(pp, q.get_device_index()); });
  const int32_t dev = q.get_device_index();
  if (p.num_tokens == 0 || p.num_heads == 0) return;
  check_decode_gpu_alignment(p);
  const DeviceGuardIfNeeded guard(dev);
  check_launch_status(mla_ext_gpu::launch_sparse_mla_decode(p, workspace.data_ptr(), size_t(workspace.numel()),
                                                            dev, current_stream(dev), num_splits == 0),
                      "sparse_mla_decode");
}

// Test only: see mla_ext_gpu::launch_test_late_fill.
void test_late_fill_cuda(Tensor out, double value, int64_t delay_ns) {
  const char* op = "_test_late_fill";
  check_defined(op, out, "out");
  MLA_CHECK(out.scalar_type() == ScalarType::Float && out.is_contiguous(), op,
            "expected a contiguous float32 out");
  MLA_CHECK(delay_ns >= 0 && delay_ns <= 1000000000, op, "expected 0 <= delay_ns <= 1e9, got ", delay_ns);
  const int32_t dev = out.get_device_index();
  const DeviceGuardIfNeeded guard(dev);
  check_launch_status(mla_ext_gpu::launch_test_late_fill(static_cast<float*>(out.data_ptr()), out.numel(),
                                                         float(value), delay_ns, current_stream(dev)),
                      op);
}
#endif  // MLA_EXT_WITH_GPU

// Bytes of workspace for any call with <= num_tokens tokens and <= num_heads
// heads under this split setting, on the CPU (device_index -1) or a CUDA device.
int64_t sparse_mla_decode_workspace_size(int64_t num_tokens, int64_t num_heads, int64_t num_splits,
                                         int64_t device_index) {
  const char* op = "sparse_mla_decode_workspace_size";
  MLA_CHECK(num_tokens >= 0, op, "expected num_tokens >= 0, got ", num_tokens);
  MLA_CHECK(num_heads >= 0, op, "expected num_heads >= 0, got ", num_heads);
  MLA_CHECK(num_splits >= 0 && num_splits <= mla_ext::kMaxSplits, op,
            "expected num_splits to be 0 (automatic) or 1..", mla_ext::kMaxSplits, ", got ", num_splits);
  MLA_CHECK(device_index >= -1, op, "expected device_index -1 (CPU) or a CUDA device index, got ",
            device_index);
  // 2^43 (token, head) cells x 256 splits x 2052 bytes stays below 2^62: the byte count cannot wrap.
  MLA_CHECK(num_heads == 0 || num_tokens <= (int64_t(1) << 43) / num_heads, op,
            "expected num_tokens x num_heads <= 2^43, got ", num_tokens, " x ", num_heads);
  int procs = 1;
  if (device_index < 0) {
    procs = mla_ext::cpu::num_threads();
  } else {
#if defined(MLA_EXT_WITH_GPU)
    procs = cuda_processor_count(device_index);
#else
    MLA_CHECK(false, op, "expected device_index -1 (CPU): this build of mla_ext has no GPU support, got ",
              device_index);
#endif
  }
  return int64_t(mla_ext::decode_workspace_size_for(num_tokens, num_heads, int(num_splits), procs, device_index >= 0));
}

bool set_force_portable(bool enable) { return force_portable_flag().exchange(enable); }

bool set_force_mma_sync(bool enable) { return force_mma_sync_flag().exchange(enable); }

int64_t set_smem_limit(int64_t bytes) {
  MLA_CHECK(bytes >= 0, "_set_smem_limit", "expected bytes 0 (the device's limit) or > 0, got ", bytes);
  return smem_limit_setting().exchange(bytes);
}

int64_t set_head_tile(int64_t head_tile) {
  MLA_CHECK(head_tile >= 0 && head_tile <= 64, "_set_head_tile",
            "expected head_tile 0 (automatic) or 1..64, got ", head_tile);
  return head_tile_setting().exchange(int(head_tile));
}

int64_t set_two_token(int64_t mode) {
  MLA_CHECK(mode >= 0 && mode <= 2, "_set_two_token",
            "expected mode 0 (automatic), 1 (never) or 2 (wherever allowed), got ", mode);
  return two_token_setting().exchange(int(mode));
}

}  // namespace mla_ext_torch

STABLE_TORCH_LIBRARY(mla_ext, m) {
  // Argument order as vLLM's merge_attn_states so engines can swap it in
  // (vLLM appends prefill_tokens_with_context and output_scale in this order).
  m.def(
      "merge_attn_states(Tensor(a!) output, Tensor(b!)? output_lse, Tensor prefix_output, "
      "Tensor prefix_lse, Tensor suffix_output, Tensor suffix_lse, int? prefill_tokens_with_context=None, "
      "Tensor? output_scale=None) -> ()");
  m.def(
      "merge_attn_states_n(Tensor(a!) output, Tensor(b!)? output_lse, Tensor values, Tensor lses, "
      "Tensor? attn_sink=None) -> ()");
  m.def(
      "sparse_mla_decode(Tensor q, Tensor kv_cache, Tensor indices, str kv_format, float softmax_scale, "
      "Tensor(a!) output, Tensor(b!) workspace, Tensor? lengths=None, Tensor? extra_kv_cache=None, "
      "Tensor? extra_indices=None, Tensor? extra_lengths=None, Tensor? attn_sink=None, "
      "Tensor(c!)? lse=None, int num_splits=0) -> ()");
  m.def(
      "sparse_mla_decode_workspace_size(int num_tokens, int num_heads, int num_splits, "
      "int device_index) -> int");
  m.def("_set_force_portable(bool enable) -> bool");
  m.def("_set_force_mma_sync(bool enable) -> bool");
  m.def("_set_head_tile(int head_tile) -> int");
  m.def("_set_two_token(int mode) -> int");
  m.def("_set_smem_limit(int bytes) -> int");
  m.def("_test_late_fill(Tensor(a!) out, float value, int delay_ns) -> ()");
}

STABLE_TORCH_LIBRARY_IMPL(mla_ext, CPU, m) {
  m.impl("merge_attn_states", TORCH_BOX(&mla_ext_torch::merge_attn_states_cpu));
  m.impl("merge_attn_states_n", TORCH_BOX(&mla_ext_torch::merge_attn_states_n_cpu));
  m.impl("sparse_mla_decode", TORCH_BOX(&mla_ext_torch::sparse_mla_decode_cpu));
}

// No tensor arguments: CompositeExplicitAutograd also serves calls that carry no dispatch key.
STABLE_TORCH_LIBRARY_IMPL(mla_ext, CompositeExplicitAutograd, m) {
  m.impl("sparse_mla_decode_workspace_size",
         TORCH_BOX(&mla_ext_torch::sparse_mla_decode_workspace_size));
  m.impl("_set_force_portable", TORCH_BOX(&mla_ext_torch::set_force_portable));
  m.impl("_set_force_mma_sync", TORCH_BOX(&mla_ext_torch::set_force_mma_sync));
  m.impl("_set_head_tile", TORCH_BOX(&mla_ext_torch::set_head_tile));
  m.impl("_set_two_token", TORCH_BOX(&mla_ext_torch::set_two_token));
  m.impl("_set_smem_limit", TORCH_BOX(&mla_ext_torch::set_smem_limit));
}

#if defined(MLA_EXT_WITH_GPU)
STABLE_TORCH_LIBRARY_IMPL(mla_ext, CUDA, m) {
  m.impl("merge_attn_states", TORCH_BOX(&mla_ext_torch::merge_attn_states_cuda));
  m.impl("merge_attn_states_n", TORCH_BOX(&mla_ext_torch::merge_attn_states_n_cuda));
  m.impl("sparse_mla_decode", TORCH_BOX(&mla_ext_torch::sparse_mla_decode_cuda));
  m.impl("_test_late_fill", TORCH_BOX(&mla_ext_torch::test_late_fill_cuda));
}
#endif
