// GPU side of the torch binding: kernel launches only (see gpu_ops.h).
// Includes no torch header, throws nothing. Hipified by torch for ROCm builds.
#include "gpu_ops.h"
#include "mla_ext/merge_attn_states.cuh"
#include "mla_ext/sparse_mla_decode.cuh"

namespace mla_ext_gpu {

int processor_count(int device) {
  static mla_ext::PerDevice<int> cache;
  return mla_ext::device_attribute_cached(cache, mlaDevAttrMultiProcessorCount, device);
}

bool decode_wide16_rows(const mla_ext::SparseDecodeParams& p, int device) {
  static mla_ext::PerDevice<int> cc, smem;
  return mla_ext::decode_wide16_rows(
      p, mla_ext::device_attribute_cached(cc, mlaDevAttrComputeCapabilityMajor, device),
      size_t(mla_ext::device_attribute_cached(smem, mlaDevAttrMaxSharedMemoryPerBlockOptin, device)));
}

int launch_merge_attn_states(const mla_ext::MergeParams& p, int device, void* stream) {
  return int(mla_ext::launch_merge_attn_states(p, processor_count(device),
                                               static_cast<mla_ext::gpuStream_t>(stream)));
}

int launch_merge_attn_states_n(const mla_ext::MergeNParams& p, int device, void* stream) {
  return int(mla_ext::launch_merge_attn_states_n(p, processor_count(device),
                                                 static_cast<mla_ext::gpuStream_t>(stream)));
}

int launch_sparse_mla_decode(const mla_ext::SparseDecodeParams& p, void* workspace,
                             size_t workspace_bytes, int device, void* stream, bool auto_splits) {
  return int(mla_ext::launch_sparse_mla_decode(p, workspace, workspace_bytes, processor_count(device),
                                               static_cast<mla_ext::gpuStream_t>(stream), auto_splits));
}

__global__ void test_late_fill_kernel(float* out, int64_t n, float value, int64_t delay_ns) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
#if defined(__CUDA_ARCH__)
  // Spin on the global nanosecond timer (__nanosleep is only a hint and may return at once).
  uint64_t t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < uint64_t(delay_ns));
#else
  (void)delay_ns;
#endif
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) out[i] = value;
}

int launch_test_late_fill(float* out, int64_t n, float value, int64_t delay_ns, void* stream) {
  return int(mla_ext::launch_kernel(false, test_late_fill_kernel, dim3(1), dim3(256), 0,
                                    static_cast<mla_ext::gpuStream_t>(stream), out, n, value, delay_ns));
}

// The reason for a kLaunchFailed: the runtime error the failed launch left pending (read and cleared).
const char* last_error_string() { return mlaGetErrorString(mlaGetLastError()); }

}  // namespace mla_ext_gpu
