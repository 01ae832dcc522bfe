// Kernels that show the SIMT emulator (simt_emu.h) computes warp collectives as HIP defines them
// and refuses or exposes what a GPU would get wrong (tests/test_simt_emu.py). Built like the C
// API for the emulator: -D__HIP_PLATFORM_AMD__ -DMLA_EXT_SIMT_EMU -I tests/simt -I csrc/include.
#include "mla_ext/compat.h"

namespace {

using mla_ext::kWarpSize;
using mla_ext::lane_mask_t;

// out[w] = sum of the lanes' indices of warp w (xor butterfly), out[nw + w] = lane 5's value
// broadcast, and ballot words of (lane % 3 == 0) in out64.
__global__ void collectives_kernel(float* out, uint64_t* out64) {
  const int tid = int(threadIdx.x), lane = tid % kWarpSize, w = tid / kWarpSize;
  const int nw = int(blockDim.x) / kWarpSize;
  float v = float(lane);
  for (int o = kWarpSize / 2; o > 0; o /= 2) v += MLA_EXT_SHFL_XOR(v, o);
  const float b = MLA_EXT_SHFL(float(lane * 10), 5);
  const lane_mask_t m = MLA_EXT_BALLOT(lane % 3 == 0);
  if (lane == 0) {
    out[w] = v;
    out[nw + w] = b;
    out64[w] = uint64_t(m);
  }
}

// A shuffle that only the lower half of each warp reaches.
__global__ void divergent_shuffle_kernel(float* out) {
  const int tid = int(threadIdx.x), lane = tid % kWarpSize;
  float v = float(tid);
  if (lane < kWarpSize / 2) v = MLA_EXT_SHFL_XOR(v, 1);
  out[tid] = v;
}

// A barrier that only the first warp reaches while the second waits at a shuffle.
__global__ void divergent_barrier_kernel(float* out) {
  const int tid = int(threadIdx.x);
  float v = float(tid);
  if (tid < kWarpSize)
    __syncthreads();
  else
    v = MLA_EXT_SHFL_XOR(v, 1);
  out[tid] = v;
}

// Reads a neighbour's shared-memory element with the barrier between write and read left out
// (race = 1) or kept (race = 0).
__global__ void neighbour_kernel(float* out, int race) {
  __shared__ float s[1024];
  const int tid = int(threadIdx.x), n = int(blockDim.x);
  s[tid] = float(tid + 1000 * int(blockIdx.x));
  if (!race) __syncthreads();
  out[blockIdx.x * n + tid] = s[(tid + 1) % n];
  __syncthreads();
  s[tid] = -1.0f;  // the next block starts from stale values, not the right ones
}

// Reads dynamic shared memory that no thread wrote.
__global__ void unwritten_smem_kernel(float* out) {
  MLA_EXT_DYNAMIC_SMEM(smem);
  float* f = reinterpret_cast<float*>(smem);
  const int tid = int(threadIdx.x);
  if (tid % 2 == 0) f[tid] = 1.0f;
  __syncthreads();
  out[tid] = f[tid];
}

int status(mla_ext::Status s) { return int(s); }

}  // namespace

extern "C" {
__attribute__((visibility("default"))) int simt_collectives(float* out, uint64_t* out64, int threads) {
  return status(mla_ext::launch_kernel(false, collectives_kernel, dim3(1), dim3(unsigned(threads)), 0, nullptr,
                                       out, out64));
}
__attribute__((visibility("default"))) int simt_divergent_shuffle(float* out, int threads) {
  return status(
      mla_ext::launch_kernel(false, divergent_shuffle_kernel, dim3(1), dim3(unsigned(threads)), 0, nullptr, out));
}
__attribute__((visibility("default"))) int simt_divergent_barrier(float* out, int threads) {
  return status(
      mla_ext::launch_kernel(false, divergent_barrier_kernel, dim3(1), dim3(unsigned(threads)), 0, nullptr, out));
}
__attribute__((visibility("default"))) int simt_neighbour(float* out, int blocks, int threads, int race) {
  return status(mla_ext::launch_kernel(false, neighbour_kernel, dim3(unsigned(blocks)), dim3(unsigned(threads)), 0,
                                       nullptr, out, race));
}
__attribute__((visibility("default"))) int simt_unwritten_smem(float* out, int threads) {
  return status(mla_ext::launch_kernel(false, unwritten_smem_kernel, dim3(1), dim3(unsigned(threads)),
                                       size_t(threads) * 4, nullptr, out));
}
}
