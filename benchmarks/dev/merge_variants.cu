// Developer experiment (not part of the build): where does merge_attn_states lose to the copy?
// Times, on one large bf16 shape, L2-cold (buffers >> L2), CUDA events, median of 20:
//   copy      : cudaMemcpyAsync D2D of the same total bytes
//   add3      : out = a + b (2 reads + 1 write, 16-byte accesses, no LSE)      -> stream ceiling
//   merge     : mla_ext::launch_merge_attn_states, LSE [T,H] contiguous
//   merge_lseT: same with LSE passed as [H,T] transposed views (vLLM layout)
//   cCPT[bMIN gGRID]: the kernel with other tuning constants (chunks per thread and trip,
//             register-cap blocks per SM, blocks per SM before the grid strides)
//   c2nospread: c2 without the small-call rule (256-thread blocks however few rows)
//   flatN     : one chunk per thread, no loop, N-thread blocks (flat_one_shot below)
// Build: nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Icsrc/include benchmarks/dev/merge_variants.cu
#include <algorithm>
#include <string>
#include <utility>
#include <cstdio>
#include <vector>

#include "mla_ext/merge_attn_states.cuh"

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); exit(1); } } while (0)

__global__ void add3(const uint4* a, const uint4* b, uint4* o, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint4 x = a[i], y = b[i];
    o[i] = make_uint4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
  }
}

// One 16-byte chunk per thread, no loop, THREADS-thread blocks (the layout of
// the public kernel the issue quotes at 97% of the copy), this library's
// numerics: is the layout what the row kernel lacks on large calls?
template <int THREADS>
__global__ void __launch_bounds__(THREADS) flat_one_shot(mla_ext::MergeKernelArgs k, mla_ext::FastDivmod div_cpr,
                                                         uint32_t total) {
  using E = mla_ext::BFloat16Elem;
  using V = mla_ext::VecN<uint16_t, 8>;
  const uint32_t idx = blockIdx.x * THREADS + threadIdx.x;
  if (idx >= total) return;
  const mla_ext::MergeParams& p = k.p;
  const uint32_t row = div_cpr.div(idx);
  const uint32_t c = idx - row * k.chunks_per_row;
  const uint32_t t = k.div_heads.div(row);
  const uint32_t h = row - t * uint32_t(p.num_heads);
  const V b = *reinterpret_cast<const V*>(static_cast<const uint16_t*>(p.suffix_output) + int64_t(t) * p.suffix_stride_token +
                                          int64_t(h) * p.suffix_stride_head + c * 8);
  const V a = *reinterpret_cast<const V*>(static_cast<const uint16_t*>(p.prefix_output) + int64_t(t) * p.prefix_stride_token +
                                          int64_t(h) * p.prefix_stride_head + c * 8);
  const float la = p.prefix_lse[int64_t(t) * p.prefix_lse_stride_token + int64_t(h) * p.prefix_lse_stride_head];
  const float lb = p.suffix_lse[int64_t(t) * p.suffix_lse_stride_token + int64_t(h) * p.suffix_lse_stride_head];
  const mla_ext::MergeRow r = mla_ext::merge_row(la, lb);
  *reinterpret_cast<V*>(static_cast<uint16_t*>(p.output) + int64_t(t) * p.output_stride_token +
                        int64_t(h) * p.output_stride_head + c * 8) =
      mla_ext::merge_chunk<E, mla_ext::SameOutput<E>, 8>(r, a, b, 1.f);
  if (c == 0) p.output_lse[int64_t(t) * p.output_lse_stride_token + int64_t(h) * p.output_lse_stride_head] = r.lse;
}

template <int THREADS>
void launch_flat(const mla_ext::MergeParams& p) {
  mla_ext::MergeKernelArgs k;
  k.p = p;
  k.num_rows = uint32_t(p.num_tokens * p.num_heads);
  k.chunks_per_row = uint32_t(p.head_size / 8);
  k.div_heads = mla_ext::FastDivmod(uint32_t(p.num_heads));
  const uint32_t total = k.num_rows * k.chunks_per_row;
  flat_one_shot<THREADS><<<(total + THREADS - 1) / THREADS, THREADS>>>(k, mla_ext::FastDivmod(k.chunks_per_row), total);
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
  const int64_t shapes[][3] = {{8192, 128, 128}, {16384, 16, 128}, {64, 128, 512}, {256, 16, 512}, {1, 128, 512}};
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
      cudaMemset(A[c], 0x3c, n * 2); cudaMemset(B[c], 0x3d, n * 2);
      cudaMemset(LA[c], 0x3f, T * H * 4); cudaMemset(LB[c], 0x3e, T * H * 4);
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
    auto var = [&](const char* name, auto launch) {
      float us = time_it([&] { launch(params(false)); });
      size_t i = 0;
      while (i < variants.size() && std::string(variants[i].first) != name) ++i;
      if (i == variants.size()) variants.push_back({name, {}});
      variants[i].second.push_back(us);
    };
    var("c2", [&](mla_ext::MergeParams p) { mla_ext::launch_merge_vec<E, OW, 8, 2, 1>(p, sms, 0, 1 << 16); });
    var("c1", [&](mla_ext::MergeParams p) { mla_ext::launch_merge_vec<E, OW, 8, 1, 1>(p, sms, 0, 1 << 16); });
    var("c2b4g16", [&](mla_ext::MergeParams p) { mla_ext::launch_merge_vec<E, OW, 8, 2, 4>(p, sms, 0, 16); });
    var("c2nospread", [&](mla_ext::MergeParams p) { mla_ext::launch_merge_vec<E, OW, 8, 2, 1>(p, sms, 0, 1 << 16, false); });
    var("c1b4g16", [&](mla_ext::MergeParams p) { mla_ext::launch_merge_vec<E, OW, 8, 1, 4>(p, sms, 0, 16); });
    var("flat128", [&](mla_ext::MergeParams p) { launch_flat<128>(p); });
    var("flat256", [&](mla_ext::MergeParams p) { launch_flat<256>(p); });
    var("c4b3g16", [&](mla_ext::MergeParams p) { mla_ext::launch_merge_vec<E, OW, 8, 4, 3>(p, sms, 0, 16); });
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
