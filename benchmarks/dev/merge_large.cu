// Dev probe (not part of the library): why does 16384 x 16 x 128 reach only ~91% of the copy
// in bench_merge.py while 4096 x 128 x 128 reaches 100%? Graph-timed like the benchmark: each
// variant captured once per input set (kSets sets, rotated so L2 never serves them) into one
// CUDA graph, replayed; µs per node, median of 20 replays. All library variants launch with PDL
// (as the library does on sm_90+), LSEs as [H, T] buffers (vLLM layout) unless named otherwise.
//   memcpy       : cudaMemcpyAsync of half the call's value bytes, as two copies (LSEs left out)
//   add_once     : out = a + b, one 16-byte chunk per thread, grid covers the call (no LSE)
//   add_gs       : the same, grid-stride over 8 x 256-thread blocks per processor
//   lib          : launch_merge_vec<bf16, 8, 128> (token tiles of 8, the library's choice)
//   lib_tileN    : token tiles of 2^N
//   lib_t256/t64 : 256- / 64-thread blocks
//   lib_lseTH    : LSEs as [T, H] buffers (flat order)
//   lib_nolse    : no output LSE
// Dropped after one run (H200, 2026-11-30): the chunk body in a grid-stride loop with 8/16/32
// blocks of 128 per processor, 51.5-59.9 us at 16384x16x128 and 105-112 at 4096x128x128 (lib 50.3 / 97.1).
// Build: nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Icsrc/include benchmarks/dev/merge_large.cu
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "mla_ext/merge_attn_states.cuh"
#include "dev_fill.cuh"

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); exit(1); } } while (0)

using E = mla_ext::BFloat16Elem;
using OW = mla_ext::SameOutput<E>;

__global__ void __launch_bounds__(256) add_gs(const uint4* a, const uint4* b, uint4* o, uint32_t n) {
  for (uint32_t i = blockIdx.x * 256 + threadIdx.x; i < n; i += gridDim.x * 256) {
    const uint4 x = a[i], y = b[i];
    o[i] = make_uint4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
  }
}

int main() {
  const int64_t shapes[][3] = {{16384, 16, 128}, {4096, 128, 128}, {1, 128, 512}, {64, 128, 512}};
  constexpr int kShapes = 4;
  int sms = 0; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  VariantTable table(kShapes);
  auto rec = [&](int shape, const char* name, float us) { table.rec(shape, name, us); };

  for (int si = 0; si < kShapes; ++si) {
    const int64_t T = shapes[si][0], H = shapes[si][1], D = shapes[si][2];
    const size_t n = size_t(T) * H * D;
    const int sets = int(std::min<size_t>(64, std::max<size_t>(3, (1200u << 20) / (3 * n * 2))));
    std::vector<uint16_t*> A(sets), B(sets), O(sets);
    std::vector<float*> LA(sets), LB(sets), LO(sets);
    // Placement (MERGE_PLACE): 0 one cudaMalloc per tensor; 1 the set's three value tensors
    // back to back in one allocation (what torch's caching allocator does when it carves them
    // out of a larger freed segment); 2 the same with SKEW_KB KiB between them.
    const int place = getenv("MERGE_PLACE") ? atoi(getenv("MERGE_PLACE")) : 0;
    const size_t skew = place == 2 ? size_t(getenv("SKEW_KB") ? atoi(getenv("SKEW_KB")) : 5) << 10 : 0;
    std::vector<uint8_t*> blocks;
    for (int c = 0; c < sets; ++c) {
      if (place == 0) {
        for (auto* v : {&A[c], &B[c], &O[c]}) CK(cudaMalloc(v, n * 2));
      } else {
        uint8_t* base;
        CK(cudaMalloc(&base, 3 * (n * 2 + skew)));
        blocks.push_back(base);
        A[c] = reinterpret_cast<uint16_t*>(base);
        B[c] = reinterpret_cast<uint16_t*>(base + n * 2 + skew);
        O[c] = reinterpret_cast<uint16_t*>(base + 2 * (n * 2 + skew));
      }
      for (auto* l : {&LA[c], &LB[c], &LO[c]}) CK(cudaMalloc(l, T * H * 4));
      fill_random<<<1024, 256>>>(A[c], n, LA[c], T * H, 2 * c + 1);
      fill_random<<<1024, 256>>>(B[c], n, LB[c], T * H, 2 * c + 2);
    }
    CK(cudaDeviceSynchronize());
    auto params = [&](int c, bool th = false) {
      mla_ext::MergeParams p;
      p.dtype = mla_ext::DType::kBFloat16; p.num_tokens = T; p.num_heads = H; p.head_size = D;
      p.output = O[c]; p.output_stride_token = H * D; p.output_stride_head = D;
      p.prefix_output = A[c]; p.prefix_stride_token = H * D; p.prefix_stride_head = D;
      p.suffix_output = B[c]; p.suffix_stride_token = H * D; p.suffix_stride_head = D;
      const int64_t st = th ? H : 1, sh = th ? 1 : T;
      p.prefix_lse = LA[c]; p.prefix_lse_stride_token = st; p.prefix_lse_stride_head = sh;
      p.suffix_lse = LB[c]; p.suffix_lse_stride_token = st; p.suffix_lse_stride_head = sh;
      p.output_lse = LO[c]; p.output_lse_stride_token = st; p.output_lse_stride_head = sh;
      return p;
    };
    const uint32_t nv = uint32_t(n / 8);
    rec(si, "memcpy", graph_us_per_node(s, sets, [&](int c) {  // half the bytes: all of A and half of B into O
      CK(cudaMemcpyAsync(O[c], A[c], n * 2, cudaMemcpyDeviceToDevice, s));
      CK(cudaMemcpyAsync(O[(c + 1) % sets], B[c], n, cudaMemcpyDeviceToDevice, s)); }));
    rec(si, "add_once", graph_us_per_node(s, sets, [&](int c) {
      add_once<128><<<(nv + 127) / 128, 128, 0, s>>>((const uint4*)A[c], (const uint4*)B[c], (uint4*)O[c], nv); }));
    rec(si, "add_gs", graph_us_per_node(s, sets, [&](int c) {
      add_gs<<<sms * 8, 256, 0, s>>>((const uint4*)A[c], (const uint4*)B[c], (uint4*)O[c], nv); }));
    rec(si, "lib", graph_us_per_node(s, sets, [&](int c) { mla_ext::launch_merge_vec<E, OW, 8, 128>(params(c), s); }));
    rec(si, "lib_tile2", graph_us_per_node(s, sets, [&](int c) { mla_ext::launch_merge_vec<E, OW, 8, 128>(params(c), s, 2); }));
    rec(si, "lib_tile4", graph_us_per_node(s, sets, [&](int c) { mla_ext::launch_merge_vec<E, OW, 8, 128>(params(c), s, 4); }));
    rec(si, "lib_tile5", graph_us_per_node(s, sets, [&](int c) { mla_ext::launch_merge_vec<E, OW, 8, 128>(params(c), s, 5); }));
    rec(si, "lib_t256", graph_us_per_node(s, sets, [&](int c) { mla_ext::launch_merge_vec<E, OW, 8, 256>(params(c), s); }));
    rec(si, "lib_t64", graph_us_per_node(s, sets, [&](int c) { mla_ext::launch_merge_vec<E, OW, 8, 64>(params(c), s); }));
    rec(si, "lib_lseTH", graph_us_per_node(s, sets, [&](int c) { mla_ext::launch_merge_vec<E, OW, 8, 128>(params(c, true), s); }));
    rec(si, "lib_nolse", graph_us_per_node(s, sets, [&](int c) { auto p = params(c); p.output_lse = nullptr;
                                                        mla_ext::launch_merge_vec<E, OW, 8, 128>(p, s); }));
    CK(cudaDeviceSynchronize());
    for (int c = 0; c < sets; ++c) {
      if (place == 0) for (auto* v : {A[c], B[c], O[c]}) cudaFree(v);
      for (auto* l : {LA[c], LB[c], LO[c]}) cudaFree(l);
    }
    for (auto* b : blocks) cudaFree(b);
  }
  printf("%-12s", "us per node");
  for (auto& sh : shapes) printf(" %6lldx%3lldx%3lld", (long long)sh[0], (long long)sh[1], (long long)sh[2]);
  printf("\n");
  for (size_t i = 0; i < table.names.size(); ++i) {
    printf("%-12s", table.names[i]);
    for (int k = 0; k < kShapes; ++k) printf(" %16.2f", table.cols[i][k]);
    printf("\n");
  }
  return 0;
}
