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
#include <stdlib.h>
#include <stdio.h>

#include <atomic>
#include <tuple>
#include <utility>

#include "mla_ext/numerics.h"
#include "mla_ext/status.h"

#if defined(__HIPCC__) || defined(__HIP_PLATFORM_AMD__) || defined(USE_ROCM)
#define MLA_EXT_HIP 1
#include <hip/hip_runtime.h>
#else
#if defined(MLA_EXT_SIMT_EMU)
#error "MLA_EXT_SIMT_EMU (the tests' CPU emulator) builds the HIP branch: add -D__HIP_PLATFORM_AMD__ -I tests/simt"
#endif
#define MLA_EXT_CUDA 1
#include <cuda.h>  // types of the driver entry point set_max_dynamic_smem looks up (no driver library linked)
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
#define mlaDevAttrMaxSharedMemoryPerBlockOptin hipDeviceAttributeSharedMemPerBlockOptin
#define mlaGetDevice hipGetDevice
#define mlaLaunchKernel hipLaunchKernel
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
#define mlaDevAttrMaxSharedMemoryPerBlockOptin cudaDevAttrMaxSharedMemoryPerBlockOptin
#define mlaGetDevice cudaGetDevice
#define mlaLaunchKernel cudaLaunchKernel
#endif

// Warp ("wavefront" on AMD) size as a compile-time constant in device code.
// CDNA (gfx9) runs 64-wide wavefronts; RDNA is not a target of this library.
// (MLA_EXT_SIMT_EMU: the CPU emulator of the tests, tests/simt/simt_emu.h, which runs the HIP
// branch with either warp size.)
#if defined(MLA_EXT_HIP) && !(defined(MLA_EXT_SIMT_EMU) && MLA_EXT_SIMT_WARP == 32)
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
// Ballot over the full warp: bit l of the lane_mask_t is lane l's predicate.
#if defined(MLA_EXT_HIP)
#define MLA_EXT_BALLOT(pred) lane_mask_t(__ballot(pred))
#else
#define MLA_EXT_BALLOT(pred) __ballot_sync(0xffffffffu, (pred))
#endif

// 2^x for the softmax, where x <= 0 (a score minus its row's running max) or
// -inf. NVIDIA: one MUFU.EX2 (ex2.approx.ftz: approximate to a few fp32 ulp,
// results below 2^-126 flushed to 0, 2^-inf = 0, NaN stays NaN), where exp2f
// adds a compare and two predicated multiplies per call to keep denormal
// results (ptxas output). A flushed term is below 2^-126 of the row's largest,
// far under the bf16 rounding of P; the decode's errors against the float64
// reference did not change (benchmarks/RESULTS.md, twentieth session). Host
// and HIP: exp2f.
MLA_EXT_HD float fast_exp2(float x) {
#if defined(__CUDA_ARCH__)
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return exp2f(x);
#endif
}

// One value per device (ordinals 0..63), shared by every host thread that launches: 0 = not
// known yet. Declared static (zero-initialised); a slot is filled by whichever thread gets
// there first, and any other thread racing it computes and stores the same value (atomics, so
// concurrent callers are well defined; acquire / release, so a thread that sees a flag also
// sees what was done before it was set).
template <typename T>
struct PerDevice {
  std::atomic<T> slot[64];
  T get(int dev) const { return slot[dev].load(std::memory_order_acquire); }
  void set(int dev, T v) { slot[dev].store(v, std::memory_order_release); }
};

// The current device's index as a PerDevice slot, or -1 where the runtime does not say (its
// error cleared) or the index is past the 64 slots.
inline int current_device_slot() {
  int dev = 0;
  if (mlaGetDevice(&dev) != MLA_EXT_GPU_SUCCESS) {
    (void)mlaGetLastError();
    return -1;
  }
  return dev >= 0 && dev < 64 ? dev : -1;
}

// A yes / no property of the current device, asked once per device: ask() returns 1 (yes) or
// -1 (no), which `cache` keeps, or 0 (no for now, asked again next time). No device index: no.
template <typename Ask>
inline bool per_device_answer(PerDevice<signed char>& cache, Ask&& ask) {
  const int dev = current_device_slot();
  if (dev < 0) return false;
  signed char c = cache.get(dev);
  if (c == 0) {
    c = ask();
    if (c != 0) cache.set(dev, c);
  }
  return c > 0;
}

// Attribute `attr` of device `dev`, read once per device (launchers ask on
// every launch); 0 when the runtime does not say (its error is cleared).
template <typename Attr>
inline int device_attribute_cached(PerDevice<int>& cache, Attr attr, int dev) {
  const bool slot = dev >= 0 && dev < 64;
  if (slot) {
    const int c = cache.get(dev);
    if (c != 0) return c > 0 ? c : 0;
  }
  int n = 0;
  if (mlaDeviceGetAttribute(&n, attr, dev) != MLA_EXT_GPU_SUCCESS) {
    (void)mlaGetLastError();
    n = 0;
  }
  if (slot) cache.set(dev, n > 0 ? n : -1);
  return n > 0 ? n : 0;
}

// The same for the current device.
template <typename Attr>
inline int current_device_attribute_cached(PerDevice<int>& cache, Attr attr) {
  int dev = 0;
  if (mlaGetDevice(&dev) != MLA_EXT_GPU_SUCCESS) return 0;
  return device_attribute_cached(cache, attr, dev);
}

// Let `kernel` use `bytes` (> 48 KB) of dynamic shared memory per block; true on success.
// On CUDA through the driver's cuFuncSetAttribute, applied to the kernel's handle
// (cudaGetFuncBySymbol). The entry point is looked up through the runtime, once per process
// (a failed lookup stays failed), so no driver library is linked; with CUDA 13 headers by
// version, with 11.3-12.x ones through cudaGetDriverEntryPoint, which every 11.3+ runtime has.
// The reason: the runtime's cudaFuncSetAttribute, even when it succeeds, clears an error the
// caller left pending (CUDA 13.0 runtime, H200: benchmarks/NOTES.md, twenty-eighth session),
// and the launchers leave such errors to the caller. Where the lookup or the driver call
// fails, and on older toolkits and HIP: cudaFuncSetAttribute / hipFuncSetAttribute, whose
// failure leaves the runtime's own error pending (and whose success may clear one).
inline bool set_max_dynamic_smem(const void* kernel, int bytes) {
#if defined(MLA_EXT_CUDA) && defined(CUDART_VERSION) && CUDART_VERSION >= 11030
  using SetAttribute = CUresult(CUDAAPI*)(CUfunction, CUfunction_attribute, int);
  static const SetAttribute driver_set = [] {
    void* fn = nullptr;
#if CUDART_VERSION >= 13000
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    const bool ok = cudaGetDriverEntryPointByVersion("cuFuncSetAttribute", &fn, 12000, cudaEnableDefault, &found) ==
                        cudaSuccess &&
                    found == cudaDriverEntryPointSuccess;
#else
    const bool ok = cudaGetDriverEntryPoint("cuFuncSetAttribute", &fn, cudaEnableDefault) == cudaSuccess;
#endif
    return ok ? reinterpret_cast<SetAttribute>(fn) : SetAttribute(nullptr);
  }();
  cudaFunction_t handle = nullptr;
  if (driver_set != nullptr && cudaGetFuncBySymbol(&handle, kernel) == cudaSuccess && handle != nullptr &&
      driver_set(reinterpret_cast<CUfunction>(handle), CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, bytes) ==
          CUDA_SUCCESS)
    return true;
#endif
  return mlaFuncSetAttribute(kernel, mlaFuncAttributeMaxDynamicSharedMemorySize, bytes) == MLA_EXT_GPU_SUCCESS;
}

// Number of multiprocessors (CUs on AMD) of the current device, 0 on failure.
inline int current_device_sm_count() {
  static PerDevice<int> cache;
  return current_device_attribute_cached(cache, mlaDevAttrMultiProcessorCount);
}

// Compute-capability major of the current device (NVIDIA: 8 = Ampere, 9 =
// Hopper; HIP reports its own numbering), 0 on failure.
inline int current_device_cc_major() {
  static PerDevice<int> cache;
  return current_device_attribute_cached(cache, mlaDevAttrComputeCapabilityMajor);
}

// Largest dynamic shared memory one block of the current device may opt in to
// (bytes: A100 163 KB, H100 / H200 227 KB, sm_86 / sm_89 99 KB), 0 when the
// runtime does not say.
inline size_t current_device_smem_optin() {
  static PerDevice<int> cache;
  return size_t(current_device_attribute_cached(cache, mlaDevAttrMaxSharedMemoryPerBlockOptin));
}

// blockIdx.x / threadIdx.x read afresh: the compiler cannot reuse an earlier read (and so
// keep a value derived from it live, in a register or spilled, across a loop).
__device__ __forceinline__ uint32_t block_index_x() {
#if defined(__CUDA_ARCH__)
  uint32_t b;
  asm volatile("mov.u32 %0, %%ctaid.x;" : "=r"(b));
  return b;
#else
  return blockIdx.x;
#endif
}
__device__ __forceinline__ uint32_t thread_index_x() {
#if defined(__CUDA_ARCH__)
  uint32_t t;
  asm volatile("mov.u32 %0, %%tid.x;" : "=r"(t));
  return t;
#else
  return threadIdx.x;
#endif
}

// Declares `name`, the block's dynamic shared memory, as 16-byte aligned bytes (an array on
// the GPU, a pointer into the emulator's per-block buffer under MLA_EXT_SIMT_EMU).
#if defined(MLA_EXT_SIMT_EMU)
#define MLA_EXT_DYNAMIC_SMEM(name) uint8_t* const name = ::mla_ext_simt::dynamic_smem()
#else
#define MLA_EXT_DYNAMIC_SMEM(name) extern __shared__ __align__(16) uint8_t name[]
#endif

// Declares a static __shared__ array `name` of `type` with dimensions `dims` (e.g. [64][4]).
// Under MLA_EXT_SIMT_EMU also registers it, so that the emulator poisons it before each block.
#if defined(MLA_EXT_SIMT_EMU)
#define MLA_EXT_SHARED(type, name, dims) \
  __shared__ type name dims;             \
  ::mla_ext_simt::register_shared(name, sizeof(name))
#else
#define MLA_EXT_SHARED(type, name, dims) __shared__ type name dims
#endif

// A 64-bit value the compiler must keep as computed (NVIDIA): an empty asm
// statement that claims to change it, so that a loop using it cannot recompute it
// from its inputs (rematerialisation) instead of keeping it in a register. An
// integer offset, not a pointer: a pointer through the asm loses its global
// address space (generic LD instead of LDG). Elsewhere (HIP, host passes) nothing.
// The portable decode kernels' Q.K (decode_body's kKeepQ): in the 64-head balanced
// kernel ptxas recomputed the token's Q row offset, 64-bit products, for each of
// the eight 16-byte Q loads of every step (nvcc 13, sm_90a).
__device__ __forceinline__ void keep_value(int64_t& v) {
#if defined(__CUDA_ARCH__)
  asm volatile("" : "+l"(v));
#else
  (void)v;
#endif
}

// ---- Programmatic dependent launch (PDL) ----
// On NVIDIA sm_90+ a kernel launched with programmatic stream serialisation
// may be scheduled while the kernel before it on the stream is still running;
// it calls wait_for_prior_grids() before its first global memory access, which
// blocks until that kernel has completed and its writes are visible. What it
// gains is the launch and prologue latency of a small kernel (H200: 1.83 ->
// 1.42 us per merge of 1 x 128 x 512, benchmarks/dev/merge_small.cu). Inside a
// CUDA graph capture the launch becomes a programmatic edge. After an ordinary
// launch (HIP, older GPUs, MLA_EXT_PDL=0) the wait returns at once.
__device__ __forceinline__ void wait_for_prior_grids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Lets the next kernel on the stream, when it was launched programmatically,
// be scheduled now instead of when this grid's last block exits; it still
// waits in wait_for_prior_grids() for this grid to complete, so this only
// moves its launch and prologue under this grid's run. Called right after
// wait_for_prior_grids() (not before: a chain of waiting grids would launch one
// after another and sit on the processors), and only where the launcher set a
// flag (pdl_trigger_early below).
__device__ __forceinline__ void launch_dependent_grids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// An integer from the environment (strtol, base from the prefix), `dflt` where
// the variable is unset or empty, or (with a warning on stderr) where it is not
// an integer: "off" is not read as 0. For switches read once per process.
inline long env_int(const char* name, long dflt) {
  const char* e = getenv(name);
  if (e == nullptr || e[0] == 0) return dflt;
  char* end = nullptr;
  const long v = strtol(e, &end, 0);
  while (end != nullptr && (*end == ' ' || *end == '\t' || *end == '\n')) ++end;
  if (end == e || end == nullptr || *end != 0) {
    fprintf(stderr, "mla_ext: ignoring %s=\"%s\" (expected an integer); using %ld\n", name, e, dflt);
    return dflt;
  }
  return v;
}

// Kernels that may be launched programmatically in this process, as a bit
// mask: 1 merge_attn_states(_n), 2 the decode split kernel, 4 the decode
// reduce; 8 lets a small split grid trigger its reduce early
// (pdl_trigger_early). The environment variable MLA_EXT_PDL (read once, as an
// integer: "0" none, "15" all, "7" programmatic launches without the early
// trigger, "13" all but the split kernel) sets it; unset or empty: all.
constexpr int kPdlMerge = 1, kPdlDecodeSplit = 2, kPdlDecodeReduce = 4, kPdlEarlyTrigger = 8;
inline int pdl_mask() {
  static const int mask = int(env_int("MLA_EXT_PDL", 15)) & 15;
  return mask;
}

// Whether a grid of `blocks` blocks on num_sms processors (<= 0: 128 assumed)
// triggers its dependent early (launch_dependent_grids). Only the decode's
// split kernel does, toward its own reduce, and only when it leaves at least
// half of the processors idle: the reduce's blocks then start on idle
// processors (H200, graph replay: one-token calls at 8-32 heads -0.1..-0.5 us,
// no shape slower). Kernels whose next kernel is the caller's do not trigger:
// an early-launched grid seems to use only the processors free at that moment
// (likely because a processor running another kernel's blocks cannot take
// blocks that need a larger shared-memory carve-out until it drains; not
// verified), so it packs onto few of them. Measured: behind a triggering
// reduce the next call's 64-130 split blocks ran 5-17% slower; split grids of
// 128-132 blocks triggering their reduce lost 0.1-1.1 us; and a merge kernel
// holding the (unexecuted) instruction ran large merges 4-6% slower, while a
// 1 x 128 x 512 merge followed by another triggering one took 1.29 instead of
// 1.63 us, a gain only for programmatic chains of small grids.
inline bool pdl_trigger_early(int64_t blocks, int num_sms) {
  if ((pdl_mask() & kPdlEarlyTrigger) == 0) return false;
  const int64_t sms = num_sms > 0 ? num_sms : 128;
  return blocks * 2 <= sms;
}

// Whether `kernel` (of the family `bit` of pdl_mask) is launched
// programmatically on the current device: its bit is set, and it was
// built with CUDA >= 12.3 and running on a driver >= 12.3 (graph capture of
// such launches), compute capability >= 9, and the kernel's code compiled for
// a virtual architecture >= compute_90 (cudaFuncAttributes::ptxVersion), so
// that it contains the wait: a kernel JIT-compiled from compute_80 PTX on a
// Hopper does not. `cache` is per kernel, indexed by device: 0 unknown, 1 yes,
// -1 no. A failed query leaves no pending error and is not cached.
template <typename K>
inline bool use_pdl(int bit, PerDevice<signed char>& cache, K* kernel) {
#if defined(MLA_EXT_CUDA) && defined(CUDART_VERSION) && CUDART_VERSION >= 12030
  if ((pdl_mask() & bit) == 0) return false;
  return per_device_answer(cache, [&]() -> signed char {
    static const int driver = [] {
      int v = 0;
      if (cudaDriverGetVersion(&v) != cudaSuccess) {
        (void)cudaGetLastError();
        v = 0;
      }
      return v;
    }();
    const int cc = current_device_cc_major();
    cudaFuncAttributes attr;
    if (cc == 0 || cudaFuncGetAttributes(&attr, reinterpret_cast<const void*>(kernel)) != cudaSuccess) {
      (void)cudaGetLastError();
      return 0;
    }
    return driver >= 12030 && cc >= 9 && attr.ptxVersion >= 90 ? 1 : -1;
  });
#else
  (void)bit;
  (void)cache;
  (void)kernel;
  return false;
#endif
}

// The argument array a launch call takes: the address of each parameter.
template <typename Tuple, size_t... I>
inline void fill_kernel_argv(void** argv, Tuple& params, std::index_sequence<I...>) {
  ((argv[I] = static_cast<void*>(&std::get<I>(params))), ...);
}

// Launch `kernel` on `stream`, programmatically when `programmatic` (see
// above; callers pass use_pdl(...)). The launch is judged by the launch call's
// own return code, never by the runtime's last-error slot: an error the caller
// left pending before this call is not blamed on this launch, and this function
// does not read or clear it.
// When the runtime rejects the launch, its error stays pending for the caller
// to read (cudaGetLastError / hipGetLastError) and kLaunchFailed is returned.
// The arguments are converted to the kernel's parameter types first (the
// runtime copies each parameter from the address given).
// cluster_x > 1 (CUDA, sm_90+): thread-block clusters of cluster_x consecutive blocks along x
// (the grid's x a multiple of it); elsewhere kUnsupported, nothing launched.
#if defined(MLA_EXT_CUDA) && defined(CUDART_VERSION) && CUDART_VERSION >= 12030
// The launch attribute of clusters of cluster_x blocks along x.
inline cudaLaunchAttribute cluster_dim_attribute(unsigned cluster_x) {
  cudaLaunchAttribute attr;
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = cluster_x;
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = 1;
  return attr;
}
#endif
template <typename... KArgs, typename... Args>
inline Status launch_kernel_ex(bool programmatic, unsigned cluster_x, void (*kernel)(KArgs...), dim3 grid, dim3 block,
                               size_t smem, gpuStream_t stream, const Args&... args) {
  static_assert(sizeof...(KArgs) == sizeof...(Args), "launch_kernel: argument count differs from the kernel's");
  std::tuple<KArgs...> params(args...);
  void* argv[sizeof...(KArgs) > 0 ? sizeof...(KArgs) : 1];
  fill_kernel_argv(argv, params, std::index_sequence_for<KArgs...>{});
  gpuError_t err;
#if defined(MLA_EXT_CUDA) && defined(CUDART_VERSION) && CUDART_VERSION >= 12030
  if (programmatic || cluster_x > 1) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cudaLaunchAttribute attr[2];
    unsigned n = 0;
    if (programmatic) {
      attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
      attr[n].val.programmaticStreamSerializationAllowed = 1;
      ++n;
    }
    if (cluster_x > 1) attr[n++] = cluster_dim_attribute(cluster_x);
    cfg.attrs = attr;
    cfg.numAttrs = n;
    err = cudaLaunchKernelExC(&cfg, reinterpret_cast<const void*>(kernel), argv);
  } else
#else
  (void)programmatic;
  if (cluster_x > 1) return Status::kUnsupported;
#endif
#if defined(MLA_EXT_SIMT_EMU)
  err = ::mla_ext_simt::launch_kernel(kernel, grid, block, smem, params);
  (void)argv;
  (void)stream;
#else
  {
    err = mlaLaunchKernel(reinterpret_cast<const void*>(kernel), grid, block, argv, smem, stream);
  }
#endif
  return err == MLA_EXT_GPU_SUCCESS ? Status::kSuccess : Status::kLaunchFailed;
}
template <typename... KArgs, typename... Args>
inline Status launch_kernel(bool programmatic, void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem,
                            gpuStream_t stream, const Args&... args) {
  return launch_kernel_ex(programmatic, 1u, kernel, grid, block, smem, stream, args...);
}

// Whether `kernel` (its dynamic shared memory attribute already set) can run as clusters of
// cluster_x blocks of `block` threads and `smem` bytes each on the current device: asked once
// per device (cudaOccupancyMaxActiveClusters > 0; a failed query counts as no, its error
// cleared). A partition of the GPU (MPS, green contexts) may leave no room for a cluster of
// such blocks; the launcher then takes a kernel without clusters. CUDA >= 12.3 only
// (launch_kernel_ex's cluster launches); false elsewhere.
template <typename... KArgs>
inline bool cluster_fits(PerDevice<signed char>& cache, void (*kernel)(KArgs...), unsigned cluster_x, dim3 block,
                         size_t smem) {
#if defined(MLA_EXT_CUDA) && defined(CUDART_VERSION) && CUDART_VERSION >= 12030
  return per_device_answer(cache, [&]() -> signed char {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(cluster_x);
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cudaLaunchAttribute attr = cluster_dim_attribute(cluster_x);
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    int n = 0;
    if (cudaOccupancyMaxActiveClusters(&n, reinterpret_cast<const void*>(kernel), &cfg) != cudaSuccess) {
      (void)cudaGetLastError();
      n = 0;
    }
    return n > 0 ? 1 : -1;
  });
#else
  (void)cache;
  (void)kernel;
  (void)cluster_x;
  (void)block;
  (void)smem;
  return false;
#endif
}

}  // namespace mla_ext
