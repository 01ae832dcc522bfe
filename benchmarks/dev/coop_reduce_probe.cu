// Dev probe (not part of the library): what would the decode's one-token calls gain if the
// split reduction ran in the split kernel itself, after a grid-wide barrier of a cooperative
// launch (the driver owns the barrier word, so no counter lives in the caller's workspace),
// instead of in a second, programmatic launch?
//
// Stand-ins, shaped like a one-token decode call with H heads and S splits:
//   split  : S blocks of 256 threads; griddepcontrol.wait; spin `work` ns (the tile chain);
//            write an fp32 partial [H, 512] and H split LSEs into the workspace; trigger early
//   reduce : H x CH blocks of 128 / CH threads, griddepcontrol.wait, one L2 round trip for the
//            S LSEs and partials, bf16 output (the library's reduce, simplified)
//   coop   : the split body, then cg::this_grid().sync(), then the reduce's work dealt over the
//            split grid's threads (8 rows x 512 columns / 4 per thread)
// Each variant: 64 calls back to back captured into one CUDA graph, replayed; us per call,
// median of 30 replays. Both attribute combinations are tried for coop (with and without
// programmatic stream serialisation); a refused launch or capture prints its error.
// Build: nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a benchmarks/dev/coop_reduce_probe.cu
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace cg = cooperative_groups;

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); exit(1); } } while (0)

constexpr int kDV = 512;

struct Args {
  const float* src;  // per split: H x 512 values + H LSEs
  float* ws_out;     // [H][S][512]
  float* ws_lse;     // [H][S]
  __nv_bfloat16* out;  // [H][512]
  float* out_lse;
  int H, S;
  long long spin_cycles;
};

__device__ __forceinline__ void spin(long long cycles) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {}
}

__device__ __forceinline__ void split_body(const Args& a) {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  const int s = blockIdx.x;
  spin(a.spin_cycles);
  const float4* src = reinterpret_cast<const float4*>(a.src + size_t(s) * a.H * (kDV + 1));
  for (int i = threadIdx.x; i < a.H * kDV / 4; i += blockDim.x) {
    const int h = i / (kDV / 4), c = i % (kDV / 4);
    reinterpret_cast<float4*>(a.ws_out)[(size_t(h) * a.S + s) * (kDV / 4) + c] = src[i];
  }
  if (threadIdx.x < a.H) a.ws_lse[threadIdx.x * a.S + s] = a.src[size_t(s) * a.H * (kDV + 1) + a.H * kDV + threadIdx.x];
}

// One output row h, columns [4 c, 4 c + 4): S LSEs and S partial chunks in one batch.
__device__ __forceinline__ void reduce_unit(const Args& a, int h, int c) {
  float l[32];
  float4 v[32];
  float mx = -INFINITY;
#pragma unroll
  for (int i = 0; i < 32; ++i)
    if (i < a.S) {
      l[i] = a.ws_lse[h * a.S + i];
      v[i] = reinterpret_cast<const float4*>(a.ws_out)[(size_t(h) * a.S + i) * (kDV / 4) + c];
    }
#pragma unroll
  for (int i = 0; i < 32; ++i)
    if (i < a.S) mx = fmaxf(mx, l[i]);
  float L = 0.f, o0 = 0.f, o1 = 0.f, o2 = 0.f, o3 = 0.f;
#pragma unroll
  for (int i = 0; i < 32; ++i)
    if (i < a.S) {
      const float w = __expf(l[i] - mx);
      L += w;
      o0 += w * v[i].x; o1 += w * v[i].y; o2 += w * v[i].z; o3 += w * v[i].w;
    }
  const float inv = 1.f / L;
  __nv_bfloat162 lo = __floats2bfloat162_rn(o0 * inv, o1 * inv), hi = __floats2bfloat162_rn(o2 * inv, o3 * inv);
  uint2 pk;
  pk.x = *reinterpret_cast<uint32_t*>(&lo);
  pk.y = *reinterpret_cast<uint32_t*>(&hi);
  *reinterpret_cast<uint2*>(a.out + size_t(h) * kDV + 4 * c) = pk;
  if (c == 0) a.out_lse[h] = mx + __logf(L);
}

__global__ void __launch_bounds__(256) split_kernel(Args a) {
  split_body(a);
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

template <int CH>
__global__ void __launch_bounds__(128) reduce_kernel(Args a) {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  const int h = blockIdx.x / CH, c = (blockIdx.x % CH) * (128 / CH) + threadIdx.x;
  if (threadIdx.x < 128 / CH) reduce_unit(a, h, c);
}

__global__ void __launch_bounds__(256) coop_kernel(Args a) {
  split_body(a);
  cg::this_grid().sync();
  const int units = a.H * (kDV / 4);
  for (int u = blockIdx.x * 256 + threadIdx.x; u < units; u += gridDim.x * 256) reduce_unit(a, u / (kDV / 4), u % (kDV / 4));
}

template <typename K>
cudaError_t launch(K kernel, int grid, int block, bool pdl, bool coop, cudaStream_t st, const Args& a) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(grid);
  cfg.blockDim = dim3(block);
  cfg.stream = st;
  cudaLaunchAttribute attr[2];
  int n = 0;
  if (pdl) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  if (coop) {
    attr[n].id = cudaLaunchAttributeCooperative;
    attr[n].val.cooperative = 1;
    ++n;
  }
  cfg.attrs = attr;
  cfg.numAttrs = n;
  return cudaLaunchKernelEx(&cfg, kernel, a);
}

int main(int argc, char** argv) {
  const double work_ns = argc > 1 ? atof(argv[1]) : 3000.0;
  int clk_khz = 0;
  CK(cudaDeviceGetAttribute(&clk_khz, cudaDevAttrClockRate, 0));
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  constexpr int kCalls = 64;
  const int heads[] = {8, 16, 64, 128};
  const int splits[] = {10, 20, 32};
  printf("clock %d MHz, work %.0f ns per split block\n", clk_khz / 1000, work_ns);
  printf("%5s %4s %10s %10s %10s %10s %10s %10s\n", "H", "S", "split", "split+red", "sr_nopdl", "coop", "coop_pdl",
         "check");
  for (int H : heads)
    for (int S : splits) {
      std::vector<Args> args(kCalls);
      std::vector<float> h_src(size_t(S) * H * (kDV + 1));
      for (size_t i = 0; i < h_src.size(); ++i) h_src[i] = float((i * 2654435761u) % 1000) / 1000.f - 0.5f;
      float* src;
      CK(cudaMalloc(&src, h_src.size() * 4));
      CK(cudaMemcpy(src, h_src.data(), h_src.size() * 4, cudaMemcpyHostToDevice));
      for (auto& a : args) {
        a.src = src;
        CK(cudaMalloc(&a.ws_out, size_t(H) * S * kDV * 4));
        CK(cudaMalloc(&a.ws_lse, size_t(H) * S * 4));
        CK(cudaMalloc(&a.out, size_t(H) * kDV * 2));
        CK(cudaMalloc(&a.out_lse, size_t(H) * 4));
        a.H = H;
        a.S = S;
        a.spin_cycles = (long long)(work_ns * clk_khz / 1e6);
      }
      const int red_ch = H * 4 <= 132 ? 4 : 1;
      auto run = [&](int variant) -> float {
        cudaGraph_t g;
        cudaGraphExec_t ge;
        CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
        cudaError_t err = cudaSuccess;
        for (int i = 0; i < kCalls && err == cudaSuccess; ++i) {
          const Args& a = args[i];
          if (variant == 0) {
            err = launch(split_kernel, S, 256, true, false, st, a);
          } else if (variant == 1 || variant == 2) {
            const bool pdl = variant == 1;
            err = launch(split_kernel, S, 256, pdl, false, st, a);
            if (err == cudaSuccess) {
              if (red_ch == 4) err = launch(reduce_kernel<4>, H * 4, 32, pdl, false, st, a);
              else err = launch(reduce_kernel<1>, H, 128, pdl, false, st, a);
            }
          } else {
            err = launch(coop_kernel, S, 256, variant == 4, true, st, a);
          }
        }
        cudaError_t e2 = cudaStreamEndCapture(st, &g);
        if (err != cudaSuccess || e2 != cudaSuccess) {
          printf("variant %d: launch %s, capture %s\n", variant, cudaGetErrorString(err), cudaGetErrorString(e2));
          cudaGetLastError();
          return -1.f;
        }
        if (cudaGraphInstantiate(&ge, g, 0) != cudaSuccess) {
          printf("variant %d: instantiate %s\n", variant, cudaGetErrorString(cudaGetLastError()));
          return -1.f;
        }
        cudaEvent_t e0, e1;
        CK(cudaEventCreate(&e0));
        CK(cudaEventCreate(&e1));
        std::vector<float> t;
        for (int r = 0; r < 40; ++r) {
          CK(cudaEventRecord(e0, st));
          CK(cudaGraphLaunch(ge, st));
          CK(cudaEventRecord(e1, st));
          CK(cudaStreamSynchronize(st));
          float ms;
          CK(cudaEventElapsedTime(&ms, e0, e1));
          if (r >= 10) t.push_back(ms * 1000.f / kCalls);
        }
        std::sort(t.begin(), t.end());
        CK(cudaGraphExecDestroy(ge));
        CK(cudaGraphDestroy(g));
        return t[t.size() / 2];
      };
      float r[5];
      for (int v = 0; v < 5; ++v) r[v] = run(v);
      // check: coop's output of call 0 against split+reduce's (both bf16 of the same sums)
      std::vector<uint16_t> o_coop(size_t(H) * kDV), o_ref(size_t(H) * kDV);
      CK(launch(coop_kernel, S, 256, false, true, st, args[0]));
      CK(cudaMemcpyAsync(o_coop.data(), args[0].out, o_coop.size() * 2, cudaMemcpyDeviceToHost, st));
      CK(launch(split_kernel, S, 256, false, false, st, args[0]));
      CK(launch(reduce_kernel<1>, H, 128, false, false, st, args[0]));
      CK(cudaMemcpyAsync(o_ref.data(), args[0].out, o_ref.size() * 2, cudaMemcpyDeviceToHost, st));
      CK(cudaStreamSynchronize(st));
      int bad = 0;
      for (size_t i = 0; i < o_ref.size(); ++i) bad += o_ref[i] != o_coop[i];
      printf("%5d %4d %10.2f %10.2f %10.2f %10.2f %10.2f %10s\n", H, S, r[0], r[1], r[2], r[3], r[4],
             bad ? "DIFF" : "same");
      for (auto& a : args) {
        cudaFree(a.ws_out);
        cudaFree(a.ws_lse);
        cudaFree(a.out);
        cudaFree(a.out_lse);
      }
      cudaFree(src);
    }
  return 0;
}
