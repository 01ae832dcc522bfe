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

// Status codes returned by every launcher (no exceptions cross this layer).
enum class Status : int {
  kSuccess = 0,
  kInvalidArgument = 1,   // a params field is out of its documented range
  kWorkspaceTooSmall = 2, // workspace_bytes < the size the call needs
  kLaunchFailed = 3,      // the runtime rejected the launch (see last_gpu_error)
  kUnsupported = 4,       // this build has no kernel for the request
};

inline const char* status_string(Status s) {
  switch (s) {
    case Status::kSuccess: return "success";
    case Status::kInvalidArgument: return "invalid argument";
    case Status::kWorkspaceTooSmall: return "workspace too small";
    case Status::kLaunchFailed: return "kernel launch failed";
    case Status::kUnsupported: return "unsupported by this build";
  }
  return "unknown status";
}

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

}  // namespace mla_ext
