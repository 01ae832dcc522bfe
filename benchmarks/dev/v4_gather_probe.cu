// How fast can a kernel gather the decode's KV rows on this GPU, and does the way it loads them
// matter? A standalone probe (no torch, no library code) for the forty-ninth session's question:
// at 8-16 heads and many tokens the V4 layers run at the speed of the benchmark's warp-per-row
// gather kernel (~2.0 TB/s for V4 rows, 2.7 for V3.2's), with the mma.sync tile and the
// asymmetric tile alike, and the C128 copy goal (70% of the copy) needs more.
//
// Patterns (useful bytes per row as the decode counts them):
//   v32   V3.2 rows, 656 B inline, random slots of 64-row pages;
//   c4    V4 rows of 64-row pages: 576 data bytes, the 8-byte scale row 36,864 B further on
//         in the page (page stride 37,440 B), random slots;
//   c128  V4 rows of 2-row pages (page stride 1,728 B): a token's rows are its pages' rows in
//         order, pages placed at random, so rows come in runs of two with their scales after
//         them (one 1,168-byte run per page).
// Kernels (each reads every useful byte once and XORs it into a checksum all must agree on):
//   warp    one warp per row, 16-byte loads (the benchmark's ceiling kernel);
//   ldg     persistent blocks of 256 threads walk 64-row tiles: registers -> shared memory,
//           the next tile's loads issued before this tile's stores (the decode's gather);
//   cpasyncS  the same with cp.async 16-byte copies, S tiles in flight;
//   bulkS   the same with cp.async.bulk (TMA, one instruction per run) and an mbarrier per
//           stage: per row (data 576/656 B, scale as its 16-byte aligned chunk) or, for c128,
//           per page run (1,168 B), S tiles in flight.
// Prints GB/s of useful bytes and the ratio to a device-to-device copy measured in the same run
// (copy: bytes read + written over time, as mla_ext.bench.copy_bandwidth_gbs, but through
// cudaMemcpyAsync: compare it with the benchmark's copy figure once). The tile kernels run only
// where the occupancy query says 1 / 2 blocks fit a processor, else print "skipped". Not in the
// useful bytes: the row offsets (8-24 B per row, by kernel: 1-4%). Rows are spread over 6 GiB,
// which tries the TLB harder than a smaller cache would.
//
// Build and run (device): nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a \
//   -o /tmp/gp benchmarks/dev/v4_gather_probe.cu && /tmp/gp
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#define CK(x)                                                                            \
  do {                                                                                   \
    cudaError_t e_ = (x);                                                                \
    if (e_ != cudaSuccess) {                                                             \
      std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
      std::exit(1);                                                                      \
    }                                                                                    \
  } while (0)

constexpr int kTileRows = 64, kThreads = 256;

__device__ __forceinline__ uint32_t hash32(uint64_t i) {
  uint64_t x = i * 0x9E3779B97F4A7C15ull;
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  return uint32_t(x ^ (x >> 32));
}
__global__ void fill(uint32_t* p, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    p[i] = hash32(i);
}
__device__ __forceinline__ uint32_t x4(uint4 v) { return v.x ^ v.y ^ v.z ^ v.w; }

// ---- warp per row ----
__global__ void warp_rows(const uint8_t* base, const long long* doff, const long long* soff, int dbytes, int n,
                          uint32_t* out) {
  const int row = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;
  if (row >= n) return;
  const uint4* d = reinterpret_cast<const uint4*>(base + doff[row]);
  uint32_t acc = 0;
  for (int i = lane; i < dbytes / 16; i += 32) acc ^= x4(d[i]);
  if (soff != nullptr && lane == 0) {
    const uint2 s = *reinterpret_cast<const uint2*>(base + soff[row]);
    acc ^= s.x ^ s.y;
  }
  for (int o = 16; o > 0; o >>= 1) acc ^= __shfl_xor_sync(0xffffffffu, acc, o);
  if (lane == 0) out[row] = acc;
}

// ---- tiles: shared helpers ----
// Tile layout in shared memory: 64 rows of `pitch` bytes (data), then 64 scale slots of 16 B.
struct TileArgs {
  const uint8_t* base;
  const long long* doff;  // [tiles * 64]
  const long long* soff;  // [tiles * 64] or null
  int dbytes, tiles;
  uint32_t* out;  // [gridDim.x] per-block checksums
};
constexpr int kMaxChunks = 11;  // ceil(64 * 656 / 16 / 256)

// Reads back a stage from shared memory (what a consumer would) and folds it into acc: `flat`
// bytes of data as 16-byte chunks, then (scales) 64 scale rows of 8 bytes in 16-byte slots, at
// the slot's start, or (chunk16: the bulk kernel copies each row's 16-byte aligned chunk holding
// its scale row) at the row's offset within the chunk.
__device__ __forceinline__ uint32_t consume(const uint8_t* st, int flat, bool scales, bool chunk16,
                                            const long long* soff, int tile) {
  uint32_t acc = 0;
  for (int u = threadIdx.x; u < flat / 16; u += kThreads) acc ^= x4(*reinterpret_cast<const uint4*>(st + 16 * u));
  if (scales && threadIdx.x < kTileRows) {
    const uint8_t* s = st + flat + 16 * threadIdx.x;
    if (chunk16) s += soff[size_t(tile) * kTileRows + threadIdx.x] & 15;
    const uint2 v = *reinterpret_cast<const uint2*>(s);
    acc ^= v.x ^ v.y;
  }
  return acc;
}

// Row offsets reach the tile kernels one tile ahead, as the decode's row addresses do (it loads
// them three tiles ahead): threads 0..63 load a later tile's offsets into registers at the top of
// an iteration and put them in a shared slot after the tile's barrier, so the data loads read
// their addresses from shared memory instead of waiting on a global load each.
struct Offs {
  long long d[kTileRows], s[kTileRows];
};
__device__ __forceinline__ void fetch_offs(const TileArgs& a, int tile, long long& d, long long& s) {
  if (threadIdx.x < kTileRows && tile < a.tiles) {
    d = a.doff[size_t(tile) * kTileRows + threadIdx.x];
    s = a.soff != nullptr ? a.soff[size_t(tile) * kTileRows + threadIdx.x] : 0;
  }
}
__device__ __forceinline__ void put_offs(Offs& o, long long d, long long s) {
  if (threadIdx.x < kTileRows) o.d[threadIdx.x] = d, o.s[threadIdx.x] = s;
}

// ---- ldg: registers -> shared, next tile's loads before this tile's stores ----
__global__ void __launch_bounds__(kThreads) tile_ldg(TileArgs a) {
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ Offs offs[2];  // slot it & 1: the offsets of the block's it-th tile
  const int cpr = a.dbytes / 16, units = kTileRows * cpr;
  uint4 r[2][kMaxChunks];
  uint2 s[2];
  uint32_t acc = 0;
  auto load = [&](const Offs& o, int b) {
#pragma unroll
    for (int k = 0; k < kMaxChunks; ++k) {
      const int u = threadIdx.x + kThreads * k;
      if (u < units) r[b][k] = *reinterpret_cast<const uint4*>(a.base + o.d[u / cpr] + 16 * (u % cpr));
    }
    if (a.soff != nullptr && threadIdx.x < kTileRows)
      s[b] = *reinterpret_cast<const uint2*>(a.base + o.s[threadIdx.x]);
  };
  auto store = [&](int b) {
#pragma unroll
    for (int k = 0; k < kMaxChunks; ++k) {
      const int u = threadIdx.x + kThreads * k;
      if (u < units) *reinterpret_cast<uint4*>(smem + 16 * u) = r[b][k];
    }
    if (a.soff != nullptr && threadIdx.x < kTileRows)
      *reinterpret_cast<uint2*>(smem + kTileRows * a.dbytes + 16 * threadIdx.x) = s[b];
  };
  const int G = gridDim.x;
  long long od = 0, os = 0;
  fetch_offs(a, blockIdx.x, od, os);
  put_offs(offs[0], od, os);
  fetch_offs(a, blockIdx.x + G, od, os);
  put_offs(offs[1], od, os);
  __syncthreads();
  if (int(blockIdx.x) < a.tiles) load(offs[0], 0);
  int it = 0;
  for (int tile = blockIdx.x; tile < a.tiles; tile += G, ++it) {
    const int next = tile + G;
    fetch_offs(a, next + G, od, os);  // in flight until after the barrier below
    // (two register buffers by parity: written out so that the arrays stay in registers)
    if (it & 1) {
      if (next < a.tiles) load(offs[0], 0);
      store(1);
    } else {
      if (next < a.tiles) load(offs[1], 1);
      store(0);
    }
    __syncthreads();
    acc ^= consume(smem, kTileRows * a.dbytes, a.soff != nullptr, false, a.soff, tile);
    put_offs(offs[it & 1], od, os);  // tile's slot: its loads were issued a turn ago
    __syncthreads();
  }
  for (int o = 16; o > 0; o >>= 1) acc ^= __shfl_xor_sync(0xffffffffu, acc, o);
  if ((threadIdx.x & 31) == 0) atomicXor(&a.out[blockIdx.x], acc);
}

// ---- cp.async, S tiles in flight ----
template <int S>
__global__ void __launch_bounds__(kThreads) tile_cpasync(TileArgs a, int stage_bytes) {
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ Offs offs[S];  // slot i % S: the offsets of the block's i-th tile
  const int cpr = a.dbytes / 16, units = kTileRows * cpr;
  uint32_t acc = 0;
  auto issue = [&](int tile, int st) {
    if (tile < a.tiles) {
      const Offs& o = offs[st];
      uint8_t* dst = smem + st * stage_bytes;
      for (int u = threadIdx.x; u < units; u += kThreads) {
        const uint32_t d = uint32_t(__cvta_generic_to_shared(dst + 16 * u));
        const uint8_t* src = a.base + o.d[u / cpr] + 16 * (u % cpr);
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src) : "memory");
      }
      if (a.soff != nullptr && threadIdx.x < kTileRows) {
        const uint32_t d = uint32_t(__cvta_generic_to_shared(dst + kTileRows * a.dbytes + 16 * threadIdx.x));
        const uint8_t* src = a.base + o.s[threadIdx.x];
        asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(d), "l"(src) : "memory");
      }
    }
    asm volatile("cp.async.commit_group;\n" ::: "memory");  // (an empty group past the end)
  };
  const int G = gridDim.x;
  long long od = 0, os = 0;
#pragma unroll
  for (int i = 0; i < S; ++i) {
    fetch_offs(a, blockIdx.x + i * G, od, os);
    put_offs(offs[i], od, os);
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < S - 1; ++i) issue(blockIdx.x + i * G, i);
  int st = 0;
  for (int tile = blockIdx.x; tile < a.tiles; tile += G) {
    fetch_offs(a, tile + S * G, od, os);  // in flight until after the barrier below
    issue(tile + (S - 1) * G, (st + S - 1) % S);
    asm volatile("cp.async.wait_group %0;\n" ::"n"(S - 1) : "memory");
    __syncthreads();
    acc ^= consume(smem + st * stage_bytes, kTileRows * a.dbytes, a.soff != nullptr, false, a.soff, tile);
    put_offs(offs[st], od, os);  // tile's slot: its copies were issued S - 1 turns ago
    __syncthreads();
    st = (st + 1) % S;
  }
  asm volatile("cp.async.wait_all;\n" ::: "memory");
  for (int o = 16; o > 0; o >>= 1) acc ^= __shfl_xor_sync(0xffffffffu, acc, o);
  if ((threadIdx.x & 31) == 0) atomicXor(&a.out[blockIdx.x], acc);
}

// ---- cp.async.bulk (TMA), S tiles in flight, one mbarrier per stage ----
struct BulkArgs {
  const uint8_t* base;
  const long long* run_off;  // [tiles * runs]: global byte offsets of the runs
  const int* run_dst;        // [runs]: byte offset of run r in the stage (same for every tile)
  int runs, run_bytes;       // data runs per tile, bytes each
  const long long* soff;     // [tiles * 64] scale rows (each copied as its 16-byte chunk) or null
  int tiles, tile_bytes;     // bytes a stage's mbarrier waits for
  int flat;                  // data bytes of a stage (the runs), before the scale slots
  uint32_t* out;
};
__device__ __forceinline__ void mbar_init(uint32_t a, uint32_t n) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(a), "r"(n) : "memory");
}
__device__ __forceinline__ void mbar_expect(uint32_t a, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(a), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t a, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred p;\nGP_W_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra GP_W_%=;\n}\n" ::"r"(a),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void bulk_g2s(uint32_t dst, const void* src, uint32_t bytes, uint32_t mbar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(mbar)
               : "memory");
}
template <int S>
__global__ void __launch_bounds__(kThreads) tile_bulk(BulkArgs a, int stage_bytes) {
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ __align__(8) uint64_t bar[S];
  if (threadIdx.x == 0) {
    for (int i = 0; i < S; ++i) mbar_init(uint32_t(__cvta_generic_to_shared(&bar[i])), 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  uint32_t acc = 0;
  auto issue = [&](int tile, int st) {
    if (tile >= a.tiles) return;
    const uint32_t mb = uint32_t(__cvta_generic_to_shared(&bar[st]));
    const uint32_t dst = uint32_t(__cvta_generic_to_shared(smem + st * stage_bytes));
    if (threadIdx.x == 0) mbar_expect(mb, uint32_t(a.tile_bytes));
    for (int r = threadIdx.x; r < a.runs; r += kThreads)
      bulk_g2s(dst + a.run_dst[r], a.base + a.run_off[size_t(tile) * a.runs + r], uint32_t(a.run_bytes), mb);
    if (a.soff != nullptr && threadIdx.x >= kThreads - kTileRows) {
      const int r = threadIdx.x - (kThreads - kTileRows);
      const long long so = a.soff[size_t(tile) * kTileRows + r] & ~15ll;
      bulk_g2s(dst + a.flat + 16 * r, a.base + so, 16u, mb);
    }
  };
#pragma unroll
  for (int i = 0; i < S; ++i) issue(blockIdx.x + i * gridDim.x, i);
  int st = 0, phase = 0;
  for (int tile = blockIdx.x; tile < a.tiles; tile += gridDim.x) {
    mbar_wait(uint32_t(__cvta_generic_to_shared(&bar[st])), uint32_t(phase));
    acc ^= consume(smem + st * stage_bytes, a.flat, a.soff != nullptr, true, a.soff, tile);
    __syncthreads();  // every thread is done reading the stage before it is refilled
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // generic reads, then async writes
    issue(tile + S * gridDim.x, st);
    if (++st == S) st = 0, phase ^= 1;
  }
  for (int o = 16; o > 0; o >>= 1) acc ^= __shfl_xor_sync(0xffffffffu, acc, o);
  if ((threadIdx.x & 31) == 0) atomicXor(&a.out[blockIdx.x], acc);
}

__global__ void xor_reduce(const uint32_t* v, size_t n, uint32_t* res) {
  uint32_t acc = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) acc ^= v[i];
  for (int o = 16; o > 0; o >>= 1) acc ^= __shfl_xor_sync(0xffffffffu, acc, o);
  if ((threadIdx.x & 31) == 0) atomicXor(res, acc);
}

// ---- host ----
struct Pattern {
  const char* name;
  int dbytes;                          // data bytes per row
  std::vector<long long> doff, soff;   // per row (soff empty: no scale rows)
  std::vector<long long> run_off;      // bulk runs (per tile: `runs` of them)
  std::vector<int> run_dst;
  int runs = 0, run_bytes = 0;
  double useful_per_row;
};

template <class F, class P>
float time_ms(F&& f, P&& pre, int reps = 5) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  pre();
  f();  // warm-up
  CK(cudaDeviceSynchronize());
  std::vector<float> t;
  for (int i = 0; i < reps; ++i) {
    pre();
    CK(cudaEventRecord(a));
    f();
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}
template <class F>
float time_ms(F&& f) {
  return time_ms(f, [] {});
}

int main(int argc, char** argv) {
  const size_t cache_bytes = size_t(6) << 30;  // >> the 50 MB L2: every run is L2-cold
  const int rows = argc > 1 ? std::atoi(argv[1]) : 4 << 20;  // rows per pattern (multiple of 64)
  if (rows <= 0 || rows % kTileRows != 0) {
    std::printf("rows must be a positive multiple of %d, got %d\n", kTileRows, rows);
    return 1;
  }
  int sms;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  uint8_t* cache;
  CK(cudaMalloc(&cache, cache_bytes));
  fill<<<4 * sms, 256>>>(reinterpret_cast<uint32_t*>(cache), cache_bytes / 4);
  CK(cudaGetLastError());

  // copy ceiling: 1 GiB device to device
  const size_t cb = size_t(1) << 30;
  float copy_ms = time_ms([&] { CK(cudaMemcpyAsync(cache + cb, cache, cb, cudaMemcpyDeviceToDevice)); });
  const double copy_gbs = 2.0 * cb / copy_ms / 1e6;
  std::printf("copy: %.0f GB/s (read + written), %d SMs, %d rows per pattern\n", copy_gbs, sms, rows);

  std::mt19937_64 rng(1234);
  std::vector<Pattern> pats;
  {  // v32: 656-byte rows, 64-row pages
    Pattern p{"v32", 656};
    const long long page = 64 * 656, pages = cache_bytes / page;
    for (int i = 0; i < rows; ++i) {
      const long long s = rng() % (pages * 64);
      p.doff.push_back((s / 64) * page + (s % 64) * 656);
    }
    p.runs = kTileRows, p.run_bytes = 656;
    p.run_off = p.doff;
    for (int r = 0; r < kTileRows; ++r) p.run_dst.push_back(r * 656);
    p.useful_per_row = 656;
    pats.push_back(p);
  }
  {  // c4: V4, 64-row pages, stride 37,440 B
    Pattern p{"c4", 576};
    const long long page = 37440, pages = cache_bytes / page;
    for (int i = 0; i < rows; ++i) {
      const long long s = rng() % (pages * 64), pg = s / 64, o = s % 64;
      p.doff.push_back(pg * page + o * 576);
      p.soff.push_back(pg * page + 64 * 576 + o * 8);
    }
    p.runs = kTileRows, p.run_bytes = 576;
    p.run_off = p.doff;
    for (int r = 0; r < kTileRows; ++r) p.run_dst.push_back(r * 576);
    p.useful_per_row = 584;
    pats.push_back(p);
  }
  {  // c128: V4, 2-row pages, stride 1,728 B, pages at random, rows in page order
    Pattern p{"c128", 576};
    const long long page = 1728, pages = cache_bytes / page;
    for (int i = 0; i < rows / 2; ++i) {
      const long long pg = rng() % pages;
      for (int o = 0; o < 2; ++o) {
        p.doff.push_back(pg * page + o * 576);
        p.soff.push_back(pg * page + 2 * 576 + o * 8);
      }
      p.run_off.push_back(pg * page);  // one run per page: both data rows and both scale rows
    }
    // a stage holds 32 page runs of 1,168 B back to back
    p.runs = kTileRows / 2, p.run_bytes = 1168;
    for (int r = 0; r < kTileRows / 2; ++r) p.run_dst.push_back(r * 1168);
    p.useful_per_row = 584;
    pats.push_back(p);
  }

  long long *d_doff, *d_soff, *d_run;
  int* d_dst;
  uint32_t *d_out, *d_res;
  CK(cudaMalloc(&d_doff, sizeof(long long) * rows));
  CK(cudaMalloc(&d_soff, sizeof(long long) * rows));
  CK(cudaMalloc(&d_run, sizeof(long long) * rows));
  CK(cudaMalloc(&d_dst, sizeof(int) * kTileRows));
  CK(cudaMalloc(&d_out, sizeof(uint32_t) * rows));
  CK(cudaMalloc(&d_res, sizeof(uint32_t)));
  const int tiles = rows / kTileRows;

  std::printf("%-6s %-12s %8s %9s %8s %10s\n", "layout", "kernel", "ms", "GB/s", "%copy", "checksum");
  for (auto& p : pats) {
    CK(cudaMemcpy(d_doff, p.doff.data(), sizeof(long long) * rows, cudaMemcpyHostToDevice));
    const bool sc = !p.soff.empty();
    if (sc) CK(cudaMemcpy(d_soff, p.soff.data(), sizeof(long long) * rows, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_run, p.run_off.data(), sizeof(long long) * p.run_off.size(), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_dst, p.run_dst.data(), sizeof(int) * p.run_dst.size(), cudaMemcpyHostToDevice));
    const double useful = p.useful_per_row * rows;
    auto report = [&](const char* k, float ms, size_t outs) {
      CK(cudaMemset(d_res, 0, 4));
      xor_reduce<<<sms, 256>>>(d_out, outs, d_res);
      uint32_t res;
      CK(cudaMemcpy(&res, d_res, 4, cudaMemcpyDeviceToHost));
      const double gbs = useful / ms / 1e6;
      std::printf("%-6s %-12s %8.3f %9.0f %8.1f %10x\n", p.name, k, ms, gbs, 100.0 * gbs / copy_gbs, res);
    };
    const TileArgs ta{cache, d_doff, sc ? d_soff : nullptr, p.dbytes, tiles, d_out};
    const int stage = kTileRows * p.dbytes + (sc ? 16 * kTileRows : 0);
    // warp per row
    float ms = time_ms([&] {
      warp_rows<<<(rows * 32 + 255) / 256, 256>>>(cache, d_doff, sc ? d_soff : nullptr, p.dbytes, rows, d_out);
    });
    CK(cudaGetLastError());
    report("warp", ms, rows);
    for (int bps : {1, 2}) {  // blocks per processor (the decode's tiles: 2 for mma.sync, 1 for A16)
      const int grid = bps * sms;
      char name[16];
      auto zero = [&] { CK(cudaMemsetAsync(d_out, 0, sizeof(uint32_t) * grid)); };
      // Opt in to `smem` bytes, ask for the largest carveout, and run only where `bps` blocks
      // of the kernel fit one processor (else the grid would run in two waves, unnoticed).
      auto fits = [&](auto kern, int smem, int want, const char* what) {
        cudaFuncAttributes fa;
        CK(cudaFuncGetAttributes(&fa, kern));
        if (smem + int(fa.sharedSizeBytes) > 227 * 1024) return false;
        CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        CK(cudaFuncSetAttribute(kern, cudaFuncAttributePreferredSharedMemoryCarveout, 100));
        int n = 0;
        CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kern, kThreads, smem));
        if (n < want) std::printf("%-6s %-12s skipped: %d block(s) per processor fit\n", p.name, what, n);
        return n >= want;
      };
      // one tile kernel: `label` + "/" + bps, `smem` dynamic bytes, its arguments
      auto run = [&](auto kern, const char* label, int smem, auto... args) {
        std::snprintf(name, sizeof name, "%s/%d", label, bps);
        if (!fits(kern, smem, bps, name)) return;
        ms = time_ms([&] { kern<<<grid, kThreads, smem>>>(args...); }, zero);
        CK(cudaGetLastError());
        report(name, ms, grid);
      };
      run(tile_ldg, "ldg", stage, ta);
      run(tile_cpasync<2>, "cpasync2", 2 * stage, ta, stage);
      run(tile_cpasync<3>, "cpasync3", 3 * stage, ta, stage);
      run(tile_cpasync<4>, "cpasync4", 4 * stage, ta, stage);
      // c128: 32 page runs of 1,168 B (both data rows, then both scale rows: the same bytes
      // as the row-wise kernels read, so the same checksum); else one run per data row
      const bool page_runs = p.run_bytes == 1168, bsc = sc && !page_runs;
      const int flat = p.runs * p.run_bytes;
      const int bstage = flat + (bsc ? 16 * kTileRows : 0);
      const BulkArgs ba{cache, d_run, d_dst, p.runs, p.run_bytes, bsc ? d_soff : nullptr,
                        tiles, bstage, flat, d_out};
      run(tile_bulk<2>, "bulk2", 2 * bstage, ba, bstage);
      run(tile_bulk<3>, "bulk3", 3 * bstage, ba, bstage);
      run(tile_bulk<4>, "bulk4", 4 * bstage, ba, bstage);
    }
  }
  std::printf("(checksums: every kernel of a layout must print the same one)\n");
  return 0;
}
