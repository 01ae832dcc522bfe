// CPU twin of sparse_mla_decode.cuh (DESIGN.md §4): same params, same split
// partition, same workspace layout and reduction, fp32 accumulation.
//
// Work unit: (token t, split s, CPU head group g). A unit walks the effective
// positions [lo, hi) of its split (decode_split_range) in chunks of kChunk
// rows: every selected row is dequantised ONCE into an fp32 tile (bit-exact
// decode from numerics.h), then reused by every head of the group (online
// softmax, exp(s - m) in fp32). CPU head groups exist only to keep the cores
// busy when there are fewer (token, split) units than threads; otherwise a
// unit owns all heads, so a row is dequantised once per (token, split).
//
// num_splits == 1: the unit writes the final bf16 output and lse (sink folded
// in), no workspace. num_splits > 1: the unit writes the split's normalised
// partial output and lse = m + log(l) (zeros / -inf when the split has no
// valid row) into the workspace (sparse_mla_decode.h layout), then a reduce
// pass folds the splits and the sink, exactly like decode_reduce_kernel.
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "cpu_ops.h"
#include "mla_ext/numerics.h"

#if defined(_OPENMP)
#include <omp.h>
#endif

#if defined(__GNUC__) || defined(__clang__)
#define MLA_EXT_ALWAYS_INLINE __attribute__((always_inline))
// The 8 x fp32 helpers are always inlined; no vector crosses a real call boundary.
#pragma GCC diagnostic ignored "-Wpsabi"
#else
#define MLA_EXT_ALWAYS_INLINE
#endif

namespace mla_ext {
namespace cpu {

namespace {

constexpr int kChunk = 32;  // rows dequantised per tile
constexpr int kHB = 4;      // heads per register block

// e4m3 byte -> fp32, built once from numerics.h (identical values, a table
// lookup): fn[] for the OCP e4m3fn formats, fnuz[] for the e4m3fnuz ones.
struct E4m3Tables {
  float fn[256];
  float fnuz[256];
  E4m3Tables() {
    for (int i = 0; i < 256; ++i) {
      fn[i] = fp8_e4m3fn_to_float(uint8_t(i));
      fnuz[i] = fp8_e4m3fnuz_to_float(uint8_t(i));
    }
  }
};
const E4m3Tables& e4m3_tables() {
  static const E4m3Tables t;
  return t;
}

// Address of the row of `slot` in `set` (slot already validated).
inline const uint8_t* row_ptr(const KvSet& set, KvFormat f, int64_t slot, const uint8_t** scale) {
  const int64_t page = slot / set.page_size;
  const int64_t off = slot - page * set.page_size;
  const uint8_t* base = set.cache + page * set.page_stride_bytes;
  if (kv_layout(f) == KvFormat::kFP8DsMlaV4) {
    *scale = base + set.page_size * kFP8DsMlaV4DataBytes + off * kFP8DsMlaV4ScaleBytes;
    return base + off * kFP8DsMlaV4DataBytes;
  }
  *scale = nullptr;
  return base + off * set.token_stride_bytes;
}

// Dequantise one row into dst[d_qk] (fp32). lut: the e4m3 table of the format's flavour.
MLA_EXT_ALWAYS_INLINE inline void dequant_row(KvFormat f, int d_qk, const uint8_t* row, const uint8_t* scale_bytes,
                        const float* lut, float* dst) {
  switch (kv_layout(f)) {
    case KvFormat::kBF16: {
      for (int i = 0; i < d_qk; ++i) {
        uint16_t b;
        memcpy(&b, row + 2 * i, 2);
        dst[i] = bf16_to_float(b);
      }
      break;
    }
    case KvFormat::kFP8DsMla: {  // 512 e4m3 | 4 fp32 scales | 64 bf16 RoPE
      float sc[4];
      memcpy(sc, row + 512, 16);
      for (int j = 0; j < 4; ++j)
        for (int i = 0; i < 128; ++i) dst[128 * j + i] = lut[row[128 * j + i]] * sc[j];
      for (int i = 0; i < 64; ++i) {
        uint16_t b;
        memcpy(&b, row + 528 + 2 * i, 2);
        dst[512 + i] = bf16_to_float(b);
      }
      break;
    }
    case KvFormat::kFP8DsMlaV4: {  // 448 e4m3 | 64 bf16 RoPE; 7 UE8M0 scale bytes elsewhere
      for (int j = 0; j < 7; ++j) {
        const float sc = ue8m0_to_float(scale_bytes[j]);
        for (int i = 0; i < 64; ++i) dst[64 * j + i] = lut[row[64 * j + i]] * sc;
      }
      for (int i = 0; i < 64; ++i) {
        uint16_t b;
        memcpy(&b, row + 448 + 2 * i, 2);
        dst[448 + i] = bf16_to_float(b);
      }
      break;
    }
    default:  // fnuz formats: kv_layout() maps them onto the cases above
      break;
  }
}


// 8 x fp32 (GCC/Clang vector extension: two SSE registers on baseline x86-64).
typedef float f8 __attribute__((vector_size(32)));
MLA_EXT_ALWAYS_INLINE inline f8 load8(const float* p) {
  f8 v;
  memcpy(&v, p, sizeof(v));
  return v;
}
MLA_EXT_ALWAYS_INLINE inline void store8(float* p, f8 v) { memcpy(p, &v, sizeof(v)); }
MLA_EXT_ALWAYS_INLINE inline float hsum(f8 v) {
  return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]));
}

struct Unit {
  int64_t t;
  int s;        // split of the token, 0..n-1
  int n;        // the token's splits (the split map, sparse_mla_decode.h)
  int64_t q0;   // the token's first split slot
  int64_t h0, h1;
};

// One (token, split, head range) unit. Compiled twice on x86-64 (run_unit below):
// baseline SSE2 and AVX2+FMA, where the 8-wide vectors map onto one ymm register.
MLA_EXT_ALWAYS_INLINE inline void run_unit_body(const SparseDecodeParams& p, const Unit& u, float* ws_out, float* ws_lse) {
  const int S = p.num_splits;
  const int64_t N = p.num_tokens * S;  // split slots
  const int d_qk = p.d_qk;
  const int64_t t = u.t;
  const int64_t nh = u.h1 - u.h0;
  const float* lut = kv_is_fnuz(p.kv_format) ? e4m3_tables().fnuz : e4m3_tables().fn;

  int64_t em, ee;
  effective_lens(p.main, p.extra, t, &em, &ee);
  int64_t lo, hi;
  decode_split_range(em + ee, u.s, u.n, &lo, &hi);

  // Per-thread scratch: q [nhp][d_qk] fp32, acc [nhp][512], K tile [kChunk][d_qk], weights,
  // running max / sum. nhp = nh rounded up to the head block (padded heads: q = 0, never written).
  const int64_t nhp = (nh + kHB - 1) / kHB * kHB;
  thread_local std::vector<float> buf;
  const size_t need = size_t(nhp) * d_qk + size_t(nhp) * kDV + size_t(kChunk) * d_qk +
                      size_t(kHB) * kChunk + 2 * size_t(nhp);
  if (buf.size() < need) buf.resize(need);
  float* qf = buf.data();
  float* acc = qf + size_t(nhp) * d_qk;
  float* K = acc + size_t(nhp) * kDV;
  float* wgt = K + size_t(kChunk) * d_qk;  // [kHB][kChunk]
  float* row_m = wgt + size_t(kHB) * kChunk;
  float* row_l = row_m + nhp;

  for (int64_t r = 0; r < nhp; ++r) {
    float* qd = qf + r * d_qk;
    if (r < nh) {
      const uint16_t* qs = p.q + t * p.q_stride_token + (u.h0 + r) * p.q_stride_head;
      for (int i = 0; i < d_qk; ++i) qd[i] = bf16_to_float(qs[i]);
    } else {
      for (int i = 0; i < d_qk; ++i) qd[i] = 0.f;
    }
    row_m[r] = neg_inf();
    row_l[r] = 0.f;
  }
  memset(acc, 0, sizeof(float) * size_t(nhp) * kDV);

  int64_t k = lo;
  while (k < hi) {
    // Gather + dequantise up to kChunk valid rows (invalid entries are skipped, never read).
    int n = 0;
    for (; k < hi && n < kChunk; ++k) {
      const bool is_main = k < em;
      const KvSet& set = is_main ? p.main : p.extra;
      const int64_t pos = is_main ? k : k - em;
      const int64_t slot = set.indices[t * set.indices_stride_token + pos];
      if (slot < 0 || slot >= set.num_slots) continue;
      const uint8_t* scale = nullptr;
      const uint8_t* row = row_ptr(set, p.kv_format, slot, &scale);
      dequant_row(p.kv_format, d_qk, row, scale, lut, K + size_t(n) * d_qk);
      ++n;
    }
    if (n == 0) continue;
    for (int64_t hb = 0; hb < nhp; hb += kHB) {
      const float* q0 = qf + (hb + 0) * d_qk;
      const float* q1 = qf + (hb + 1) * d_qk;
      const float* q2 = qf + (hb + 2) * d_qk;
      const float* q3 = qf + (hb + 3) * d_qk;
      // scores of kHB heads x n rows, each K row read once per head block
      for (int j = 0; j < n; ++j) {
        const float* kr = K + size_t(j) * d_qk;
        f8 a0 = {}, a1 = {}, a2 = {}, a3 = {};
        for (int i = 0; i < d_qk; i += 8) {
          const f8 kv = load8(kr + i);
          a0 += load8(q0 + i) * kv;
          a1 += load8(q1 + i) * kv;
          a2 += load8(q2 + i) * kv;
          a3 += load8(q3 + i) * kv;
        }
        wgt[0 * kChunk + j] = p.softmax_scale * hsum(a0);
        wgt[1 * kChunk + j] = p.softmax_scale * hsum(a1);
        wgt[2 * kChunk + j] = p.softmax_scale * hsum(a2);
        wgt[3 * kChunk + j] = p.softmax_scale * hsum(a3);
      }
      // online softmax: new max, rescale, weights exp(s - m)
      for (int r = 0; r < kHB; ++r) {
        float* w = wgt + r * kChunk;
        const int64_t h = hb + r;
        float m_new = row_m[h];
        for (int j = 0; j < n; ++j)
          if (w[j] > m_new) m_new = w[j];
        // A chunk whose scores are all -inf (so far) leaves m at -inf: its weights are
        // exp(-inf - 0) = 0, not exp(-inf + inf) = NaN, so a -inf score weighs 0 wherever it
        // falls (the GPU kernels' rule, `m_use`), and a row of only -inf scores ends as an empty
        // one (l = 0: output 0, lse -inf).
        const float m_use = m_new == neg_inf() ? 0.f : m_new;
        const float alpha = row_m[h] == neg_inf() ? 0.f : expf(row_m[h] - m_new);
        if (alpha != 1.f) {
          float* a = acc + h * kDV;
#pragma omp simd
          for (int i = 0; i < kDV; ++i) a[i] *= alpha;
        }
        // The chunk's weights summed on their own, then added to the running sum: one
        // rounding into the (large) running value per chunk instead of per row, which kept
        // the lse of rows with hundreds of thousands of entries within 1e-3.
        float cs = 0.f;
        for (int j = 0; j < n; ++j) {
          w[j] = expf(w[j] - m_use);
          cs += w[j];
        }
        row_m[h] = m_new;
        row_l[h] = row_l[h] * alpha + cs;
      }
      // acc[h] += sum_j w[h][j] * V_j, register-tiled over 8 value dims x kHB heads; the
      // chunk's sum is formed first and added to acc once (as the weights' sum above)
      float* a0 = acc + (hb + 0) * kDV;
      float* a1 = acc + (hb + 1) * kDV;
      float* a2 = acc + (hb + 2) * kDV;
      float* a3 = acc + (hb + 3) * kDV;
      const float* w0 = wgt;
      const float* w1 = wgt + kChunk;
      const float* w2 = wgt + 2 * kChunk;
      const float* w3 = wgt + 3 * kChunk;
      for (int i0 = 0; i0 < kDV; i0 += 8) {
        f8 c0 = {}, c1 = {}, c2 = {}, c3 = {};
        for (int j = 0; j < n; ++j) {
          const f8 v = load8(K + size_t(j) * d_qk + i0);
          c0 += w0[j] * v;
          c1 += w1[j] * v;
          c2 += w2[j] * v;
          c3 += w3[j] * v;
        }
        store8(a0 + i0, load8(a0 + i0) + c0);
        store8(a1 + i0, load8(a1 + i0) + c1);
        store8(a2 + i0, load8(a2 + i0) + c2);
        store8(a3 + i0, load8(a3 + i0) + c3);
      }
    }
  }

  // End of split.
  for (int64_t r = 0; r < nh; ++r) {
    const int64_t h = u.h0 + r;
    const float* a = acc + r * kDV;
    float inv = 0.f, lse = neg_inf();
    const float l = row_l[r];
    if (l > 0.f || is_nan(l)) {
      lse = row_m[r] + logf(l);
      float den = l;
      if (S == 1 && p.attn_sink != nullptr) den = l + expf(p.attn_sink[h * p.attn_sink_stride] - row_m[r]);
      inv = 1.f / den;
    }
    if (S == 1) {
      uint16_t* o = p.output + t * p.output_stride_token + h * p.output_stride_head;
      for (int i = 0; i < kDV; ++i) o[i] = float_to_bf16(a[i] * inv);
      if (p.lse != nullptr) p.lse[t * p.lse_stride_token + h * p.lse_stride_head] = lse;
    } else {
      float* o = ws_out + (h * N + u.q0 + u.s) * kDV;
      for (int i = 0; i < kDV; ++i) o[i] = a[i] * inv;
      ws_lse[h * N + u.q0 + u.s] = lse;
    }
  }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target("avx2,fma"))) void run_unit_avx2(const SparseDecodeParams& p, const Unit& u, float* ws_out,
                                                      float* ws_lse) {
  run_unit_body(p, u, ws_out, ws_lse);
}
void run_unit_base(const SparseDecodeParams& p, const Unit& u, float* ws_out, float* ws_lse) {
  run_unit_body(p, u, ws_out, ws_lse);
}
bool cpu_has_avx2_fma() {
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has;
}
inline void run_unit(const SparseDecodeParams& p, const Unit& u, float* ws_out, float* ws_lse) {
  if (cpu_has_avx2_fma()) {
    run_unit_avx2(p, u, ws_out, ws_lse);
  } else {
    run_unit_base(p, u, ws_out, ws_lse);
  }
}
#else
inline void run_unit(const SparseDecodeParams& p, const Unit& u, float* ws_out, float* ws_lse) {
  run_unit_body(p, u, ws_out, ws_lse);
}
#endif

// Fold the splits of one (token, head) row (decode_reduce_kernel's rule).
void reduce_row(const SparseDecodeParams& p, int64_t row, int64_t q0, int S, const float* ws_out,
                const float* ws_lse) {
  const int64_t H = p.num_heads;
  const int64_t N = p.num_tokens * p.num_splits;  // split slots
  const int64_t t = row / H, h = row % H;
  const float* lse = ws_lse + h * N + q0;
  float mx;
  const SplitMergeMode mode = split_merge_scan(lse, S, &mx);  // the GPU reduce's rule
  float o[kDV];
  for (int i = 0; i < kDV; ++i) o[i] = 0.f;
  float out_lse = neg_inf();
  if (mode == SplitMergeMode::kNaN) {
    for (int i = 0; i < kDV; ++i) o[i] = quiet_nan();
    out_lse = quiet_nan();
  } else if (mode == SplitMergeMode::kMix) {
    float L = 0.f;
    for (int i = 0; i < S; ++i) {
      const float w = expf(lse[i] - mx);
      L += w;
      if (w > 0.f) {
        const float* v = ws_out + (h * N + q0 + i) * kDV;
#pragma omp simd
        for (int d = 0; d < kDV; ++d) o[d] += w * v[d];
      }
    }
    const bool has_sink = p.attn_sink != nullptr;
    const float inv = split_merge_finish(L, mx, has_sink, has_sink ? p.attn_sink[h * p.attn_sink_stride] : 0.f, &out_lse);
    for (int d = 0; d < kDV; ++d) o[d] *= inv;
  }
  uint16_t* out = p.output + t * p.output_stride_token + h * p.output_stride_head;
  for (int d = 0; d < kDV; ++d) out[d] = float_to_bf16(o[d]);
  if (p.lse != nullptr) p.lse[t * p.lse_stride_token + h * p.lse_stride_head] = out_lse;
}

}  // namespace

void sparse_mla_decode(const SparseDecodeParams& p, void* workspace) {
  const int64_t T = p.num_tokens, H = p.num_heads;
  if (T <= 0 || H <= 0) return;
  const int S = p.num_splits < 1 ? 1 : p.num_splits;
  float* ws_out = nullptr;
  float* ws_lse = nullptr;
  if (S > 1) {
    ws_out = static_cast<float*>(workspace);
    ws_lse = reinterpret_cast<float*>(static_cast<uint8_t*>(workspace) + decode_partial_out_bytes(T, H, S));
  }
  (void)e4m3_tables();  // build the tables before the parallel region
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  (void)cpu_has_avx2_fma();
#endif

  // The split map, and the (token, split) pairs of the slots in use.
  SparseDecodeParams q = p;
  q.num_splits = S;
  // (reused across calls on this host thread: no allocation once they are large enough)
  thread_local std::vector<int64_t> first;
  thread_local std::vector<int> count;
  thread_local std::vector<int64_t> slot_token;  // the slots in use: token, split of the token
  thread_local std::vector<int> slot_split;
  slot_token.clear();
  slot_split.clear();
  if (S > 1) {
    first.resize(size_t(T));
    count.resize(size_t(T));
    decode_split_map(q, ActiveSplits(), first.data(), count.data());
    for (int64_t t = 0; t < T; ++t)
      for (int s = 0; s < count[size_t(t)]; ++s) {
        slot_token.push_back(t);
        slot_split.push_back(s);
      }
  }
  // The parallel regions below read the map through these (thread_local names
  // would name each worker thread's own, empty vectors there).
  const int64_t* map_first = first.data();
  const int* map_count = count.data();
  const int64_t* map_token = slot_token.data();
  const int* map_split = slot_split.data();
  // CPU head groups: only when (token, split) units alone cannot feed every thread.
  const int64_t units_ts = S > 1 ? int64_t(slot_token.size()) : T;
  const int64_t threads = num_threads();
  int64_t groups = 1;
  if (units_ts < threads) {
    groups = (threads + units_ts - 1) / units_ts;
    const int64_t max_groups = (H + 7) / 8;  // keep >= 8 heads per group
    if (groups > max_groups) groups = max_groups;
    if (groups < 1) groups = 1;
  }
  const int64_t heads_per_group = (H + groups - 1) / groups;
  groups = (H + heads_per_group - 1) / heads_per_group;
  const int64_t units = units_ts * groups;

#pragma omp parallel for schedule(dynamic, 1) if (units > 1)
  for (int64_t i = 0; i < units; ++i) {
    Unit u;
    const int64_t g = i % groups;
    const int64_t ts = i / groups;
    if (S > 1) {
      u.t = map_token[ts];
      u.q0 = map_first[u.t];
      u.s = map_split[ts];
      u.n = map_count[u.t];
    } else {
      u.t = ts;
      u.q0 = ts;
      u.s = 0;
      u.n = 1;
    }
    u.h0 = g * heads_per_group;
    u.h1 = std::min(H, u.h0 + heads_per_group);
    run_unit(q, u, ws_out, ws_lse);
  }
  if (S == 1) return;

  const int64_t rows = T * H;
#pragma omp parallel for schedule(static) if (rows > 16)
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t t = row / H;
    reduce_row(q, row, map_first[t], map_count[t], ws_out, ws_lse);
  }
}

}  // namespace cpu
}  // namespace mla_ext
