// racecheck on named barriers with bar.arrive (benchmarks/NOTES.md, nineteenth session).
// A race-free 256-thread toy kernel with the asymmetric decode kernel's protocol: warpgroup 0
// writes slot x[j % 2] and arrives on PRDY[j % 2]; warpgroup 1 syncs on it, reads the slot and
// arrives on FULL[j % 2], which warpgroup 0 syncs on before it rewrites that slot; then two
// __syncthreads phases like the epilogue. MODE 0: as the kernel; MODE 1: PRDY synced on both
// sides; MODE 2: __syncthreads only. On an H200 (CUDA 13.0) racecheck reports hazards for modes 0
// and 1, one of them between a store and a load separated by nothing but BAR.SYNC 0x0, and none
// for mode 2: its reports on this protocol are the tool's.
//   nvcc -arch=sm_90a -o /tmp/rcp benchmarks/dev/racecheck_named_barriers.cu
//   compute-sanitizer --tool racecheck /tmp/rcp
#include <cstdio>
template <bool A> __device__ __forceinline__ void nb(int id, int n) {
  if (A) asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(n) : "memory");
  else asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(n) : "memory");
}
template <int MODE> __global__ void k(float* out, int ntiles) {
  __shared__ float x[2][128];
  __shared__ float st[128];
  const int tid = threadIdx.x, wg = tid / 128, r = tid % 128;
  float acc = 0.f;
  if (MODE == 2) {
    for (int j = 0; j < ntiles; ++j) {
      if (wg == 0) x[j & 1][r] = j + r;
      __syncthreads();
      if (wg == 1) acc += x[j & 1][r];
      __syncthreads();
    }
  } else if (wg == 0) {
    for (int j = 0; j < ntiles; ++j) {
      const int cur = j & 1;
      if (j > 1) nb<false>(1 + cur, 256);  // FULL[cur]: wg1 done reading x[cur] (tile j - 2)
      x[cur][r] = j + r;
      nb<MODE == 0>(3 + cur, 256);  // PRDY[cur]
    }
  } else {
    for (int j = 0; j < ntiles; ++j) {
      const int cur = j & 1;
      nb<false>(3 + cur, 256);
      acc += x[cur][127 - r];
      if (j + 2 < ntiles) nb<true>(1 + cur, 256);
    }
  }
  __syncthreads();
  if (wg == 0) st[r] = acc + 1.f;
  __syncthreads();
  out[blockIdx.x * 256 + tid] = st[127 - r] + acc;
}
int main() {
  float* o; cudaMalloc(&o, 4 * 256 * 4);
  for (int nt : {1, 2, 3, 6}) {
    k<0><<<2, 256>>>(o, nt); k<1><<<2, 256>>>(o, nt); k<2><<<2, 256>>>(o, nt);
  }
  printf("probe %s\n", cudaGetErrorString(cudaDeviceSynchronize()));
}
