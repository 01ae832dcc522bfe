// merge_attn_states GPU kernel and launcher (CUDA and HIP, one source).
//
// Memory-bound: every output element costs one read of each input and one
// write. One thread per VEC-element chunk of a (token, head) row, one chunk per
// thread and no loop: a 128-thread block covers 128 consecutive chunks, and the
// grid covers the whole call (long calls are cut into launches of < 2^31
// chunks). Each thread reads its row's two LSEs (shared with the row's other
// chunks through L1), its two input chunks, and writes one output chunk, with
// the widest access the pointers and strides allow (16 bytes when aligned). Any
// head_size and any number of heads (a flat chunk index, no per-block limit on
// num_heads x head_size). Each chunk is read and written by one thread only,
// read before it is written, so the output may alias an input.
#pragma once

#include "mla_ext/compat.h"
#include "mla_ext/merge_attn_states.h"

namespace mla_ext {

// Division by a run-time invariant 32-bit divisor through a multiply-high
// (Granlund-Montgomery); exact for every 32-bit numerator.
struct FastDivmod {
  uint32_t divisor = 1, multiplier = 1, shift = 0;
  FastDivmod() = default;
  explicit FastDivmod(uint32_t d) : divisor(d) {
    shift = 0;
    while ((uint64_t(1) << shift) < d) ++shift;
    uint64_t m = ((uint64_t(1) << 32) * ((uint64_t(1) << shift) - d)) / d + 1;
    multiplier = uint32_t(m);
  }
  MLA_EXT_HD uint32_t div(uint32_t n) const {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
    uint32_t hi = __umulhi(n, multiplier);
#else
    uint32_t hi = uint32_t((uint64_t(n) * multiplier) >> 32);
#endif
    return uint32_t((uint64_t(hi) + n) >> shift);
  }
};

template <typename T, int N>
struct alignas(sizeof(T) * N) VecN {
  T v[N];
};

struct MergeKernelArgs {
  MergeParams p;           // pointers advanced to this launch's first token
  uint32_t num_chunks;     // chunks in this launch (< 2^31)
  uint32_t first_head;     // head of this launch's first row (< 2^31)
  uint32_t merge_tokens;   // tokens [0, merge_tokens) merge, the rest copy the suffix
  uint32_t chunks_per_row;
  uint32_t tile_shift;     // 0: rows in (token, head) order; s > 0: (token / 2^s, head, token % 2^s)
  uint32_t num_tokens;     // tokens in this launch (rows of padded token tiles past it do nothing)
  FastDivmod div_chunks;   // by chunks_per_row
  FastDivmod div_heads;    // by num_heads
};

// Output chunk writers: O::write per element for the selecting modes, and a
// straight-line fp32 combine for the mixing rows (no per-element mode switch;
// bf16 results rounded in pairs).
template <typename E, typename O, int VEC>
__device__ __forceinline__ VecN<typename O::storage, VEC> merge_chunk(const MergeRow& r,
                                                                     const VecN<typename E::storage, VEC>& a,
                                                                     const VecN<typename E::storage, VEC>& b,
                                                                     float inv_scale) {
  VecN<typename O::storage, VEC> o;
  if (r.mode == MergeMode::kMix) {
    float f[VEC];
#pragma unroll
    for (int i = 0; i < VEC; ++i) f[i] = E::load(a.v[i]) * r.prefix_weight + E::load(b.v[i]) * r.suffix_weight;
    if constexpr (!O::kScaled && VEC % 2 == 0 && sizeof(typename O::storage) == 2) {
#pragma unroll
      for (int i = 0; i < VEC; i += 2) {
        const uint32_t w = E::store2(f[i], f[i + 1]);  // output dtype = input dtype here
        o.v[i] = typename O::storage(w & 0xffffu);
        o.v[i + 1] = typename O::storage(w >> 16);
      }
    } else {
#pragma unroll
      for (int i = 0; i < VEC; ++i) o.v[i] = O::from_float(f[i], inv_scale);
    }
  } else {
#pragma unroll
    for (int i = 0; i < VEC; ++i) o.v[i] = O::write(r, a.v[i], b.v[i], inv_scale);
  }
  return o;
}

// One VEC-element chunk per thread: chunk index -> (row, chunk in row) ->
// (token, head), all in 32-bit arithmetic (first_head + row < 2^32). Rows go
// in (token, head) order, or, when the LSEs have token stride 1 (vLLM's
// [num_heads, num_tokens] buffers), in tiles of 2^tile_shift tokens of one
// head, so that a block's LSE loads and stores share 32-byte sectors. The
// thread loads both input chunks and the row's two LSEs before it works out
// the merge weights, then stores its output chunk; chunk 0's thread writes the
// row's output LSE. O writes the output element (SameOutput: the input dtype;
// Fp8Output: scaled, saturated e4m3). Tokens at or after merge_tokens copy the
// suffix and never read the prefix.
template <typename E, typename O, int VEC>
__device__ __forceinline__ void merge_attn_states_chunk(const MergeKernelArgs& k, uint32_t idx) {
  using S = typename E::storage;
  using V = VecN<S, VEC>;
  using VO = VecN<typename O::storage, VEC>;
  if (idx >= k.num_chunks) return;
  const MergeParams& p = k.p;
  const uint32_t row = k.div_chunks.div(idx);
  const uint32_t c = idx - row * k.chunks_per_row;
  uint32_t t, h;
  if (k.tile_shift == 0) {
    const uint32_t r0 = k.first_head + row;
    t = k.div_heads.div(r0);
    h = r0 - t * uint32_t(p.num_heads);
  } else {  // token tiles: the 2^s rows of one head are neighbours (LSEs with token stride 1)
    const uint32_t g = row >> k.tile_shift;
    const uint32_t tile = k.div_heads.div(g);
    h = g - tile * uint32_t(p.num_heads);
    t = (tile << k.tile_shift) + (row & ((1u << k.tile_shift) - 1u));
    if (t >= k.num_tokens) return;
  }
  const bool merge = t < k.merge_tokens;
  wait_for_prior_grids();  // the first global memory access follows
  const V b = *reinterpret_cast<const V*>(static_cast<const S*>(p.suffix_output) + int64_t(t) * p.suffix_stride_token +
                                          int64_t(h) * p.suffix_stride_head + c * VEC);
  V a{};
  if (merge)
    a = *reinterpret_cast<const V*>(static_cast<const S*>(p.prefix_output) + int64_t(t) * p.prefix_stride_token +
                                    int64_t(h) * p.prefix_stride_head + c * VEC);
  const float lb = p.suffix_lse[int64_t(t) * p.suffix_lse_stride_token + int64_t(h) * p.suffix_lse_stride_head];
  const float la =
      merge ? p.prefix_lse[int64_t(t) * p.prefix_lse_stride_token + int64_t(h) * p.prefix_lse_stride_head] : 0.f;
  const MergeRow r = merge ? merge_row(la, lb) : copy_suffix_row(lb);
  const float inv_scale = O::kScaled ? 1.f / *p.output_scale : 1.f;
  *reinterpret_cast<VO*>(static_cast<typename O::storage*>(p.output) + int64_t(t) * p.output_stride_token +
                         int64_t(h) * p.output_stride_head + c * VEC) = merge_chunk<E, O, VEC>(r, a, b, inv_scale);
  if (p.output_lse != nullptr && c == 0)
    p.output_lse[int64_t(t) * p.output_lse_stride_token + int64_t(h) * p.output_lse_stride_head] = r.lse;
}

template <typename E, typename O, int VEC, int THREADS>
__global__ void __launch_bounds__(THREADS) merge_attn_states_kernel(MergeKernelArgs k) {
  merge_attn_states_chunk<E, O, VEC>(k, blockIdx.x * THREADS + threadIdx.x);
}

// Widest vector (in elements, up to 16 bytes) that every pointer, stride and
// head_size allows.
inline int merge_vec_elems(const MergeParams& p) {
  const int esize = dtype_size(p.dtype);
  const int out_esize = merge_output_size(p.dtype, p.output_kind);
  int vec = 16 / esize;
  auto fits = [&](int v) {
    const uint64_t bytes = uint64_t(v) * esize;
    auto ok_ptr = [&](const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) % bytes) == 0; };
    const bool out_ok = (reinterpret_cast<uintptr_t>(p.output) % (uint64_t(v) * out_esize)) == 0;
    return p.head_size % v == 0 && out_ok && ok_ptr(p.prefix_output) &&
           ok_ptr(p.suffix_output) && p.output_stride_token % v == 0 &&
           p.output_stride_head % v == 0 && p.prefix_stride_token % v == 0 &&
           p.prefix_stride_head % v == 0 && p.suffix_stride_token % v == 0 &&
           p.suffix_stride_head % v == 0;
  };
  while (vec > 1 && !fits(vec)) vec /= 2;
  return vec;
}

// Threads per block. On the H200 a 128-thread one-chunk-per-thread grid ran
// 8192x128x128 bf16 in 193 us where a row-per-thread-row grid-stride kernel
// took 223-232 us and a device-to-device copy of the same bytes 202 us
// (benchmarks/dev/merge_variants.cu).
// MLA_EXT_MERGE_THREADS overrides it at build time (benchmark A/B builds only).
#ifndef MLA_EXT_MERGE_THREADS
#define MLA_EXT_MERGE_THREADS 128
#endif
constexpr int kMergeThreads = MLA_EXT_MERGE_THREADS;
// Token tile (log2) when the LSEs have token stride 1: 8 tokens = one 32-byte
// sector of fp32 LSEs. In flat (token, head) order such a call read and wrote
// its LSEs one 4-byte value per sector per block, and ran at 237 us instead of
// 194 at 8192x128x128 on the H200.
constexpr int kMergeLseTileShift = 3;

// tile_shift: -1 picks it from the LSE strides (see kMergeLseTileShift).
template <typename E, typename O, int VEC, int THREADS = kMergeThreads>
Status launch_merge_vec(const MergeParams& full, gpuStream_t stream, int tile_shift = -1) {
  const int64_t cpr = full.head_size / VEC;
  // 32-bit chunk indices: each launch covers < 2^31 chunks, whole rows.
  if (full.head_size >= (int64_t(1) << 31)) return Status::kInvalidArgument;
  const int64_t max_chunks = (int64_t(1) << 31) - 1;
  const int64_t rows_per_launch = max_chunks / cpr;  // >= 1: cpr < 2^31
  const int64_t total_rows = full.num_tokens * full.num_heads;
  using S = typename E::storage;
  if (tile_shift < 0) {
    const bool lse_token_major = full.suffix_lse_stride_token == 1 && full.num_heads > 1 &&
                                 (!full.output_lse || full.output_lse_stride_token == 1);
    tile_shift = lse_token_major && full.num_tokens >= (int64_t(1) << kMergeLseTileShift) ? kMergeLseTileShift : 0;
  }
  static PerDevice<signed char> pdl_cache;
  const bool pdl = use_pdl(kPdlMerge, pdl_cache, merge_attn_states_kernel<E, O, VEC, THREADS>);
  // One launch: k.p, first_head, num_chunks, merge_tokens, num_tokens and tile_shift set by the caller.
  auto launch = [&](MergeKernelArgs& k) {
    k.chunks_per_row = uint32_t(cpr);
    k.div_chunks = FastDivmod(uint32_t(cpr));
    k.div_heads = FastDivmod(uint32_t(full.num_heads));
    const int64_t blocks = (int64_t(k.num_chunks) + THREADS - 1) / THREADS;
    return launch_kernel(pdl, merge_attn_states_kernel<E, O, VEC, THREADS>, dim3(uint32_t(blocks)), dim3(THREADS),
                         0, stream, k);
  };
  const int64_t tile = int64_t(1) << tile_shift;
  const int64_t padded_rows = (full.num_tokens + tile - 1) / tile * tile * full.num_heads;
  if (tile_shift > 0 && padded_rows <= rows_per_launch) {  // one launch over token tiles
    MergeKernelArgs k;
    k.p = full;
    k.first_head = 0;
    k.num_chunks = uint32_t(padded_rows * cpr);
    const int64_t merge_end = full.has_prefill_tokens_with_context ? full.prefill_tokens_with_context : full.num_tokens;
    k.merge_tokens = uint32_t(merge_end > full.num_tokens ? full.num_tokens : merge_end);
    k.tile_shift = uint32_t(tile_shift);
    k.num_tokens = uint32_t(full.num_tokens);
    return launch(k);
  }
  for (int64_t row0 = 0; row0 < total_rows; row0 += rows_per_launch) {
    const int64_t nrows = total_rows - row0 < rows_per_launch ? total_rows - row0 : rows_per_launch;
    const int64_t t0 = row0 / full.num_heads;
    MergeKernelArgs k;
    k.p = full;
    k.p.num_tokens = full.num_tokens - t0;
    k.p.output = static_cast<typename O::storage*>(full.output) + t0 * full.output_stride_token;
    k.p.prefix_output = static_cast<const S*>(full.prefix_output) + t0 * full.prefix_stride_token;
    k.p.suffix_output = static_cast<const S*>(full.suffix_output) + t0 * full.suffix_stride_token;
    k.p.prefix_lse = full.prefix_lse + t0 * full.prefix_lse_stride_token;
    k.p.suffix_lse = full.suffix_lse + t0 * full.suffix_lse_stride_token;
    if (full.output_lse) k.p.output_lse = full.output_lse + t0 * full.output_lse_stride_token;
    k.first_head = uint32_t(row0 - t0 * full.num_heads);
    k.num_chunks = uint32_t(nrows * cpr);
    int64_t merge_end = full.has_prefill_tokens_with_context ? full.prefill_tokens_with_context - t0 : k.p.num_tokens;
    merge_end = merge_end < 0 ? 0 : (merge_end > k.p.num_tokens ? k.p.num_tokens : merge_end);
    // Only tokens below merge_end are compared against it; this launch's rows
    // end within 2^31 rows of t0, so a clamp at 2^32 - 1 keeps the outcome.
    k.merge_tokens = uint32_t(merge_end > 0xffffffffLL ? 0xffffffffLL : merge_end);
    k.tile_shift = 0;
    k.num_tokens = 0;  // read only when tile_shift > 0
    const Status s = launch(k);
    if (s != Status::kSuccess) return s;
  }
  return Status::kSuccess;
}

template <typename E, typename O>
Status launch_merge_out(const MergeParams& p, gpuStream_t stream) {
  constexpr int kMaxVec = 16 / int(sizeof(typename E::storage));
  const int vec = merge_vec_elems(p);
  if constexpr (kMaxVec == 8) {
    if (vec == 8) return launch_merge_vec<E, O, 8>(p, stream);
  }
  if (vec == 4) return launch_merge_vec<E, O, 4>(p, stream);
  if (vec == 2) return launch_merge_vec<E, O, 2>(p, stream);
  return launch_merge_vec<E, O, 1>(p, stream);
}

template <typename E>
Status launch_merge_typed(const MergeParams& p, gpuStream_t stream) {
  switch (p.output_kind) {
    case MergeOutput::kSameAsInput: return launch_merge_out<E, SameOutput<E>>(p, stream);
    case MergeOutput::kFp8E4M3FN: return launch_merge_out<E, Fp8Output<E, false>>(p, stream);
    case MergeOutput::kFp8E4M3FNUZ: return launch_merge_out<E, Fp8Output<E, true>>(p, stream);
  }
  return Status::kInvalidArgument;
}

// Launch on `stream`. Allocates nothing, never synchronises. `num_sms` is
// kept for interface stability and unused: the grid covers the whole call.
inline Status launch_merge_attn_states(const MergeParams& p, [[maybe_unused]] int num_sms, gpuStream_t stream) {
  if (p.num_tokens < 0 || p.num_heads < 0 || p.head_size < 0) return Status::kInvalidArgument;
  if (p.num_tokens == 0 || p.num_heads == 0 || p.head_size == 0) return Status::kSuccess;
  if (p.num_heads >= (int64_t(1) << 31)) return Status::kInvalidArgument;
  if (p.output_kind != MergeOutput::kSameAsInput && p.output_scale == nullptr) return Status::kInvalidArgument;
  if (p.has_prefill_tokens_with_context && p.prefill_tokens_with_context < 0) return Status::kInvalidArgument;
  switch (p.dtype) {
    case DType::kFloat32: return launch_merge_typed<Float32Elem>(p, stream);
    case DType::kFloat16: return launch_merge_typed<Float16Elem>(p, stream);
    case DType::kBFloat16: return launch_merge_typed<BFloat16Elem>(p, stream);
  }
  return Status::kInvalidArgument;
}

// ---------------------------------------------------------------------------
// merge_attn_states_n (merge_attn_states.h): S states in one pass.
//
// One thread per VEC-element chunk of a (token, head) row over a flat chunk
// index, grid-stride. The thread reads the row's S LSEs (tiny, shared with the row's other
// chunks through L1), then each non-empty state's chunk exactly once, kStates
// states per loop trip so their loads are in flight together, and writes the
// output chunk once. It reads every input chunk before writing its output
// chunk, so the output may alias one of the states.
// ---------------------------------------------------------------------------
struct MergeNKernelArgs {
  MergeNParams p;
  uint32_t total_chunks;  // num_tokens * num_heads * chunks_per_row (<= 2^31)
  uint32_t chunks_per_row;
  FastDivmod div_chunks;
  FastDivmod div_heads;
};

template <typename E, int VEC>
__global__ void __launch_bounds__(256) merge_attn_states_n_kernel(MergeNKernelArgs k) {
  using S = typename E::storage;
  using V = VecN<S, VEC>;
  constexpr int kStates = 4;
  const MergeNParams& p = k.p;
  const int64_t num_states = p.num_states;
  wait_for_prior_grids();
  for (uint32_t idx = blockIdx.x * blockDim.x + threadIdx.x; idx < k.total_chunks; idx += gridDim.x * blockDim.x) {
    const uint32_t row = k.div_chunks.div(idx);
    const uint32_t chunk = idx - row * k.chunks_per_row;
    const uint32_t t = k.div_heads.div(row);
    const uint32_t h = row - t * uint32_t(p.num_heads);
    const float* lse_row = p.lses + int64_t(t) * p.lses_stride_token + int64_t(h) * p.lses_stride_head;
    const int64_t lss = p.lses_stride_state;
    const MergeNRow r = merge_n_row(num_states, [&](int64_t s) { return lse_row[s * lss]; });
    const S* vrow = static_cast<const S*>(p.values) + int64_t(t) * p.values_stride_token +
                    int64_t(h) * p.values_stride_head + int64_t(chunk) * VEC;
    const float sink = p.attn_sink != nullptr ? p.attn_sink[int64_t(h) * p.attn_sink_stride] : neg_inf();
    V o;
    float lse = r.lse;
    if (r.mode == MergeMode::kPrefixOnly && sink == neg_inf()) {
      o = *reinterpret_cast<const V*>(vrow + r.selected * p.values_stride_state);
    } else if (r.mode == MergeMode::kMix || r.mode == MergeMode::kPrefixOnly) {
      float acc[VEC];
#pragma unroll
      for (int i = 0; i < VEC; ++i) acc[i] = 0.f;
      float sum = 0.f;
      for (int64_t s0 = 0; s0 < num_states; s0 += kStates) {
        V v[kStates];
        float w[kStates];
        bool ok[kStates];
#pragma unroll
        for (int u = 0; u < kStates; ++u) {
          const int64_t s = s0 + u;
          ok[u] = false;
          w[u] = 0.f;
          if (s < num_states) {
            const float l = lse_row[s * lss];
            if (!lse_is_empty(l)) {
              ok[u] = true;
              w[u] = fast_exp(l - r.max_lse);
              v[u] = *reinterpret_cast<const V*>(vrow + s * p.values_stride_state);
            }
          }
        }
#pragma unroll
        for (int u = 0; u < kStates; ++u) {
          if (ok[u]) {
            sum += w[u];
#pragma unroll
            for (int i = 0; i < VEC; ++i) acc[i] += w[u] * E::load(v[u].v[i]);
          }
        }
      }
      // sum >= 1 (the largest state has weight 1); the sink adds exp(sink - m):
      // 0 for -inf, +inf (output 0) for +inf, NaN for NaN.
      const float inv = 1.f / (sum + fast_exp(sink - r.max_lse));
#pragma unroll
      for (int i = 0; i < VEC; ++i) o.v[i] = E::store(acc[i] * inv);
      lse = r.max_lse + fast_log(sum);
    } else {
      const S fill = E::store(r.mode == MergeMode::kZero ? 0.f : quiet_nan());
#pragma unroll
      for (int i = 0; i < VEC; ++i) o.v[i] = fill;
    }
    *reinterpret_cast<V*>(static_cast<S*>(p.output) + int64_t(t) * p.output_stride_token +
                          int64_t(h) * p.output_stride_head + int64_t(chunk) * VEC) = o;
    if (p.output_lse != nullptr && chunk == 0)
      p.output_lse[int64_t(t) * p.output_lse_stride_token + int64_t(h) * p.output_lse_stride_head] = lse;
  }
}

inline int merge_n_vec_elems(const MergeNParams& p) {
  const int esize = dtype_size(p.dtype);
  int vec = 16 / esize;
  auto fits = [&](int v) {
    const uint64_t bytes = uint64_t(v) * esize;
    auto ok_ptr = [&](const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) % bytes) == 0; };
    return p.head_size % v == 0 && ok_ptr(p.output) && ok_ptr(p.values) && p.output_stride_token % v == 0 &&
           p.output_stride_head % v == 0 && p.values_stride_state % v == 0 && p.values_stride_token % v == 0 &&
           p.values_stride_head % v == 0;
  };
  while (vec > 1 && !fits(vec)) vec /= 2;
  return vec;
}

template <typename E, int VEC>
Status launch_merge_n_vec(const MergeNParams& full, int num_sms, gpuStream_t stream) {
  const int64_t cpr = full.head_size / VEC;
  const int64_t rows_per_token = full.num_heads * cpr;
  const int64_t max_tokens = (int64_t(1) << 31) / rows_per_token;
  if (max_tokens < 1) return Status::kInvalidArgument;
  // Grid-stride over 2048 threads per processor. Covering the call with the
  // grid instead, as the two-way kernel does, ran 11-13% slower at S = 4 and 8
  // and 6% faster at S = 64 on the H200 (9b09576, against this loop's record at
  // 35f15f3, not the same run), so the loop stays.
  const int threads = 256;
  const int64_t max_blocks = int64_t(num_sms > 0 ? num_sms : 132) * 8;
  using S = typename E::storage;
  static PerDevice<signed char> pdl_cache;
  const bool pdl = use_pdl(kPdlMerge, pdl_cache, merge_attn_states_n_kernel<E, VEC>);
  for (int64_t t0 = 0; t0 < full.num_tokens; t0 += max_tokens) {
    const int64_t nt = full.num_tokens - t0 < max_tokens ? full.num_tokens - t0 : max_tokens;
    MergeNKernelArgs k;
    k.p = full;
    k.p.num_tokens = nt;
    k.p.output = static_cast<S*>(full.output) + t0 * full.output_stride_token;
    k.p.values = static_cast<const S*>(full.values) + t0 * full.values_stride_token;
    k.p.lses = full.lses + t0 * full.lses_stride_token;
    if (full.output_lse) k.p.output_lse = full.output_lse + t0 * full.output_lse_stride_token;
    k.total_chunks = uint32_t(nt * rows_per_token);
    k.chunks_per_row = uint32_t(cpr);
    k.div_chunks = FastDivmod(uint32_t(cpr));
    k.div_heads = FastDivmod(uint32_t(full.num_heads));
    int64_t blocks = (int64_t(k.total_chunks) + threads - 1) / threads;
    if (blocks > max_blocks) blocks = max_blocks;
    Status s = launch_kernel(pdl, merge_attn_states_n_kernel<E, VEC>, dim3(uint32_t(blocks)), dim3(threads), 0, stream, k);
    if (s != Status::kSuccess) return s;
  }
  return Status::kSuccess;
}

template <typename E>
Status launch_merge_n_typed(const MergeNParams& p, int num_sms, gpuStream_t stream) {
  constexpr int kMaxVec = 16 / int(sizeof(typename E::storage));
  const int vec = merge_n_vec_elems(p);
  if constexpr (kMaxVec == 8) {
    if (vec == 8) return launch_merge_n_vec<E, 8>(p, num_sms, stream);
  }
  if (vec == 4) return launch_merge_n_vec<E, 4>(p, num_sms, stream);
  if (vec == 2) return launch_merge_n_vec<E, 2>(p, num_sms, stream);
  return launch_merge_n_vec<E, 1>(p, num_sms, stream);
}

// Launch on `stream`; num_sms sizes the grid (0: a default). Allocates
// nothing, never synchronises. num_states must be >= 1.
inline Status launch_merge_attn_states_n(const MergeNParams& p, int num_sms, gpuStream_t stream) {
  if (p.num_states < 1 || p.num_tokens < 0 || p.num_heads < 0 || p.head_size < 0) return Status::kInvalidArgument;
  if (p.num_tokens == 0 || p.num_heads == 0 || p.head_size == 0) return Status::kSuccess;
  if (p.num_heads >= (int64_t(1) << 31)) return Status::kInvalidArgument;
  if (p.num_states == 2 && p.attn_sink == nullptr) {
    // Two states, no sink: the two-way rule is this rule for S = 2 (NaN, both
    // empty, one empty -> exact copy and its lse, else the weighted mix), and
    // its kernel reads each row's LSEs once instead of twice.
    MergeParams m;
    m.dtype = p.dtype;
    m.num_tokens = p.num_tokens;
    m.num_heads = p.num_heads;
    m.head_size = p.head_size;
    m.output = p.output;
    m.output_stride_token = p.output_stride_token;
    m.output_stride_head = p.output_stride_head;
    m.output_lse = p.output_lse;
    m.output_lse_stride_token = p.output_lse_stride_token;
    m.output_lse_stride_head = p.output_lse_stride_head;
    m.prefix_output = p.values;
    m.suffix_output = static_cast<const uint8_t*>(p.values) + p.values_stride_state * dtype_size(p.dtype);
    m.prefix_stride_token = m.suffix_stride_token = p.values_stride_token;
    m.prefix_stride_head = m.suffix_stride_head = p.values_stride_head;
    m.prefix_lse = p.lses;
    m.suffix_lse = p.lses + p.lses_stride_state;
    m.prefix_lse_stride_token = m.suffix_lse_stride_token = p.lses_stride_token;
    m.prefix_lse_stride_head = m.suffix_lse_stride_head = p.lses_stride_head;
    return launch_merge_attn_states(m, num_sms, stream);
  }
  switch (p.dtype) {
    case DType::kFloat32: return launch_merge_n_typed<Float32Elem>(p, num_sms, stream);
    case DType::kFloat16: return launch_merge_n_typed<Float16Elem>(p, num_sms, stream);
    case DType::kBFloat16: return launch_merge_n_typed<BFloat16Elem>(p, num_sms, stream);
  }
  return Status::kInvalidArgument;
}

}  // namespace mla_ext
