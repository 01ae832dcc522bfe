// Dev probe (not part of the library): where does a small merge_attn_states call spend its
// time? Each variant is captured 64 times (rotated input sets, as benchmarks/bench_merge.py)
// into one CUDA graph and replayed; µs per node, median of 20 replays.
//   empty     : <<<1, 32>>> kernel that does nothing (node floor)
//   memcpy    : cudaMemcpyAsync of half the call's bytes (the benchmark's copy ceiling)
//   add_tN    : out = a + b, one 16-byte chunk per thread, N-thread blocks, no LSE
//   lib_tN    : the library kernel (launch_merge_vec) with N-thread blocks, [H, T] LSE views
//   pdl_tN    : the library kernel body behind griddepcontrol.wait, launched with
//               programmatic stream serialisation (PDL); _trig also lets the next node launch early
//   pair_*    : an add_t128 over other buffers (a stand-in for the attention kernel before the
//               merge, not PDL-aware) followed by the merge; µs per pair
// Argument: MiB the rotated input sets span per shape (default 0: 64 sets, e.g. 25 MB at 1x128x512,
// which the 50 MB L2 can hold; the benchmark rotates through >= 256 MiB, L2-cold).
//   lib_t128_hotlse: as lib_t128 with every set reading set 0's LSEs (cached): what cold LSE reads cost
// Second argument "packed": every set's tensors carved back to back (512-byte aligned) from one
// allocation, in the order make_merge_inputs creates them, as torch's caching allocator packs small
// tensors into 2 MiB segments; default: one cudaMalloc per tensor (each on its own 2 MiB page).
// Build: nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Icsrc/include benchmarks/dev/merge_small.cu
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

__global__ void empty_kernel() {}

template <int THREADS, bool TRIGGER>
__global__ void __launch_bounds__(THREADS) merge_pdl(mla_ext::MergeKernelArgs k) {
  if (TRIGGER) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  asm volatile("griddepcontrol.wait;" ::: "memory");
  mla_ext::merge_attn_states_chunk<E, OW, 8>(k, blockIdx.x * THREADS + threadIdx.x);
}

constexpr int kMinSets = 64;

int main(int argc, char** argv) {
  const double span_mib = argc > 1 ? atof(argv[1]) : 0.0;
  const bool packed = argc > 2 && std::string(argv[2]) == "packed";
  const int64_t shapes[][3] = {{1, 128, 512}, {64, 128, 512}, {256, 16, 512}};
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  VariantTable table(3);
  auto rec = [&](int shape, const char* name, float us) { table.rec(shape, name, us); };

  for (int si = 0; si < 3; ++si) {
    const int64_t T = shapes[si][0], H = shapes[si][1], D = shapes[si][2];
    const size_t n = size_t(T) * H * D;
    const double set_bytes = 6.0 * n * 2 + 3.0 * T * H * 4;
    const int kSets = std::max(kMinSets, int(span_mib * 1048576.0 / set_bytes + 0.999));
    printf("shape %lldx%lldx%lld: %d sets (%.0f MiB)\n", (long long)T, (long long)H, (long long)D, kSets,
           kSets * set_bytes / 1048576.0);
    std::vector<uint16_t*> A(kSets), B(kSets), O(kSets), X(kSets), Y(kSets), Z(kSets);
    std::vector<float*> LA(kSets), LB(kSets), LO(kSets);
    auto up512 = [](size_t b) { return (b + 511) / 512 * 512; };
    const size_t vb = up512(n * 2), lb = up512(size_t(T) * H * 4);
    uint8_t* pool = nullptr;
    if (packed) CK(cudaMalloc(&pool, kSets * (6 * vb + 3 * lb)));
    size_t at = 0;
    auto carve = [&](size_t b) { void* p = pool + at; at += b; return p; };
    for (int c = 0; c < kSets; ++c) {
      if (packed) {  // make_merge_inputs' order: values, LSEs, output, output LSE; then the extra buffers
        A[c] = (uint16_t*)carve(vb); B[c] = (uint16_t*)carve(vb);
        LA[c] = (float*)carve(lb); LB[c] = (float*)carve(lb);
        O[c] = (uint16_t*)carve(vb); LO[c] = (float*)carve(lb);
        X[c] = (uint16_t*)carve(vb); Y[c] = (uint16_t*)carve(vb); Z[c] = (uint16_t*)carve(vb);
      } else {
        for (auto* v : {&A[c], &B[c], &O[c], &X[c], &Y[c], &Z[c]}) CK(cudaMalloc(v, n * 2));
        for (auto* l : {&LA[c], &LB[c], &LO[c]}) CK(cudaMalloc(l, T * H * 4));
      }
      fill_random<<<1024, 256>>>(A[c], n, LA[c], T * H, 2 * c + 1);
      fill_random<<<1024, 256>>>(B[c], n, LB[c], T * H, 2 * c + 2);
      fill_random<<<1024, 256>>>(X[c], n, LO[c], T * H, 2 * c + 3);
      fill_random<<<1024, 256>>>(Y[c], n, LO[c], 0, 2 * c + 4);
    }
    CK(cudaDeviceSynchronize());
    auto params = [&](int c) {
      mla_ext::MergeParams p;
      p.dtype = mla_ext::DType::kBFloat16; p.num_tokens = T; p.num_heads = H; p.head_size = D;
      p.output = O[c]; p.output_stride_token = H * D; p.output_stride_head = D;
      p.prefix_output = A[c]; p.prefix_stride_token = H * D; p.prefix_stride_head = D;
      p.suffix_output = B[c]; p.suffix_stride_token = H * D; p.suffix_stride_head = D;
      p.prefix_lse = LA[c]; p.prefix_lse_stride_token = 1; p.prefix_lse_stride_head = T;
      p.suffix_lse = LB[c]; p.suffix_lse_stride_token = 1; p.suffix_lse_stride_head = T;
      p.output_lse = LO[c]; p.output_lse_stride_token = 1; p.output_lse_stride_head = T;
      return p;
    };
    // Flat (token, head) order args, as launch_merge_vec's single launch (calls here are < 2^31 chunks).
    auto args = [&](int c) {
      mla_ext::MergeKernelArgs k;
      k.p = params(c);
      k.num_chunks = uint32_t(n / 8);
      k.first_head = 0;
      k.merge_tokens = uint32_t(T);
      k.chunks_per_row = uint32_t(D / 8);
      k.tile_shift = 0;
      k.num_tokens = 0;
      k.div_chunks = mla_ext::FastDivmod(uint32_t(D / 8));
      k.div_heads = mla_ext::FastDivmod(uint32_t(H));
      return k;
    };
    const uint32_t nv = uint32_t(n / 8);
    auto add = [&](int c, auto kern, int threads, uint16_t* a, uint16_t* b, uint16_t* o) {
      kern<<<(nv + threads - 1) / threads, threads, 0, s>>>((const uint4*)a, (const uint4*)b, (uint4*)o, nv);
    };
    auto pdl = [&](int c, auto kern, int threads) {
      CK(mla_ext::launch_kernel(true, kern, dim3((nv + threads - 1) / threads), dim3(threads), 0, s, args(c)) ==
                 mla_ext::Status::kSuccess
             ? cudaSuccess
             : cudaErrorLaunchFailure);
    };
    rec(si, "empty", graph_us_per_node(s, kSets, [&](int) { empty_kernel<<<1, 32, 0, s>>>(); }));
    rec(si, "memcpy", graph_us_per_node(s, kSets, [&](int c) {
      const size_t bytes = 3 * n * 2 + 3 * T * H * 4;
      CK(cudaMemcpyAsync(X[c], Y[c], std::min(bytes / 2, n * 2), cudaMemcpyDeviceToDevice, s)); }));
    rec(si, "add_t128", graph_us_per_node(s, kSets, [&](int c) { add(c, add_once<128>, 128, A[c], B[c], O[c]); }));
    rec(si, "add_t64", graph_us_per_node(s, kSets, [&](int c) { add(c, add_once<64>, 64, A[c], B[c], O[c]); }));
    rec(si, "add_t32", graph_us_per_node(s, kSets, [&](int c) { add(c, add_once<32>, 32, A[c], B[c], O[c]); }));
    rec(si, "lib_t128", graph_us_per_node(s, kSets, [&](int c) { mla_ext::launch_merge_vec<E, OW, 8, 128>(params(c), s); }));
    rec(si, "lib_t64", graph_us_per_node(s, kSets, [&](int c) { mla_ext::launch_merge_vec<E, OW, 8, 64>(params(c), s); }));
    rec(si, "lib_t32", graph_us_per_node(s, kSets, [&](int c) { mla_ext::launch_merge_vec<E, OW, 8, 32>(params(c), s); }));
    rec(si, "lib_t128_nolse", graph_us_per_node(s, kSets, [&](int c) { auto p = params(c); p.output_lse = nullptr;
                                                        mla_ext::launch_merge_vec<E, OW, 8, 128>(p, s); }));
    rec(si, "lib_t128_hotlse", graph_us_per_node(s, kSets, [&](int c) { auto p = params(c); p.prefix_lse = LA[0];
                                                         p.suffix_lse = LB[0]; p.output_lse = LO[0];
                                                         mla_ext::launch_merge_vec<E, OW, 8, 128>(p, s); }));
    rec(si, "pdl_t128", graph_us_per_node(s, kSets, [&](int c) { pdl(c, merge_pdl<128, false>, 128); }));
    rec(si, "pdl_t64", graph_us_per_node(s, kSets, [&](int c) { pdl(c, merge_pdl<64, false>, 64); }));
    rec(si, "pdl_t128_trig", graph_us_per_node(s, kSets, [&](int c) { pdl(c, merge_pdl<128, true>, 128); }));
    rec(si, "pair_add_lib128", graph_us_per_node(s, kSets, [&](int c) { add(c, add_once<128>, 128, X[c], Y[c], Z[c]);
                                                         mla_ext::launch_merge_vec<E, OW, 8, 128>(params(c), s); }));
    rec(si, "pair_add_pdl128", graph_us_per_node(s, kSets, [&](int c) { add(c, add_once<128>, 128, X[c], Y[c], Z[c]);
                                                         pdl(c, merge_pdl<128, false>, 128); }));
    rec(si, "pair_add_pdl64", graph_us_per_node(s, kSets, [&](int c) { add(c, add_once<128>, 128, X[c], Y[c], Z[c]);
                                                        pdl(c, merge_pdl<64, false>, 64); }));
    rec(si, "pair_add_add", graph_us_per_node(s, kSets, [&](int c) { add(c, add_once<128>, 128, X[c], Y[c], Z[c]);
                                                      add(c, add_once<128>, 128, A[c], B[c], O[c]); }));
    CK(cudaDeviceSynchronize());
    for (int c = 0; c < kSets; ++c) {
      if (packed) break;
      for (auto* v : {A[c], B[c], O[c], X[c], Y[c], Z[c]}) cudaFree(v);
      for (auto* l : {LA[c], LB[c], LO[c]}) cudaFree(l);
    }
    if (packed) cudaFree(pool);
  }
  printf("%-18s %10s %10s %10s\n", "us per node", "1x128x512", "64x128x512", "256x16x512");
  for (size_t i = 0; i < table.names.size(); ++i) printf("%-18s %10.3f %10.3f %10.3f\n", table.names[i], table.cols[i][0], table.cols[i][1], table.cols[i][2]);
  return 0;
}
