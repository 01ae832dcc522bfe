// mla_ext portability layer: the only file that branches on the platform.
//
// Everything a kernel needs that differs between CUDA and HIP lives here: the
// runtime header, stream/error types, warp size, lane masks and shuffles.
// Numeric conversions (bf16/fp16/fp8/UE8M0) are bit-level and shared with the
// CPU implementation; they live in numerics.h and need nothing from here.
//
// Debian 12's hipcc 5.2 (the CI compile check) has no hip_bf16.h and no
// __shfl_*_sync, so kernels carry bf16 as raw uint16_t bits and use the
// MLA_EXT_SHFL_* wrappers below instead of the *_sync intrinsics directly.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "mla_ext/numerics.h"
#include "mla_ext/status.h"

#if defined(__HIPCC__) || defined(__HIP_PLATFORM_AMD__) || defined(USE_ROCM)
#define MLA_EXT_HIP 1
#include <hip/hip_runtime.h>
#else
#define MLA_EXT_CUDA 1
#include <cuda_runtime.h>
#endif

namespace mla_ext {

#if defined(MLA_EXT_HIP)
using gpuStream_t = hipStream_t;
using gpuError_t = hipError_t;
#define MLA_EXT_GPU_SUCCESS hipSuccess
#define mlaGetLastError hipGetLastError
#define mlaGetErrorString hipGetErrorString
#define mlaFuncSetAttribute hipFuncSetAttribute
#define mlaFuncAttributeMaxDynamicSharedMemorySize hipFuncAttributeMaxDynamicSharedMemorySize
#define mlaDeviceGetAttribute hipDeviceGetAttribute
#define mlaDevAttrMultiProcessorCount hipDeviceAttributeMultiprocessorCount
#define mlaDevAttrComputeCapabilityMajor hipDeviceAttributeComputeCapabilityMajor
#define mlaGetDevice hipGetDevice
#else
using gpuStream_t = cudaStream_t;
using gpuError_t = cudaError_t;
#define MLA_EXT_GPU_SUCCESS cudaSuccess
#define mlaGetLastError cudaGetLastError
#define mlaGetErrorString cudaGetErrorString
#define mlaFuncSetAttribute cudaFuncSetAttribute
#define mlaFuncAttributeMaxDynamicSharedMemorySize cudaFuncAttributeMaxDynamicSharedMemorySize
#define mlaDeviceGetAttribute cudaDeviceGetAttribute
#define mlaDevAttrMultiProcessorCount cudaDevAttrMultiProcessorCount
#define mlaDevAttrComputeCapabilityMajor cudaDevAttrComputeCapabilityMajor
#define mlaGetDevice cudaGetDevice
#endif

// Warp ("wavefront" on AMD) size as a compile-time constant in device code.
// CDNA (gfx9) runs 64-wide wavefronts; RDNA is not a target of this library.
#if defined(MLA_EXT_HIP)
#define MLA_EXT_WARP_SIZE 64
using lane_mask_t = uint64_t;
#else
#define MLA_EXT_WARP_SIZE 32
using lane_mask_t = uint32_t;
#endif
constexpr int kWarpSize = MLA_EXT_WARP_SIZE;

// Shuffles over the full warp. HIP's __shfl_xor has no mask (all lanes of the
// wavefront take part, which is what every call site here does).
#if defined(MLA_EXT_HIP)
#define MLA_EXT_SHFL_XOR(v, lane_mask) __shfl_xor((v), (lane_mask))
#define MLA_EXT_SHFL(v, src_lane) __shfl((v), (src_lane))
#else
#define MLA_EXT_SHFL_XOR(v, lane_mask) __shfl_xor_sync(0xffffffffu, (v), (lane_mask))
#define MLA_EXT_SHFL(v, src_lane) __shfl_sync(0xffffffffu, (v), (src_lane))
#endif

// Thread-block clusters (NVIDIA sm_90+, CUDA 12+): a launch with a cluster
// dimension, and in device code the cluster barrier and the address of another
// block's shared memory (distributed shared memory). HIP has no clusters:
// MLA_EXT_HAS_CLUSTERS stays undefined and callers take their other path.
#if defined(MLA_EXT_CUDA) && defined(CUDART_VERSION) && CUDART_VERSION >= 12000
#define MLA_EXT_HAS_CLUSTERS 1
#endif
#if defined(MLA_EXT_HAS_CLUSTERS) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define MLA_EXT_DEVICE_CLUSTERS 1
#endif

#if defined(MLA_EXT_HAS_CLUSTERS)
// Launch kernel<<<grid, block, smem, stream>>>(args...) in clusters of
// cluster_x consecutive blocks along x (grid.x must be a multiple of it).
template <typename... KArgs, typename... Args>
inline Status launch_clustered(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem,
                               gpuStream_t stream, unsigned cluster_x, Args... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = cluster_x;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  if (cudaLaunchKernelEx(&cfg, kernel, args...) != cudaSuccess) {
    (void)cudaGetLastError();  // a refused configuration is not sticky; clear it
    return Status::kLaunchFailed;
  }
  return Status::kSuccess;
}
#endif

#if defined(MLA_EXT_DEVICE_CLUSTERS)
// All threads of every block of the cluster: writes to shared memory before
// it are visible to every block of the cluster after it.
__device__ __forceinline__ void cluster_sync_all() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
// Generic address of `p` (this block's shared memory) in block `rank` of the cluster.
template <typename T>
__device__ __forceinline__ const T* cluster_map_shared(const T* p, unsigned rank) {
  uint64_t out;
  asm volatile("mapa.u64 %0, %1, %2;\n" : "=l"(out) : "l"(reinterpret_cast<uint64_t>(p)), "r"(rank));
  return reinterpret_cast<const T*>(out);
}
__device__ __forceinline__ unsigned cluster_block_rank() {
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
#endif

// Check the launch that just happened; report a runtime failure as a Status.
inline Status check_launch() {
  gpuError_t err = mlaGetLastError();
  return err == MLA_EXT_GPU_SUCCESS ? Status::kSuccess : Status::kLaunchFailed;
}

// Number of multiprocessors (CUs on AMD) of the current device, 0 on failure.
inline int current_device_sm_count() {
  int dev = 0;
  if (mlaGetDevice(&dev) != MLA_EXT_GPU_SUCCESS) return 0;
  int n = 0;
  if (mlaDeviceGetAttribute(&n, mlaDevAttrMultiProcessorCount, dev) != MLA_EXT_GPU_SUCCESS) return 0;
  return n;
}

// Compute-capability major of the current device (NVIDIA: 8 = Ampere, 9 =
// Hopper; HIP reports its own numbering), 0 on failure. Read once per device:
// launchers call it on every launch.
inline int current_device_cc_major() {
  static int cache[64] = {};
  int dev = 0;
  if (mlaGetDevice(&dev) != MLA_EXT_GPU_SUCCESS) return 0;
  if (dev >= 0 && dev < 64 && cache[dev] != 0) return cache[dev];
  int n = 0;
  if (mlaDeviceGetAttribute(&n, mlaDevAttrComputeCapabilityMajor, dev) != MLA_EXT_GPU_SUCCESS) return 0;
  if (dev >= 0 && dev < 64) cache[dev] = n;
  return n;
}

}  // namespace mla_ext
