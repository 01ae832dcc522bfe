// Developer experiment (not part of the build): where does merge_attn_states lose to the copy?
// Times, on one large bf16 shape, L2-cold (buffers >> L2), CUDA events, median of 20:
//   copy      : cudaMemcpyAsync D2D of the same total bytes
//   add3      : out = a + b (2 reads + 1 write, 16-byte accesses, no LSE)      -> stream ceiling
//   merge     : mla_ext::launch_merge_attn_states, LSE [T,H] contiguous
//   merge_lseT: same with LSE passed as [H,T] transposed views (vLLM layout)
//   tN        : the kernel with N-thread blocks (the library uses kMergeThreads)
//   t128_lseT : LSEs as [H, T] transposed views (the library then tiles 8 tokens per head);
//   t128_lseT_flat: the same in flat (token, head) order; t128_nolse: no output LSE
// History (H200, 2026-11-30, 8192x128x128): copy 202 us, add3 203, a row-per-thread-row
// grid-stride kernel 223-232 (2 chunks/thread) or 248-258 (1), one chunk per thread with no
// loop 193 (128- or 256-thread blocks): the library kernel is now the last.
// Build: nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Icsrc/include benchmarks/dev/merge_variants.cu
#include <algorithm>
#include <string>
#include <utility>
#include <cstdio>
#include <vector>

#include "mla_ext/merge_attn_states.cuh"
#include "dev_fill.cuh"

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); exit(1); } } while (0)

__global__ void add3(const uint4* a, const uint4* b, uint4* o, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint4 x = a[i], y = b[i];
    o[i] = make_uint4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
  }
}


template <typename F>
float time_it(F f) {
  cudaEvent_t s, e;
  cudaEventCreate(&s); cudaEventCreate(&e);
  for (int i = 0; i < 3; ++i) f();
  std::vector<float> ts;
  for (int i = 0; i < 20; ++i) {
    cudaEventRecord(s); f(); cudaEventRecord(e); cudaEventSynchronize(e);
    float ms; cudaEventElapsedTime(&ms, s, e); ts.push_back(ms * 1000.f);
  }
  std::sort(ts.begin(), ts.end());
  return ts[ts.size() / 2];
}

int main() {
  const int64_t shapes[][3] = {{8192, 128, 128}, {4096, 128, 128}, {16384, 16, 128}, {64, 128, 512}, {256, 16, 512}, {1, 128, 512}};
  int sms = 0; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  printf("%-18s %10s %10s %10s %10s %10s\n", "shape", "copy_us", "add3_us", "merge_us", "mergeT_us", "bytes");
  std::vector<std::pair<const char*, std::vector<float>>> variants;
  for (auto& sh : shapes) {
    const int64_t T = sh[0], H = sh[1], D = sh[2];
    const size_t n = size_t(T) * H * D;  // elements
    const int copies = n * 2 < (512u << 20) ? int((512u << 20) / (n * 2)) + 1 : 2;  // rotate sets past L2
    std::vector<uint16_t*> A(copies), B(copies), O(copies);
    std::vector<float*> LA(copies), LB(copies), LO(copies);
    for (int c = 0; c < copies; ++c) {
      CK(cudaMalloc(&A[c], n * 2)); CK(cudaMalloc(&B[c], n * 2)); CK(cudaMalloc(&O[c], n * 2));
      CK(cudaMalloc(&LA[c], T * H * 4)); CK(cudaMalloc(&LB[c], T * H * 4)); CK(cudaMalloc(&LO[c], T * H * 4));
      fill_random<<<1024, 256>>>(A[c], n, LA[c], T * H, 2 * c + 1);
      fill_random<<<1024, 256>>>(B[c], n, LB[c], T * H, 2 * c + 2);
    }
    const size_t bytes = 3 * n * 2 + 3 * T * H * 4;
    int rot = 0;
    float copy_us = time_it([&] { rot = (rot + 1) % copies; cudaMemcpyAsync(O[rot], A[rot], bytes / 2, cudaMemcpyDeviceToDevice); });
    // bytes/2 may exceed one buffer: use two halves instead
    copy_us = time_it([&] { rot = (rot + 1) % copies; cudaMemcpyAsync(O[rot], A[rot], n * 2, cudaMemcpyDeviceToDevice);
                            cudaMemcpyAsync(LO[rot], LA[rot], T * H * 4, cudaMemcpyDeviceToDevice); }) * 1.5f;
    float add_us = time_it([&] { rot = (rot + 1) % copies;
      size_t nv = n / 8; int blocks = int(std::min<size_t>((nv + 255) / 256, size_t(sms) * 8));
      add3<<<blocks, 256>>>((const uint4*)A[rot], (const uint4*)B[rot], (uint4*)O[rot], nv); });
    auto params = [&](bool transposed) {
      rot = (rot + 1) % copies;
      mla_ext::MergeParams p;
      p.dtype = mla_ext::DType::kBFloat16; p.num_tokens = T; p.num_heads = H; p.head_size = D;
      p.output = O[rot]; p.output_stride_token = H * D; p.output_stride_head = D;
      p.prefix_output = A[rot]; p.prefix_stride_token = H * D; p.prefix_stride_head = D;
      p.suffix_output = B[rot]; p.suffix_stride_token = H * D; p.suffix_stride_head = D;
      int64_t st = transposed ? 1 : H, sh = transposed ? T : 1;
      p.prefix_lse = LA[rot]; p.prefix_lse_stride_token = st; p.prefix_lse_stride_head = sh;
      p.suffix_lse = LB[rot]; p.suffix_lse_stride_token = st; p.suffix_lse_stride_head = sh;
      p.output_lse = LO[rot]; p.output_lse_stride_token = st; p.output_lse_stride_head = sh;
      return p;
    };
    auto run_merge = [&](bool transposed) { mla_ext::launch_merge_attn_states(params(transposed), sms, 0); };
    using E = mla_ext::BFloat16Elem;
    using OW = mla_ext::SameOutput<E>;
    auto var = [&](const char* name, auto launch, bool transposed = false) {
      float us = time_it([&] { launch(params(transposed)); });
      size_t i = 0;
      while (i < variants.size() && std::string(variants[i].first) != name) ++i;
      if (i == variants.size()) variants.push_back({name, {}});
      variants[i].second.push_back(us);
    };
    var("t128", [&](mla_ext::MergeParams p) { mla_ext::launch_merge_vec<E, OW, 8, 128>(p, 0); });
    var("t256", [&](mla_ext::MergeParams p) { mla_ext::launch_merge_vec<E, OW, 8, 256>(p, 0); });
    var("t64", [&](mla_ext::MergeParams p) { mla_ext::launch_merge_vec<E, OW, 8, 64>(p, 0); });
    var("t128_lseT", [&](mla_ext::MergeParams p) { mla_ext::launch_merge_vec<E, OW, 8, 128>(p, 0); }, true);
    var("t128_lseT_flat", [&](mla_ext::MergeParams p) { mla_ext::launch_merge_vec<E, OW, 8, 128>(p, 0, 0); }, true);
    var("t128_nolse", [&](mla_ext::MergeParams p) { p.output_lse = nullptr; mla_ext::launch_merge_vec<E, OW, 8, 128>(p, 0); });
    float m_us = time_it([&] { run_merge(false); });
    float mt_us = time_it([&] { run_merge(true); });
    CK(cudaDeviceSynchronize());
    printf("%5lldx%3lldx%3lld %10.2f %10.2f %10.2f %10.2f %10zu\n", (long long)T, (long long)H, (long long)D,
           copy_us, add_us, m_us, mt_us, bytes);
    for (int c = 0; c < copies; ++c) { cudaFree(A[c]); cudaFree(B[c]); cudaFree(O[c]); cudaFree(LA[c]); cudaFree(LB[c]); cudaFree(LO[c]); }
  }
  printf("\nvariant sweep, us per call (shapes in the order above):\n");
  for (auto& v : variants) {
    if (std::string(v.first) == "copy") continue;
    printf("%-10s", v.first);
    for (float us : v.second) printf(" %10.2f", us);
    printf("\n");
  }
  return 0;
}
