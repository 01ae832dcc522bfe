// Shared by the dev probes in this folder (not part of the library): a random fill, an add kernel,
// a graph timer and a results table.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include <cuda_runtime.h>

// Pseudo-random fill (hash of the index): bf16 values in about [-2, 2], fp32 LSEs in [-4, 4], so
// the data is like the benchmark's torch.randn inputs rather than a constant pattern.
__global__ void fill_random(uint16_t* v, size_t n, float* l, size_t nl, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t x = uint32_t(i) * 2654435761u ^ seed;
    x ^= x >> 15; x *= 2246822519u; x ^= x >> 13;
    const float f = (float(x & 0xffffff) / float(1 << 24)) * 4.f - 2.f;
    v[i] = uint16_t(__float_as_uint(f) >> 16);
    if (i < nl) l[i] = f * 2.f;
  }
}

// The stream ceiling: out = a + b, one 16-byte chunk per thread, THREADS-thread blocks, the grid
// covering n chunks (two reads and one write per chunk, no math worth the name).
template <int THREADS>
__global__ void __launch_bounds__(THREADS) add_once(const uint4* a, const uint4* b, uint4* o, uint32_t n) {
  const uint32_t i = blockIdx.x * THREADS + threadIdx.x;
  if (i >= n) return;
  const uint4 x = a[i], y = b[i];
  o[i] = make_uint4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
}

// µs per graph node: call(i) for i in [0, sets) (one launch or copy per input set) captured
// once into a CUDA graph on stream s and replayed; the median of `replays` replays, after
// `warmup` ones (and one eager pass before the capture, for module loading).
inline float graph_us_per_node(cudaStream_t s, int sets, const std::function<void(int)>& call,
                               int replays = 20, int warmup = 3) {
  auto ck = [](cudaError_t e, const char* what) {
    if (e != cudaSuccess) {
      printf("%s: %s\n", what, cudaGetErrorString(e));
      exit(1);
    }
  };
  for (int i = 0; i < sets; ++i) call(i);
  ck(cudaStreamSynchronize(s), "warm-up pass");
  cudaGraph_t g;
  cudaGraphExec_t ge;
  ck(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "begin capture");
  for (int i = 0; i < sets; ++i) call(i);
  ck(cudaStreamEndCapture(s, &g), "end capture");
  ck(cudaGraphInstantiate(&ge, g, 0), "instantiate");
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  for (int i = 0; i < warmup; ++i) ck(cudaGraphLaunch(ge, s), "graph launch");
  std::vector<float> ts;
  for (int r = 0; r < replays; ++r) {
    cudaEventRecord(a, s);
    ck(cudaGraphLaunch(ge, s), "graph launch");
    cudaEventRecord(b, s);
    cudaEventSynchronize(b);
    float ms;
    cudaEventElapsedTime(&ms, a, b);
    ts.push_back(ms * 1000.f / sets);
  }
  std::sort(ts.begin(), ts.end());
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaGraphExecDestroy(ge);
  cudaGraphDestroy(g);
  return ts[ts.size() / 2];
}

// Results by variant name (rows, in first-seen order) and shape index (columns).
struct VariantTable {
  int shapes;
  std::vector<const char*> names;
  std::vector<std::vector<float>> cols;
  explicit VariantTable(int n) : shapes(n) {}
  void rec(int shape, const char* name, float us) {
    size_t i = 0;
    while (i < names.size() && std::string(names[i]) != name) ++i;
    if (i == names.size()) {
      names.push_back(name);
      cols.emplace_back(shapes, 0.f);
    }
    cols[i][shape] = us;
  }
};
