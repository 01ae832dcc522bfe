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
  MLA_EXT_SHARED(float, s, [1024]);
  const int tid = int(threadIdx.x), n = int(blockDim.x);
  s[tid] = float(tid + 1000 * int(blockIdx.x));
  if (!race) __syncthreads();
  out[blockIdx.x * n + tid] = s[(tid + 1) % n];
}

// Lanes 0 of the warps exchange values through shared memory around a warp reduction, with the
// barrier before the read left out (race = 1) or kept: a race between warps that only a
// collective (not a barrier) separates.
__global__ void cross_warp_kernel(float* out, int race) {
  MLA_EXT_SHARED(float, s, [16]);
  const int tid = int(threadIdx.x), lane = tid % kWarpSize, w = tid / kWarpSize;
  const int nw = int(blockDim.x) / kWarpSize;
  if (lane == 0) s[w] = float(w + 1);
  float v = float(lane);
  for (int o = kWarpSize / 2; o > 0; o /= 2) v += MLA_EXT_SHFL_XOR(v, o);
  if (!race) __syncthreads();
  if (lane == 0) out[w] = s[(w + 1) % nw] + 0.0f * v;
}

// The two halves of each warp shuffle at different places in the source (the same number of
// collectives each): on a GPU they run one after the other with half the lanes each.
__global__ void split_sites_kernel(float* out) {
  const int tid = int(threadIdx.x);
  float v = float(tid);
  if (tid & 1)
    v = MLA_EXT_SHFL_XOR(v + 1000.0f, 1);
  else
    v = MLA_EXT_SHFL_XOR(v, 1);
  out[tid] = v;
}

// Only block 0 writes the static shared array; every block reads it after the barrier.
__global__ void static_smem_kernel(float* out) {
  MLA_EXT_SHARED(float, s, [256]);
  const int tid = int(threadIdx.x);
  if (blockIdx.x == 0) s[tid] = 7.0f;
  __syncthreads();
  out[blockIdx.x * blockDim.x + tid] = s[tid];
}

// Reads one float past the launch's dynamic shared memory.
__global__ void dynamic_smem_overrun_kernel(float* out) {
  MLA_EXT_DYNAMIC_SMEM(smem);
  const float* f = reinterpret_cast<const float*>(smem);
  const int tid = int(threadIdx.x);
  out[tid] = f[tid + 1];
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
__attribute__((visibility("default"))) int simt_cross_warp(float* out, int threads, int race) {
  return status(
      mla_ext::launch_kernel(false, cross_warp_kernel, dim3(1), dim3(unsigned(threads)), 0, nullptr, out, race));
}
__attribute__((visibility("default"))) int simt_split_sites(float* out, int threads) {
  return status(mla_ext::launch_kernel(false, split_sites_kernel, dim3(1), dim3(unsigned(threads)), 0, nullptr, out));
}
__attribute__((visibility("default"))) int simt_static_smem(float* out, int blocks, int threads) {
  return status(mla_ext::launch_kernel(false, static_smem_kernel, dim3(unsigned(blocks)), dim3(unsigned(threads)), 0,
                                       nullptr, out));
}
__attribute__((visibility("default"))) int simt_dynamic_smem_overrun(float* out, int threads) {
  return status(mla_ext::launch_kernel(false, dynamic_smem_overrun_kernel, dim3(1), dim3(unsigned(threads)),
                                       size_t(threads) * 4, nullptr, out));
}
__attribute__((visibility("default"))) int simt_unwritten_smem(float* out, int threads) {
  return status(mla_ext::launch_kernel(false, unwritten_smem_kernel, dim3(1), dim3(unsigned(threads)),
                                       size_t(threads) * 4, nullptr, out));
}
}
