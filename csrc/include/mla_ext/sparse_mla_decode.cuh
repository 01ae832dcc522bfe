// sparse_mla_decode GPU kernels and launcher (CUDA and HIP, one source).
// Semantics: DESIGN.md §4. Parameters, split policy and workspace layout:
// sparse_mla_decode.h.
//
// Work division. Grid = head_groups x num_splits x num_tokens blocks (shapes
// only, so a captured CUDA graph replays with new indices and lengths), 256
// threads per block. A block owns one (token, split, head group): a head tile of
// HT <= 64 heads (decode_launch_head_tile: up to 64, fewer when the call has too
// few blocks to fill the GPU; p.head_tile forces one), padded to 16*MT rows
// (MT = 1, 2 or 4 m-tiles of 16 heads). Split s of token t covers a contiguous
// part [E*s/S, E*(s+1)/S) of the token's *effective* positions: the main set's
// first min(W_main, lengths[t]) positions followed by the extra set's first
// min(W_extra, extra_lengths[t]) ones, so splits are balanced by the real
// lengths (content-dependent work inside a block, shape-only grid).
//
// Per KV tile of BN selected rows the block:
//   1. (threads < BN) turns indices into row/scale addresses (invalid slots,
//      positions past the split end -> nullptr; such rows are never read);
//   2. loads the raw row bytes with 16-byte loads into registers (issued one
//      tile ahead, so the loads of tile j+1 fly during the math of tile j);
//   3. dequantises them into a shared bf16 tile K[BN][d_qk] (invalid rows ->
//      zeros): V4 e4m3fn/fnuz x power-of-two scale (exact in bf16); V3.2 the
//      raw e4m3fn/fnuz values (exact) with the fp32 scales in their own [4][BN]
//      array, applied to each 128-dim group's partial Q.K sum after the product
//      and to a per-group copy of P before the P.V product (keys never rounded);
//      rows past the split's end (the last tile of a split) are zeroed up to the
//      next 16-row block and skipped by the products beyond it (MMA path);
//   4. S = Q K^T into shared fp32, masked online softmax (exp2 domain), P;
//   5. O = O*alpha + P V with V = the first 512 columns of the same tile.
// Tensor-core path (NVIDIA sm_80+): BN = 64, Q staged in shared memory, S and
// P.V with mma.sync.m16n8k16 bf16 -> fp32 fed by ldmatrix. On sm_90a the
// 64-head tile uses warpgroup MMAs instead (wgmma, operands read from 128-byte
// swizzled shared tiles: decode_body's WG), for every format (fp8_ds_mla
// with the same exact-key rule: per-group Q.K products, per-group P copies).
// Portable path (HIP, force_portable, or NVIDIA builds below sm_80): BN = 32,
// CUDA-core FMAs, Q read through the cache, no warp-size assumption (<= 64 KB of
// shared memory).
//
// End of a split: with one split the block writes the final bf16 output and
// lse (sink folded in); otherwise it writes the split's normalised partial
// output and lse = m + log(l) (0 / -inf for an empty split) into the
// workspace, and a reduce kernel folds the splits and the sink.
//
// Requirements checked by the launcher (Status::kInvalidArgument otherwise):
// q rows and every cache row start 16-byte aligned (q pointer and strides
// multiples of 8 elements; cache pointers, page strides and token strides
// multiples of 16 bytes), d_qk 512 or 576 (576 for fp8_ds_mla[_fnuz], 512 for
// fp8_ds_mla_v4[_fnuz]), two_token 0..2.
// Preconditions left to the caller (not checked here; the torch op and the C API
// check them before calling, with Status::kInvalidArgument / an error): a finite
// softmax_scale; indices, lengths, attn_sink and lse 4-byte aligned; q, output and
// lse strides >= 0; output rows (512 elements) and lse elements that no two
// (token, head) pairs share. Output and lse may otherwise have any strides.
//
// FP8 decode matches numerics.h on every code, the NaN codes included
// (e4m3fn: 0x7f / 0xff; e4m3fnuz: 0x80). e4m3fn: sm_89+ packed
// cvt.rn.f16x2.e4m3x2 (exact); elsewhere a bit decode with an explicit NaN
// test. e4m3fnuz (the format is a template parameter: the e4m3fn kernels run
// the code above unchanged): sm_89+ a bit decode into f16 pairs (no packed fnuz
// conversion exists); elsewhere the scalar bit decode with bias 8, NaN 0x80.
#pragma once

#include "mla_ext/compat.h"
#include "mla_ext/sparse_mla_decode.h"

#include <type_traits>

#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 800)
#define MLA_EXT_DECODE_MMA 1
#endif
// Warpgroup MMA (wgmma.mma_async): Hopper's arch-specific sm_90a target only
// (TORCH_CUDA_ARCH_LIST 9.0a). Other targets compile the same kernels' mma.sync
// body (decode_split_mma_kernel).
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MLA_EXT_DECODE_WGMMA 1
#endif
// Packed e4m3x2 -> f16x2 conversion (PTX 7.8, sm_89+).
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 890)
#define MLA_EXT_DECODE_CVT_FP8 1
#endif
// decode_body's RAW tile (Q.K from the gathered registers) where that conversion is: on sm_80,
// whose scalar decode puts more of the dequantisation on Q.K's chain, its balanced-map instance
// spills (16 / 52 bytes at 128 registers); there the RAW instances run the other tile's body.
#if defined(MLA_EXT_DECODE_CVT_FP8)
#define MLA_EXT_DECODE_RAW_OK true
#else
#define MLA_EXT_DECODE_RAW_OK false
#endif

// Tuning knob: resident blocks per SM the 16-head FP8 tensor-core kernels are
// compiled for (2 caps them at 128 registers).
#ifndef MLA_EXT_DECODE_MT1_MIN_BLOCKS
#define MLA_EXT_DECODE_MT1_MIN_BLOCKS 2
#endif

namespace mla_ext {
namespace decode_detail {

constexpr int kThreads = 256;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// ---- format traits: 16-byte chunks per row ----
template <KvFormat F, int DQK>
struct Fmt;
template <int DQK>
struct Fmt<KvFormat::kBF16, DQK> {
  static constexpr int kChunks = DQK / 8;  // all bf16
  static constexpr int kFp8Chunks = 0;
  static constexpr int kRopeByte = 0, kRopeDim = 0;
};
template <>
struct Fmt<KvFormat::kFP8DsMla, 576> {
  static constexpr int kChunks = 40;       // 32 fp8 chunks + 8 bf16 rope chunks
  static constexpr int kFp8Chunks = 32;
  static constexpr int kRopeByte = 528, kRopeDim = 512;
};
template <>
struct Fmt<KvFormat::kFP8DsMlaV4, 512> {
  static constexpr int kChunks = 36;       // 28 fp8 chunks + 8 bf16 rope chunks
  static constexpr int kFp8Chunks = 28;
  static constexpr int kRopeByte = 448, kRopeDim = 448;
};

// ---- shared-memory layout ----
// SCALED (fp8_ds_mla): the K tile holds the raw e4m3 values (exact in bf16) and
// the fp32 scales sit in their own array; the scales multiply the per-group
// QK^T partial sums and a per-group copy of P (4 copies, one per 128 V dims).
// (ASYM: value x 2^k in K and the scales' mantissas in the array: Gather's EXPK.)
// WG (64-head tile, sm_90a): K, Q and P (SCALED: its 4 copies) in the 128-byte
// swizzled layout of the warpgroup MMAs (swz_chunk), 1024-byte aligned (the
// kernel aligns its shared-memory base at run time: kAlignPad spare bytes).
// Two K stages (Cfg, decode_body): the balanced-map warpgroup kernel of the V4
// rows, which dequantises tile j + 1 into one stage while the P.V wgmmas of
// tile j read the other; S then lives in the stage that is free during Q.K and
// the softmax. H200, V4 C128 at 64-128 heads x 16-128 tokens: -2..-4%. Not in
// the uniform-map warpgroup kernels, where it measured +2.7..7.5% (window and
// C4 layers at 64-128 heads x >= 64 tokens): at 209 KB of shared memory the L1
// cache shrinks (the carveout goes from 196 to 228 KB), and the one-stage
// kernel with its carveout forced to the maximum loses about as much, 0..7.5%
// (benchmarks/NOTES.md, sixteenth session); nor at d_qk 576 or with
// fp8_ds_mla's P copies (a second stage does not fit in 227 KB). The
// asymmetric warpgroup kernels (decode_body's ASYM) have two stages on
// both maps, plus a second P buffer and alpha array and a fourth row-address slot (214 KB
// with the alignment pad); for fp8_ds_mla rows (d_qk 576) two 72 KB stages with P in
// each stage's RoPE block and [8][BN] scale rows per stage (226 KB with the pad).
MLA_EXT_HD constexpr bool decode_two_stages(KvFormat f, int d_qk, bool wg, bool bal) {
  return wg && bal && kv_layout(f) == KvFormat::kFP8DsMlaV4 && d_qk == 512;
}

template <int MT, int DQK, bool MMA, bool SCALED = false, bool WG = false, bool STAGES2 = false, bool ASYM = false>
struct Cfg {
  static_assert(!WG || (MMA && (MT == 4 || (MT == 1 && ASYM))),
                "the warpgroup layout: the 64-head tile, or the asymmetric 16-head one");
  static constexpr int HTp = 16 * MT;         // padded head rows
  static constexpr int BN = MMA ? 64 : 32;    // KV rows per tile
  // K / Q row stride (elements): an odd multiple of 16 B (ldmatrix without bank
  // conflicts); WG: unpadded, the swizzle spreads the banks.
  static constexpr int KST = WG ? DQK : DQK + 8;
  static constexpr int SST = BN + 4;          // S row stride (floats)
  static constexpr int PST = WG ? BN : BN + 8;  // P row stride (bf16)
  static constexpr size_t kAlignPad = WG ? 1024 : 0;
  // K stages: two where decode_two_stages says so.
  static_assert(!STAGES2 || (WG && ((!SCALED && DQK == 512) || ASYM)), "two K stages: the d_qk 512 warpgroup tile, or ASYM");
  static constexpr int kStages = STAGES2 ? 2 : 1;
  static constexpr size_t kStageBytes = size_t(BN) * KST * 2;
  static constexpr size_t kOff = 0;
  static constexpr size_t qOff = kOff + kStages * kStageBytes;
  static constexpr size_t qEnd = qOff + (MMA ? size_t(HTp) * KST * 2 : 0);
  // S partial sums: the 16-head mma.sync tile, V3.2's 32-head one and the
  // warpgroup tile split Q.K's dims in two halves (decode_body), each with its
  // own S copy. Two K stages: sOff is stage 1 (the copies of tile j are in
  // stage (j + 1) % 2; the balanced map's prologue uses sOff as scratch).
  static constexpr int kSParts = ((MMA && MT == 1) || (MMA && SCALED && MT == 2) || WG) ? 2 : 1;
  static constexpr size_t sOff = kStages == 2 ? kOff + kStageBytes : qEnd;
  static_assert(kStages == 1 || size_t(kSParts) * HTp * SST * 4 <= kStageBytes, "S copies fit in a K stage");
  static constexpr size_t pOff = kStages == 2 ? qEnd : sOff + size_t(kSParts) * HTp * SST * 4;
  static_assert(!WG || (qOff % 1024 == 0 && sOff % 1024 == 0 && pOff % 1024 == 0), "swizzle atoms");
  // P copies (one per V scale group); ASYM: two P buffers (tiles j and j + 1), none for
  // fp8_ds_mla (SCALED), whose P of tile j lies in its stage's RoPE block (decode_body)
  static constexpr int kPCopies = ASYM ? (SCALED ? 0 : 2) : SCALED ? 4 : 1;
  static constexpr size_t aOff = pOff + (MMA ? size_t(kPCopies) * HTp * PST * 2 : 0);
  static constexpr size_t invOff = aOff + size_t(ASYM ? 2 : 1) * HTp * 4;  // ASYM: alpha of tiles j, j + 1
  static constexpr size_t metaOff = invOff + size_t(HTp) * 4;
  // Row-address slots (data and scale pointers of a tile's rows): two, three
  // with two K stages (tiles j, j + 1, j + 2 in flight: decode_body), four in
  // the asymmetric kernels (their addresses are written a tile earlier).
  static constexpr int kMetaSlots = ASYM ? 4 : kStages == 2 ? 3 : 2;
  static constexpr size_t scOff = metaOff + size_t(2 * kMetaSlots) * BN * sizeof(void*);  // float [4][BN]
  // ASYM: one 64-bit row-validity mask per row-address slot (bit r: row r has
  // an address), written with the addresses, read by warpgroup 0's softmax.
  // SCALED: the key scales, [kScaleRows][BN] floats (ASYM: per stage, the mantissas and their
  // ratios: Gather's EXPK).
  static constexpr int kScaleRows = ASYM ? 8 : 4;
  static constexpr size_t vmOff = scOff + (SCALED ? size_t(kStages) * kScaleRows * BN * 4 : 0);
  // ASYM fp8_ds_mla: 4 mbarriers (used by the 2-block cluster kernel only: FULLR[2] and
  // EMPTYR[2], decode_body's CL).
  static constexpr size_t mbOff = vmOff + (ASYM ? size_t(kMetaSlots) * 8 : 0);
  // ASYM at 16 heads (MT = 1): warpgroup 0's per-head maxima of each warp, [2 tiles][4 warps][HTp].
  static constexpr size_t rdOff = mbOff + (ASYM && SCALED ? 32 : 0);
  static constexpr size_t bytes = rdOff + (ASYM && MT == 1 ? size_t(2 * 4 * HTp) * 4 : 0) + kAlignPad;
  static constexpr int TPR = kThreads / HTp;  // softmax threads per head row
  static constexpr int CPT = BN / TPR;        // softmax columns per thread
};

// 16-byte chunk ch (elements 8 ch .. 8 ch + 7) of row r of a bf16 matrix with
// `rows` rows: SW, the 128-byte swizzled layout (64-column blocks of rows x 128
// bytes, chunk ch % 8 of a row at ch % 8 ^ r % 8); otherwise rows of `stride`
// elements.
template <bool SW, int ROWS>
__device__ __forceinline__ uint16_t* swz_chunk(uint16_t* base, int stride, int r, int ch) {
  if (SW) return base + (ch >> 3) * (ROWS * 64) + r * 64 + (((ch & 7) ^ (r & 7)) << 3);
  return base + size_t(r) * stride + ch * 8;
}

struct DecodeArgs {
  SparseDecodeParams p;
  size_t smem_limit;  // bytes a block may use (launch_split); 0 = no limit known
  float* ws_out;     // [H, T * S, 512] (S > 1; by split slot, sparse_mla_decode.h)
  float* ws_lse;     // [H, T * S]
  int head_tile;     // HT
  int head_groups;   // HG
  float scale_log2;  // softmax_scale * log2(e)
  bool out_pairs;    // output pointer/strides allow 4-byte bf16 pair stores
  bool out_vec16;    // output pointer/strides allow 16-byte stores (8 bf16)
  bool balanced;     // decode_balanced(p): the balanced split map
  bool early_trigger;  // pdl_trigger_early (compat.h)
  bool two_token;     // the asymmetric kernel walks two tokens per block (decode_two_token_blocks)
  bool q_regs;        // the 16-head V4 kernel holds its Q fragments in registers (decode_q_regs)
  bool raw_qk;        // the 16-head V4 kernel's Q.K from the gathered registers (decode_raw_qk)
  ActiveSplits active;  // the balanced map's slots in use by the rows' lengths (decode_active_splits_table)
  bool anchored;        // active on the anchored map (decode_active_slack): launch_split_map's anchored instances
  uint2* ws_map;        // [T] {first cell, cell count} per token (S > 1; balanced map only)
};

// ---- balanced split map (sparse_mla_decode.h), computed by a whole block ----
__device__ __forceinline__ int64_t shfl_xor_i64(int64_t v, int lane_mask) {
  const int lo = int(uint32_t(uint64_t(v))), hi = int(uint32_t(uint64_t(v) >> 32));
  const uint32_t lo2 = uint32_t(MLA_EXT_SHFL_XOR(lo, lane_mask));
  const uint32_t hi2 = uint32_t(MLA_EXT_SHFL_XOR(hi, lane_mask));
  return int64_t((uint64_t(hi2) << 32) | uint64_t(lo2));
}

__device__ __forceinline__ int64_t shfl_i64(int64_t v, int src_lane) {
  const int lo = int(uint32_t(uint64_t(v))), hi = int(uint32_t(uint64_t(v) >> 32));
  const uint32_t lo2 = uint32_t(MLA_EXT_SHFL(lo, src_lane));
  const uint32_t hi2 = uint32_t(MLA_EXT_SHFL(hi, src_lane));
  return int64_t((uint64_t(hi2) << 32) | uint64_t(lo2));
}

// Inclusive scan of x over a block of NT threads (thread order); *total: the block's sum.
// red: NT / kWarpSize int64 of shared memory, written once (no barrier after: the caller's
// next use of the same words needs one).
template <int NT>
__device__ __forceinline__ int64_t block_incl_scan_i64(int64_t x, int64_t* red, int64_t* total) {
  constexpr int NW = NT / kWarpSize;
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
#pragma unroll
  for (int d = 1; d < kWarpSize; d <<= 1) {
    const int64_t y = shfl_i64(x, lane >= d ? lane - d : lane);
    if (lane >= d) x += y;
  }
  if (lane == kWarpSize - 1) red[warp] = x;
  __syncthreads();
  int64_t before = 0, sum = 0;  // the warps before this one, and all
#pragma unroll
  for (int w = 0; w < NW; ++w) {
    before += w < warp ? red[w] : 0;
    sum += red[w];
  }
  *total = sum;
  return before + x;
}

// The token owning split slot q under the balanced map, its first slot and its
// slot count; false when q is idle. A split block (NT threads, num_tokens <=
// KP NT) calls it once, every thread; thread i holds tokens i KP .. i KP + KP - 1
// (consecutive, so one scan over the threads' sums keeps token order); red:
// 2 NT / kWarpSize + 4 int64 of shared memory. act on (automatic counts,
// decode_active_splits_table): token t takes n_t = decode_active_slots(c_t)
// slots, in token order.
// ANCH (the anchored map, decode_active_slack; act on): the owner of the block of slot q, where
// block q < T runs token q's first split and blocks T + P_t .. T + P_t + n_t - 2 its others
// (P_t = sum_{u<t} (n_u - 1)); *q0_out: the token's first workspace cell (cells stay in token
// order, as above), *s_out: the split's index (written for ANCH only).
template <int NT, int KP, bool ANCH = false>
__device__ __forceinline__ bool balanced_slot_owner_kp(const SparseDecodeParams& p, const ActiveSplits& act, int64_t q,
                                                    int64_t* t_out, int64_t* q0_out, int* n_out, int64_t* red,
                                                    int* s_out = nullptr) {
  constexpr int NW = NT / kWarpSize;
  const int64_t T = p.num_tokens;
  const int64_t t0 = int64_t(threadIdx.x) * KP;  // this thread's first token
  int64_t* const own = red + 2 * NW;  // owner, first slot, count
  int64_t c[KP];
  int64_t csum = 0;
#pragma unroll
  for (int k = 0; k < KP; ++k) {
    c[k] = t0 + k < T ? decode_token_cost(p, t0 + k) : 0;
    csum += c[k];
  }
  if (threadIdx.x == 0) own[0] = -1;
  int64_t total;
  const int64_t incl = block_incl_scan_i64<NT>(csum, red, &total);  // C_{t0 + KP}
  if (act.on()) {
    const int sa = decode_active_count(act, total, T, decode_total_width(p));
    if constexpr (ANCH) {
      // A token's first-split block whose token keeps one slot (rows within 5/4 of the mean
      // row: most tokens of most calls) is finished in this block: no workspace cell, and the
      // reduce passes its token by without reading the map entry's first cell (written as 0).
      // It needs neither the slot counts' scan nor the other tokens' 64-bit divisions.
      // (Uniform: every thread computes the same count.)
      if (q < T && decode_active_slots(decode_token_cost(p, q), total, T, sa) == 1) {
        __syncthreads();  // red free again (the scan's reads)
        *t_out = q;
        *q0_out = 0;
        *n_out = 1;
        *s_out = 0;
        return true;
      }
    }
    int64_t n[KP];
    int64_t nsum = 0;
#pragma unroll
    for (int k = 0; k < KP; ++k) {
      n[k] = t0 + k < T ? decode_active_slots(c[k], total, T, sa) : 0;
      nsum += n[k];
    }
    int64_t all;
    int64_t f = block_incl_scan_i64<NT>(nsum, red + NW, &all) - nsum;
#pragma unroll
    for (int k = 0; k < KP; ++k) {
      if constexpr (ANCH) {
        const int64_t u = t0 + k, x = T + f - u;  // token u's first extra block: T + P_u
        if (n[k] > 0 && (q < T ? q == u : (q >= x && q < x + n[k] - 1))) {
          own[0] = u;
          own[1] = f;
          own[2] = n[k];
          own[3] = q < T ? 0 : q - x + 1;
        }
      } else if (q >= f && q < f + n[k]) {  // (n = 0 past T)
        own[0] = t0 + k;
        own[1] = f;
        own[2] = n[k];
      }
      f += n[k];
    }
  } else if (t0 < T) {
    int64_t ct = incl - csum;  // C_{t0}
    int64_t f = decode_balanced_first_slot(t0, ct, total, T, p.num_splits);
#pragma unroll
    for (int k = 0; k < KP; ++k) {
      if (t0 + k < T) {
        ct += c[k];
        const int64_t f1 = decode_balanced_first_slot(t0 + k + 1, ct, total, T, p.num_splits);
        const int n = decode_balanced_slots(f, f1);
        if (q >= f && q < f + n) {
          own[0] = t0 + k;
          own[1] = f;
          own[2] = n;
        }
        f = f1;
      }
    }
  }
  __syncthreads();
  const int64_t owner = own[0];
  *t_out = owner;
  *q0_out = own[1];
  *n_out = int(own[2]);
  if constexpr (ANCH) *s_out = int(own[3]);
  __syncthreads();  // red free again
  return owner >= 0;
}

// balanced_slot_owner_kp for up to kBalanceMapMaxTokens tokens: one token per thread up to NT
// tokens, more above (two per thread at every count measured 0-8% slower at 72-256 tokens on
// the H200, thirty-sixth session; each thread's 64-bit divisions of decode_active_slots run one
// after the other, the likely cause).
template <int NT, bool ANCH = false>
__device__ __forceinline__ bool balanced_slot_owner(const SparseDecodeParams& p, const ActiveSplits& act, int64_t q,
                                                    int64_t* t_out, int64_t* q0_out, int* n_out, int64_t* red,
                                                    int* s_out = nullptr) {
  constexpr int kPer = int((kBalanceMapMaxTokens + NT - 1) / NT);
  if constexpr (ANCH) {  // (only above kBalanceMaxTokens tokens)
    return balanced_slot_owner_kp<NT, kPer, true>(p, act, q, t_out, q0_out, n_out, red, s_out);
  } else {
    if (kPer == 1 || p.num_tokens <= NT) return balanced_slot_owner_kp<NT, 1>(p, act, q, t_out, q0_out, n_out, red);
    return balanced_slot_owner_kp<NT, kPer>(p, act, q, t_out, q0_out, n_out, red);
  }
}

// ---- small numeric helpers (pack_bf16x2: numerics.h) ----
// e4m3 byte (low 8 bits of b) -> fp32, exact (numerics.h), without branches:
// e4m3fn: bias 7, 0x7f / 0xff -> NaN; e4m3fnuz: the same bit placement one
// exponent lower (bias 8), 0x80 -> NaN, 0x7f / 0xff -> +-240.
template <bool FNUZ>
__device__ __forceinline__ float e4m3_bits_to_float(uint32_t b) {
  const float v = bits_to_float(((b & 0x80u) << 24) | ((b & 0x7fu) << 20)) *
                  (FNUZ ? 6.646139978924579e35f : 1.329227995784916e36f);  // 2^119 : 2^120
  return (FNUZ ? (b & 0xffu) == 0x80u : (b & 0x7fu) == 0x7fu) ? quiet_nan() : v;
}

// Four e4m3 bytes of w times s -> two bf16x2 words (element order = byte order),
// the same values as e4m3_bits_to_float<FNUZ>(byte) * s rounded to bf16.
// MUL = false: the raw values (s unused; exact in bf16).
template <bool FNUZ, bool MUL = true>
__device__ __forceinline__ void dequant4(uint32_t w, float s, uint32_t& lo, uint32_t& hi) {
#if defined(MLA_EXT_DECODE_CVT_FP8)
  uint32_t x0, x1;  // the four values as two f16x2 words, exact
  if constexpr (!FNUZ) {
    // e4m3 -> f16 is exact (NaN codes -> NaN): ~2x fewer instructions than the scalar decode.
    asm("{\n"
        ".reg .b16 a, b;\n"
        "mov.b32 {a, b}, %2;\n"
        "cvt.rn.f16x2.e4m3x2 %0, a;\n"
        "cvt.rn.f16x2.e4m3x2 %1, b;\n"
        "}\n"
        : "=r"(x0), "=r"(x1)
        : "r"(w));
  } else {
    // No packed e4m3fnuz conversion on NVIDIA. Bit decode in f16 pairs: byte
    // S.EEEE.MMM placed as the f16 S.0EEEE.MMM0000000 is its fnuz value times
    // 2^-7, exactly (E = 0 lands on f16 subnormals = fnuz subnormals scaled),
    // never inf or NaN; 0x80 gets the high byte 0xff instead (an f16 NaN). Then
    // x 2^7 in f16 (exact).
    const uint32_t mag = w & 0x7f7f7f7fu;
    const uint32_t is80 = w & ~(mag + 0x7f7f7f7fu) & 0x80808080u;  // bit 7 of each 0x80 byte
    const uint32_t top = (w & 0x80808080u) | (is80 - (is80 >> 7));  // sign byte, 0xff for 0x80
    const uint32_t h01 = (__byte_perm(mag, 0u, 0x1404u) >> 1) | __byte_perm(top, 0u, 0x1404u);
    const uint32_t h23 = (__byte_perm(mag, 0u, 0x3424u) >> 1) | __byte_perm(top, 0u, 0x3424u);
    asm("{\n"
        ".reg .b32 k;\n"
        "mov.b32 k, 0x58005800;\n"  // f16x2 {128, 128}
        "mul.rn.f16x2 %0, %2, k;\n"
        "mul.rn.f16x2 %1, %3, k;\n"
        "}\n"
        : "=r"(x0), "=r"(x1)
        : "r"(h01), "r"(h23));
  }
  // f16 -> f32 exact, one fp32 multiply by s (MUL), one rounding to bf16: the same
  // values as e4m3_bits_to_float<FNUZ>(byte) * s rounded to bf16.
#define MLA_EXT_DQ4_WIDEN                 \
  "{\n"                                   \
  ".reg .b16 l0, h0, l1, h1;\n"           \
  ".reg .f32 f0, f1, f2, f3;\n"           \
  "mov.b32 {l0, h0}, %2;\n"               \
  "mov.b32 {l1, h1}, %3;\n"               \
  "cvt.f32.f16 f0, l0;\n"                 \
  "cvt.f32.f16 f1, h0;\n"                 \
  "cvt.f32.f16 f2, l1;\n"                 \
  "cvt.f32.f16 f3, h1;\n"
#define MLA_EXT_DQ4_PACK                  \
  "cvt.rn.bf16x2.f32 %0, f1, f0;\n"       \
  "cvt.rn.bf16x2.f32 %1, f3, f2;\n"       \
  "}\n"
  if constexpr (!MUL) {
    asm(MLA_EXT_DQ4_WIDEN MLA_EXT_DQ4_PACK : "=r"(lo), "=r"(hi) : "r"(x0), "r"(x1));
    (void)s;
  } else {
    asm(MLA_EXT_DQ4_WIDEN
        "mul.rn.f32 f0, f0, %4;\n"
        "mul.rn.f32 f1, f1, %4;\n"
        "mul.rn.f32 f2, f2, %4;\n"
        "mul.rn.f32 f3, f3, %4;\n" MLA_EXT_DQ4_PACK
        : "=r"(lo), "=r"(hi)
        : "r"(x0), "r"(x1), "f"(s));
  }
#undef MLA_EXT_DQ4_WIDEN
#undef MLA_EXT_DQ4_PACK
#else
  if (!MUL) s = 1.f;
  lo = pack_bf16x2(e4m3_bits_to_float<FNUZ>(w) * s, e4m3_bits_to_float<FNUZ>(w >> 8) * s);
  hi = pack_bf16x2(e4m3_bits_to_float<FNUZ>(w >> 16) * s, e4m3_bits_to_float<FNUZ>(w >> 24) * s);
#endif
}

// e4m3fn x UE8M0 scale without the conversion pipe (V4 rows in the mma.sync and warpgroup
// tiles: the RAW tile's Q.K on sm_89+, the row-quarter stores on sm_80+). H200, same-run A/B
// (sixty-first session): most V4 calls at 8-128 heads x 16-512 tokens -1..-4%, one token -0.5..-2%.
// A byte S.EEEE.MMM placed as the bf16 S.0000EEEE.MMM0000 is its value times 2^-120, exactly
// (E = 0 lands on bf16 subnormals, which are e4m3's subnormals scaled alike), so one bf16
// multiply by 2^(e - 7) gives value x 2^(e - 127) rounded once to bf16: the bits of
// dequant4<false, true>(w, ue8m0_to_float(e)), if no byte of w is a NaN code (0x7f / 0xff:
// here 480 x scale) and e <= 134 (2^(e - 7) then a normal bf16). Callers test both first
// with FastDequantCheck (the RAW tile's fast_ok, Gather::fast_dequant_ok) and run dequant4
// where either fails. V3.2 rows in the asymmetric 64-head and cluster kernels use it too, with
// the multiplier 2^(k + 120) for their value x 2^k (Gather::store_quarter_row, kFastExpk).
// Per 4 values: 2 PRMT + 2 shifts + 2 LOP3 + 2 bf16x2 multiplies, against dequant4's two
// conversions to f16x2, four widenings, four fp32 multiplies and two packs.
// UE8M0 byte e (low 8 bits of x's byte `byte`) -> the bf16x2 multiplier {2^(e-7), 2^(e-7)}.
__device__ __forceinline__ uint32_t ue8m0_bf16x2_multiplier(uint32_t x, int byte) {
  // e x (2^7 + 2^23) + (120 << 7) in each half: (e + 120) << 7, e + 120 <= 254 for e <= 134.
  return ((x >> (8 * byte)) & 0xffu) * 0x00800080u + 0x3c003c00u;
}
__device__ __forceinline__ void dequant4_ue8m0_fast(uint32_t w, uint32_t m2, uint32_t& lo, uint32_t& hi) {
#if defined(MLA_EXT_DECODE_MMA)
  uint32_t v0, v1;  // each byte sign-extended to 16 bits (prmt's sign-replicating selectors)
  asm("prmt.b32 %0, %2, 0, 0x9180;\n"
      "prmt.b32 %1, %2, 0, 0xb3a2;\n"
      : "=r"(v0), "=r"(v1)
      : "r"(w));
  const uint32_t t0 = (v0 << 4) & 0x87f087f0u, t1 = (v1 << 4) & 0x87f087f0u;
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  asm("mul.rn.bf16x2 %0, %2, %4;\n"
      "mul.rn.bf16x2 %1, %3, %4;\n"
      : "=r"(lo), "=r"(hi)
      : "r"(t0), "r"(t1), "r"(m2));
#else
  asm("{\n"
      ".reg .b32 z;\n"
      "mov.b32 z, 0x80008000;\n"  // -0: x * m + -0 is x * m, signed zeros included
      "fma.rn.bf16x2 %0, %2, %4, z;\n"
      "fma.rn.bf16x2 %1, %3, %4, z;\n"
      "}\n"
      : "=r"(lo), "=r"(hi)
      : "r"(t0), "r"(t1), "r"(m2));
#endif
#else
  (void)w; (void)m2; lo = hi = 0u;  // (NVIDIA sm_80+ only: kFastDq is false elsewhere)
#endif
}
// Whether dequant4_ue8m0_fast gives dequant4's bits for a set of FP8 words and UE8M0 scale
// bytes: add every word and every scale word (bytes not used as scales masked to 0), then ok().
//  - NaN codes (low 7 bits 0x7f): adding 1 to each byte flips that byte's bit 7 (a carry out
//    of a 0xff byte can flip the next one's too, but only next to a NaN code).
//  - Scale bytes above 134 (2^(e - 7) not a normal bf16): bit 7 set and low 7 bits + 0x79
//    reaching bit 7.
struct FastDequantCheck {
  uint32_t nan = 0u, big = 0u;
  __device__ __forceinline__ void word(uint32_t w) { nan |= w ^ (w + 0x01010101u); }
  __device__ __forceinline__ void scales(uint32_t x) { big |= x & ((x & 0x7f7f7f7fu) + 0x79797979u); }
  __device__ __forceinline__ bool ok() const { return ((nan | big) & 0x80808080u) == 0u; }
};

// dequant4_ue8m0_fast over one 16-byte chunk (lo: bytes 0-7, hi: bytes 8-15), one multiplier.
__device__ __forceinline__ void dequant16_fast(const uint4& r, uint32_t m2, uint4& lo, uint4& hi) {
  dequant4_ue8m0_fast(r.x, m2, lo.x, lo.y);
  dequant4_ue8m0_fast(r.y, m2, lo.z, lo.w);
  dequant4_ue8m0_fast(r.z, m2, hi.x, hi.y);
  dequant4_ue8m0_fast(r.w, m2, hi.z, hi.w);
}

// One 16-byte chunk of e4m3 bytes (times s where MUL) -> 16 bf16 as two 16-byte chunks
// (lo: bytes 0-7, hi: bytes 8-15).
template <bool FNUZ, bool MUL>
__device__ __forceinline__ void dequant16(const uint4& r, float s, uint4& lo, uint4& hi) {
  dequant4<FNUZ, MUL>(r.x, s, lo.x, lo.y);
  dequant4<FNUZ, MUL>(r.y, s, lo.z, lo.w);
  dequant4<FNUZ, MUL>(r.z, s, hi.x, hi.y);
  dequant4<FNUZ, MUL>(r.w, s, hi.z, hi.w);
}

__device__ __forceinline__ void bf16x8_to_float(const uint4& v, float f[8]) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = bits_to_float(w[i] << 16);
    f[2 * i + 1] = bits_to_float(w[i] & 0xffff0000u);
  }
}

// ---- tensor-core primitives (sm_80+) ----
// ldmatrix from a shared-space byte address (smem_addr): callers compute a
// lane's base address once and add compile-time offsets, instead of a generic
// -> shared conversion and 64-bit address arithmetic per fragment.
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
#if defined(MLA_EXT_DECODE_MMA)
  return uint32_t(__cvta_generic_to_shared(p));
#else
  (void)p;
  return 0u;
#endif
}
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t a) {
#if defined(MLA_EXT_DECODE_MMA)
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
#else
  (void)a; r[0] = r[1] = r[2] = r[3] = 0;
#endif
}
__device__ __forceinline__ void ldsm_x2(uint32_t (&r)[2], uint32_t a) {
#if defined(MLA_EXT_DECODE_MMA)
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1]) : "r"(a));
#else
  (void)a; r[0] = r[1] = 0;
#endif
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], uint32_t a) {
#if defined(MLA_EXT_DECODE_MMA)
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
#else
  (void)a; r[0] = r[1] = r[2] = r[3] = 0;
#endif
}
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if defined(MLA_EXT_DECODE_MMA)
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
  (void)c; (void)a; (void)b0; (void)b1;
#endif
}

// One 16-byte shared-memory store as a single instruction (NVVM split the
// swizzled tile's dequantised stores into four 4-byte ones: 5x the wavefronts).
__device__ __forceinline__ void st_shared16(void* smem_dst, const uint4& v) {
#if defined(MLA_EXT_DECODE_MMA)
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(smem_addr(smem_dst)), "r"(v.x), "r"(v.y),
               "r"(v.z), "r"(v.w)
               : "memory");
#else
  *reinterpret_cast<uint4*>(smem_dst) = v;
#endif
}

// 16-byte global -> shared copy that does not wait (sm_80+ cp.async; plain
// load + store elsewhere), and the wait for all of this thread's copies.
__device__ __forceinline__ void copy16_async(void* smem_dst, const void* gmem_src) {
#if defined(MLA_EXT_DECODE_MMA)
  const uint32_t d = uint32_t(__cvta_generic_to_shared(smem_dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(gmem_src) : "memory");
#else
  *reinterpret_cast<uint4*>(smem_dst) = *reinterpret_cast<const uint4*>(gmem_src);
#endif
}
// 4-byte global -> shared copy that does not wait (cp.async.ca: 4 bytes may not bypass L1).
__device__ __forceinline__ void copy4_async(void* smem_dst, const void* gmem_src) {
#if defined(MLA_EXT_DECODE_MMA)
  const uint32_t d = uint32_t(__cvta_generic_to_shared(smem_dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(d), "l"(gmem_src) : "memory");
#else
  *reinterpret_cast<uint32_t*>(smem_dst) = *reinterpret_cast<const uint32_t*>(gmem_src);
#endif
}
// The RAW tile's Q layout: the A fragments of head rows rr and rr + 8 interleaved, so that one
// 16-byte shared load is one fragment (no register moves to assemble it: 239 -> 22 IMAD.MOV in
// the balanced instance's loop, -3.9% of its instructions net). H100, same-run A/B against the
// plain layout, two rounds (RESULTS.md, fifty-ninth session): C128 8-16 heads x 64-512 tokens
// -1..-4%, C4 Flash x 300 -4%; the straggler layer at 128 tokens +1..+3%, C4 Pro x 64 +1%. Row pair rr holds
// 129 16-byte units (128 + 1: an odd pitch spreads the pairs over the banks); unit 2 c + half
// holds dims 8 c + 4 half .. + 3 of both heads as {rr: d, d + 1; rr + 8: d, d + 1; rr: d + 2,
// d + 3; rr + 8: d + 2, d + 3}, the unit index's bit 1 XOR its bit 3 (a quad's four FP8 chunks
// 16 dims apart then fall in four different bank groups: the FP8 loads are conflict-free; the
// RoPE loads of row pairs 2k and 2k + 1 share bank groups, 2 wavefronts per 8 lanes, as the
// two 8-byte loads they replace took).
constexpr int kRawQPairUnits = 129;
__device__ __forceinline__ int raw_q_unit(int unit) { return unit ^ (((unit >> 3) & 1) << 1); }
// Word offset (4-byte units from the layout's start) of dims d, d + 1 (d even) of head h < 16.
__device__ __forceinline__ int raw_q_word(int h, int d) {
  return (h & 7) * (4 * kRawQPairUnits) + 4 * raw_q_unit(2 * (d >> 3) + ((d >> 2) & 1)) + 2 * ((d >> 1) & 1) + (h >> 3);
}
__device__ __forceinline__ void copy_async_wait_all() {
#if defined(MLA_EXT_DECODE_MMA)
  asm volatile("cp.async.wait_all;\n" ::: "memory");
#endif
}

// ---- warpgroup MMA primitives (sm_90a) ----
// Operands in shared memory in the 128-byte swizzled layout: rows of 64 bf16
// (128 bytes), 16-byte chunk j of row r stored at chunk j ^ (r % 8), in
// 1024-byte atoms of 8 rows (the address bits 4-6 XOR bits 7-9, so every
// region starts 1024-byte aligned). A matrix wider than 64 elements is a
// sequence of such 64-column blocks (swz_chunk).
// Descriptor (PTX ISA, "matrix descriptor"): start address, leading and stride
// byte offsets (all >> 4) and the swizzle mode (1 = 128 bytes, bits 62-63).
// K-major operands: stride offset 1024 (next 8 rows), leading offset unused.
// MN-major operands: leading offset = the next 64-column block along MN, stride
// offset 1024 (the next 8 rows along K).
__device__ __forceinline__ uint64_t wg_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return uint64_t((addr & 0x3ffffu) >> 4) | (uint64_t((lbo & 0x3ffffu) >> 4) << 16) |
         (uint64_t((sbo & 0x3ffffu) >> 4) << 32) | (uint64_t(1) << 62);
}
// The descriptor of the operand `bytes` (a multiple of 16) further on: the
// start-address field is bits 0-13 (address >> 4), and a block's shared memory
// ends below 2^18 bytes, so the sum never carries out of the field. Adding to
// the low word alone leaves the per-step descriptor a single integer add
// (wg_desc's masks and shifts cost ~6 instructions per wgmma otherwise).
__device__ __forceinline__ uint64_t wg_desc_add(uint64_t d, uint32_t bytes) {
  return (d & 0xffffffff00000000ull) | uint64_t(uint32_t(d) + (bytes >> 4));
}
// A swizzled operand at shared address `addr` (leading offset `lbo`, stride
// offset 1024): at(bytes) is the descriptor `bytes` further on, by one add
// (ADD) or built afresh from the address (decode_body's kDescAdd says which).
template <bool ADD>
struct WgOperand {
  uint32_t addr, lbo;
  uint64_t desc;
  __device__ __forceinline__ WgOperand(uint32_t a, uint32_t l) : addr(a), lbo(l), desc(wg_desc(a, l, 1024)) {}
  __device__ __forceinline__ uint64_t at(uint32_t bytes) const {
    return ADD ? wg_desc_add(desc, bytes) : wg_desc(addr + bytes, lbo, 1024);
  }
};
// One PTX statement that only the warpgroup-MMA (sm_90a) build emits; a no-op
// elsewhere.
#if defined(MLA_EXT_DECODE_WGMMA)
#define MLA_EXT_WG_ASM(text) asm volatile(text ::: "memory")
#else
#define MLA_EXT_WG_ASM(text) ((void)0)
#endif
// Orders this thread's earlier shared-memory stores (generic proxy) before
// later wgmma reads (async proxy); a barrier then publishes them to the block.
__device__ __forceinline__ void fence_proxy_async() { MLA_EXT_WG_ASM("fence.proxy.async.shared::cta;\n"); }
// Before a warpgroup's first wgmma, and whenever other instructions wrote its
// accumulators since the last one.
__device__ __forceinline__ void wg_fence() { MLA_EXT_WG_ASM("wgmma.fence.sync.aligned;\n"); }
// Pins ordinary reads and writes of wgmma accumulators on their side of
// wg_fence / wg_commit_wait (an empty asm per register, no instruction: the PTX
// rules want the fence between such writes and the wgmma that reads them, and
// nothing else stops the compiler from moving them across).
template <int N>
__device__ __forceinline__ void wg_fence_operands(float (&r)[N]) {
#if defined(MLA_EXT_DECODE_WGMMA)
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
#else
  (void)r;
#endif
}
// Commits the warpgroup's issued wgmmas (wg_commit) and waits for all of them
// (wg_wait_all); in two steps where other work (nothing touching the in-flight
// accumulators, nor the shared memory the wgmmas read) runs between them.
__device__ __forceinline__ void wg_commit() { MLA_EXT_WG_ASM("wgmma.commit_group.sync.aligned;\n"); }
__device__ __forceinline__ void wg_wait_all() { MLA_EXT_WG_ASM("wgmma.wait_group.sync.aligned 0;\n"); }
// Named barriers (ASYM warpgroup roles, decode_body): `n` threads in all, some
// arriving (no wait, release) and some waiting (acquire), id 1..15 (0 is
// __syncthreads).
template <bool ARRIVE>
__device__ __forceinline__ void named_bar(int id, int n) {
#if defined(MLA_EXT_DECODE_WGMMA)
  if constexpr (ARRIVE) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory");
  } else {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory");
  }
#else
  (void)id; (void)n;
#endif
}
__device__ __forceinline__ void named_bar_sync(int id, int n) { named_bar<false>(id, n); }
__device__ __forceinline__ void named_bar_arrive(int id, int n) { named_bar<true>(id, n); }
// 2-block clusters (decode_body's CL, sm_90a): this block's rank, the peer's address of a
// shared-memory address, mbarriers, bulk copies into the peer's shared memory, the cluster
// barrier. Elsewhere no-ops (the cluster kernel then runs the mma.sync body).
#if defined(MLA_EXT_DECODE_WGMMA)
__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
__device__ __forceinline__ uint32_t cluster_map(uint32_t addr, uint32_t rank) {
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(addr), "r"(rank));
  return r;
}
__device__ __forceinline__ void mbar_init(uint32_t addr, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(addr), "r"(count) : "memory");
}
__device__ __forceinline__ void fence_mbar_init() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
// Arrive on the peer's mbarrier (caddr: cluster_map), default semantics (release, CTA scope):
// for "done reading", where nothing but the arrive itself needs ordering.
__device__ __forceinline__ void mbar_arrive_remote_cta(uint32_t caddr) {
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(caddr) : "memory");
}
// Arrive on the peer's mbarrier and add `bytes` to the transactions its phase waits for.
__device__ __forceinline__ void mbar_arrive_expect_tx_remote(uint32_t caddr, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cluster.b64 _, [%0], %1;\n" ::"r"(caddr), "r"(bytes) : "memory");
}
// Copy `bytes` (multiple of 16) of this block's shared memory at src to the peer's at dst (both
// cluster addresses of the same kind: dst and mbar from cluster_map), completing `bytes` of
// transactions on the peer's mbarrier.
__device__ __forceinline__ void bulk_copy_to_peer(uint32_t dst, uint32_t src, uint32_t bytes, uint32_t mbar) {
  asm volatile("cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "r"(src), "r"(bytes), "r"(mbar)
               : "memory");
}
// Wait for the phase of parity `parity` of this block's mbarrier (acquire, CTA scope).
__device__ __forceinline__ void mbar_wait_cta(uint32_t addr, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred p;\nMLA_EXT_MBC_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra MLA_EXT_MBC_%=;\n}\n" ::"r"(addr),
      "r"(parity)
      : "memory");
}
#else
__device__ __forceinline__ uint32_t cluster_rank() { return 0u; }
__device__ __forceinline__ uint32_t cluster_map(uint32_t addr, uint32_t) { return addr; }
__device__ __forceinline__ void mbar_init(uint32_t, int) {}
__device__ __forceinline__ void fence_mbar_init() {}
__device__ __forceinline__ void cluster_sync() {}
__device__ __forceinline__ void mbar_arrive_remote_cta(uint32_t) {}
__device__ __forceinline__ void mbar_arrive_expect_tx_remote(uint32_t, uint32_t) {}
__device__ __forceinline__ void bulk_copy_to_peer(uint32_t, uint32_t, uint32_t, uint32_t) {}
__device__ __forceinline__ void mbar_wait_cta(uint32_t, uint32_t) {}
#endif
__device__ __forceinline__ void wg_commit_wait() {
  wg_commit();
  wg_wait_all();
}
// The wgmma accumulator operands: placeholders %0..%127 in groups of 32, and
// "+f" constraints for d[i..i+31] (the asm templates must be string literals).
#define MLA_EXT_WG_R0 \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define MLA_EXT_WG_R32 \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define MLA_EXT_WG_R64 \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95"
#define MLA_EXT_WG_R96 \
  "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
  "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define MLA_EXT_WG_ACC8(d, i) \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define MLA_EXT_WG_ACC32(d, i) \
  MLA_EXT_WG_ACC8(d, i), MLA_EXT_WG_ACC8(d, i + 8), MLA_EXT_WG_ACC8(d, i + 16), MLA_EXT_WG_ACC8(d, i + 24)

// D[64 x 64] += A[64 x 16] B[16 x 64]: A and B K-major (B given as N rows of K).
__device__ __forceinline__ void wgmma_m64n64k16(float (&d)[32], uint64_t da, uint64_t db) {
#if defined(MLA_EXT_DECODE_WGMMA)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" MLA_EXT_WG_R0 "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : MLA_EXT_WG_ACC32(d, 0)
      : "l"(da), "l"(db), "r"(1));
#else
  (void)d; (void)da; (void)db;
#endif
}

// D[64 x 16] += A[64 x 16] B[16 x 16]: B K-major (N rows of K); A K-major, or MN-major (TA:
// K rows of M, transposed). The asymmetric 16-head tile's S^T = K Q^T and O^T = V^T P^T.
template <bool TA>
__device__ __forceinline__ void wgmma_m64n16k16(float (&d)[8], uint64_t da, uint64_t db) {
#if defined(MLA_EXT_DECODE_WGMMA)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1, %11, 0;\n}\n"
      : MLA_EXT_WG_ACC8(d, 0)
      : "l"(da), "l"(db), "r"(1), "n"(TA ? 1 : 0));
#else
  (void)d; (void)da; (void)db;
#endif
}

// D[64 x 256] += A[64 x 16] B[16 x 256]: A K-major, B MN-major (K rows of N, transposed).
__device__ __forceinline__ void wgmma_m64n256k16_bt(float (&d)[128], uint64_t da, uint64_t db) {
#if defined(MLA_EXT_DECODE_WGMMA)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {" MLA_EXT_WG_R0 ", " MLA_EXT_WG_R32 ", " MLA_EXT_WG_R64
      ", " MLA_EXT_WG_R96 "}, %128, %129, p, 1, 1, 0, 1;\n}\n"
      : MLA_EXT_WG_ACC32(d, 0), MLA_EXT_WG_ACC32(d, 32), MLA_EXT_WG_ACC32(d, 64), MLA_EXT_WG_ACC32(d, 96)
      : "l"(da), "l"(db), "r"(1));
#else
  (void)d; (void)da; (void)db;
#endif
}

// The m64n256 accumulator's two rows of this thread (r0, r0 + 8 of its warp's
// 16) times a0 and a1: the online softmax's rescale before a P.V step.
__device__ __forceinline__ void scale_rows_m64n256(float* acc, float a0, float a1) {
#pragma unroll
  for (int n = 0; n < 32; ++n) {
    acc[4 * n] *= a0; acc[4 * n + 1] *= a0; acc[4 * n + 2] *= a1; acc[4 * n + 3] *= a1;
  }
}

// D[64 x 256] += A[64 x 16] B[16 x 256]: A from registers (4 bf16 pairs per
// thread in the m16n8k16 A-fragment layout of the thread's warp rows: the
// layout a m64nN accumulator has, so S can feed P.V without shared memory),
// B MN-major as in wgmma_m64n256k16_bt.
__device__ __forceinline__ void wgmma_m64n256k16_rs(float (&d)[128], const uint32_t (&a)[4], uint64_t db) {
#if defined(MLA_EXT_DECODE_WGMMA)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {" MLA_EXT_WG_R0 ", " MLA_EXT_WG_R32 ", " MLA_EXT_WG_R64
      ", " MLA_EXT_WG_R96 "}, {%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}\n"
      : MLA_EXT_WG_ACC32(d, 0), MLA_EXT_WG_ACC32(d, 32), MLA_EXT_WG_ACC32(d, 64), MLA_EXT_WG_ACC32(d, 96)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
#else
  (void)d; (void)a; (void)db;
#endif
}

// D[64 x 128] += A[64 x 16] B[16 x 128]: as wgmma_m64n256k16_bt, half as wide
// (fp8_ds_mla: one 128-dim V scale group per product, each with its P copy).
__device__ __forceinline__ void wgmma_m64n128k16_bt(float (&d)[64], uint64_t da, uint64_t db) {
#if defined(MLA_EXT_DECODE_WGMMA)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" MLA_EXT_WG_R0 ", " MLA_EXT_WG_R32
      "}, %64, %65, p, 1, 1, 0, 1;\n}\n"
      : MLA_EXT_WG_ACC32(d, 0), MLA_EXT_WG_ACC32(d, 32)
      : "l"(da), "l"(db), "r"(1));
#else
  (void)d; (void)da; (void)db;
#endif
}

// D[64 x 128] += A[64 x 16] B[16 x 128]: A from registers as in wgmma_m64n256k16_rs, B as
// in wgmma_m64n128k16_bt (the asymmetric fp8_ds_mla kernel: P times one group's key scales).
__device__ __forceinline__ void wgmma_m64n128k16_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t db) {
#if defined(MLA_EXT_DECODE_WGMMA)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" MLA_EXT_WG_R0 ", " MLA_EXT_WG_R32
      "}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
      : MLA_EXT_WG_ACC32(d, 0), MLA_EXT_WG_ACC32(d, 32)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
#else
  (void)d; (void)a; (void)db;
#endif
}

#undef MLA_EXT_WG_ASM
#undef MLA_EXT_WG_ACC32
#undef MLA_EXT_WG_ACC8
#undef MLA_EXT_WG_R96
#undef MLA_EXT_WG_R64
#undef MLA_EXT_WG_R32
#undef MLA_EXT_WG_R0

// ---- gather: raw 16-byte chunks of one tile, held in registers ----
// FP8 formats split a row's chunks into two unit sets, the FP8 chunks and the
// bf16 RoPE chunks, each numbered row-major and dealt round-robin to the
// threads (V4: 64 x 28 = 7 x 256 and 64 x 8 = 2 x 256 units), so a unit's kind,
// byte offset and scale rule are fixed per loop instead of tested per unit.
// SPLIT = false keeps one set of all chunks, the kind tested per unit (the V3.2
// 64-head tile: the two loops cost it 56 bytes of spills at 255 registers).
// PAIRED (the swizzled K tile of the warpgroup kernels): the FP8 set is dealt
// in runs of 4 chunks alternating between the two rows of a row pair, so the 8
// lanes of a 16-byte store phase write 8 different 16-byte slots of the
// swizzled rows (row-major dealing put them on 4: 5x the shared wavefronts
// with the stores NVVM split, 2x with whole ones).
// QUARTERS (V4 rows in every tensor-core kernel and V3.2 rows in the warpgroup
// kernels, 4 threads per row; replaces the dealing above, so PAIRED changes
// nothing for those rows): thread t owns row
// 2 (t / 8) + (t / 4) % 2 and quarter q = t % 4 of it: FP8 chunks q + 4 k
// (V4: k = the chunk's 64-dim scale group, so one 8-byte load brings all of a
// row's scales; V3.2: thread q loads the fp32 scale of 128-dim group q) and
// the RoPE chunks of rope_chunk (padded tile: 64 contiguous bytes per load
// instruction and row; SWZ, the swizzled tile: 2 q, 2 q + 1). One row pointer per thread and
// tile instead of one per unit, no per-unit index arithmetic, and each 16-byte
// store phase (8 lanes) covers 4 chunks of a row pair: conflict-free in the
// padded tile of the mma.sync kernels, whose second row lies 16 bytes further
// round the banks (row stride 1040 bytes; row-major dealing: 2-way conflicts,
// 832 instead of 448 wavefronts per tile), and in the swizzled tile, where the
// pair's rows have opposite swizzle parity. H200: up to -9% on V4 calls, +2%
// on the window layer at 64 tokens (benchmarks/NOTES.md, fourteenth session).
template <KvFormat F, int DQK, int BN, bool SPLIT = true, bool PAIRED = false, bool QUARTERS = false,
          bool SWZ = false, bool PHASES = false, bool EXPK = false>
struct Gather {
  static constexpr KvFormat kLayout = kv_layout(F);  // fnuz formats: their e4m3fn twin's bytes
  using FT = Fmt<kLayout, DQK>;
  static constexpr bool kFp8 = F != KvFormat::kBF16;
  static constexpr int kNF = (kFp8 && SPLIT) ? FT::kFp8Chunks : FT::kChunks;  // set 1: chunks per row
  static constexpr int kNR = FT::kChunks - kNF;                    // set 2 (RoPE): chunks per row
  static constexpr int kNRd = kNR > 0 ? kNR : 1;                   // its divisor (set 2 may be empty)
  static constexpr int kUnitsF = BN * kNF, kUnitsR = BN * kNR;
  static constexpr int kUF = (kUnitsF + kThreads - 1) / kThreads;
  static constexpr int kUR = (kUnitsR + kThreads - 1) / kThreads;
  // kRowScales (fp8_ds_mla with BN = 64 and SPLIT: the 16- and 32-head mma.sync
  // tiles and the warpgroup kernel; not the 64-head mma.sync tile): thread t
  // loads scale t % 4 of row t / 4 once (kThreads = 4 BN) instead of one scale
  // per FP8 unit (8 per tile under the row-major dealing). Under row quarters
  // (the warpgroup kernel) load_quarters loads it instead; only the size of
  // sraw follows from kRowScales there.
  static constexpr bool kRowScales = kv_layout(F) == KvFormat::kFP8DsMla && SPLIT && kThreads == 4 * BN;
  uint4 raw[kUF + kUR];
  uint32_t sraw[(kFp8 && !kRowScales) ? kUF : 1];  // raw scale bits (UE8M0 byte / fp32 bits), decoded at store

  // This thread's unit k of a set of UNITS units, PER_ROW chunks per row: its row
  // and chunk, or false past the end of the set.
  // RUNS: u = ((row pair * PER_ROW / 4 + c / 4) * 2 + row % 2) * 4 + c % 4.
  template <int UNITS, int PER_ROW, bool RUNS = false>
  static __device__ __forceinline__ bool unit(int tid, int k, int& row, int& c) {
    const int u = tid + k * kThreads;
    if ((UNITS % kThreads) != 0 && u >= UNITS) return false;
    if constexpr (RUNS) {
      static_assert(PER_ROW % 4 == 0 && BN % 2 == 0, "runs of 4 chunks over row pairs");
      const int q = u >> 3, rp = q / (PER_ROW / 4);
      row = 2 * rp + ((u >> 2) & 1);
      c = 4 * (q - rp * (PER_ROW / 4)) + (u & 3);
    } else {
      row = u / PER_ROW;
      c = u - row * PER_ROW;
    }
    return true;
  }
  static constexpr bool kRuns = PAIRED && kFp8 && SPLIT;
  // V3.2 (fp8_ds_mla) rows too: 8 FP8 chunks per thread, and thread q loads the
  // fp32 scale of 128-dim group q (the K tile keeps raw values; the scales go
  // to ksc[group][row], written by the row's thread q).
  static constexpr bool kQuarters = QUARTERS && SPLIT &&
                                    (kLayout == KvFormat::kFP8DsMlaV4 || kLayout == KvFormat::kFP8DsMla);
  static_assert(!kQuarters || (kThreads == 4 * BN && kNF % 4 == 0 && kNR == 8 && kUF == kNF / 4 && kUR == 2),
                "row quarters: 4 threads per row, kNF / 4 FP8 + 2 RoPE chunks each");
  static __device__ __forceinline__ int quarter_row(int tid) { return 2 * (tid >> 3) + ((tid >> 2) & 1); }
  // RoPE chunk (0..7) of quarter q's unit k in `row`. Padded tile (mma.sync
  // kernels): each load instruction reads 64 contiguous bytes of a row (chunks
  // 4k..4k+3 up to a rotation), so its sectors are whole; with chunks 2q, 2q + 1
  // an instruction read four 16-byte pieces 32 bytes apart and every RoPE sector
  // was fetched twice, half used each time. The odd row of a store phase's row
  // pair (slot = row + chunk mod 8, rows 1040 bytes apart) takes chunks q + 3,
  // then q + 7 mod 8, so the phase's 8 stores stay on 8 different 16-byte slots
  // (3 sectors per instruction, 6 for that row instead of 4). H200: -1..2.5% at
  // 16 heads (C4, C128, straggler batch). SWZ (swizzled tile of the warpgroup
  // kernels) keeps 2q, 2q + 1: the whole-sector order there (chunks q + 4 k, the
  // odd row the other half first) measured +-1% on the uniform map and +4% on
  // the balanced one at 64 heads (benchmarks/NOTES.md, seventeenth session).
  static __device__ __forceinline__ int rope_chunk(int q, int k, int row) {
    if constexpr (SWZ) {
      return 2 * q + k;
    } else {
      return (row & 1) ? ((q + 3 + 4 * k) & 7) : q + 4 * k;
    }
  }

  // Only loads here: nothing consumes a loaded value before store(), so every
  // load of the tile is in flight at once (no per-load latency chain).
  // PART (row-major dealing only): 0 loads the first half of the FP8 units (and
  // kRowScales' scale), 1 the rest; -1 all of them.
  template <int PART = -1>
  __device__ __forceinline__ void load(const uint8_t* const* data, const uint8_t* const* scale, int tid) {
    if constexpr (kQuarters) {
      static_assert(PART < 0, "row quarters load a tile at once");
      load_quarters(data, scale, tid);
    } else {
      load_units<PART>(data, scale, tid);
    }
  }
  __device__ __forceinline__ void load_quarters(const uint8_t* const* data, const uint8_t* const* scale, int tid) {
    const int row = quarter_row(tid), q = tid & 3;
    const uint8_t* d = data[row];
#pragma unroll
    for (int k = 0; k < kUF + kUR; ++k) raw[k] = make_uint4(0u, 0u, 0u, 0u);
    sraw[0] = 0u;
    if constexpr (!kScaled) sraw[1] = 0u;
    if (d == nullptr) return;
#pragma unroll
    for (int k = 0; k < kUF; ++k) raw[k] = *reinterpret_cast<const uint4*>(d + 16 * (q + 4 * k));
    if constexpr (kScaled) {
      sraw[0] = *reinterpret_cast<const uint32_t*>(d + 512 + 4 * q);  // fp32 scale of group q
    } else {
      const uint2 sc = *reinterpret_cast<const uint2*>(scale[row]);  // 7 UE8M0 bytes + 1 pad
      sraw[0] = sc.x;
      sraw[1] = sc.y;
    }
#pragma unroll
    for (int k = 0; k < kUR; ++k)
      raw[kUF + k] = *reinterpret_cast<const uint4*>(d + FT::kRopeByte + 16 * rope_chunk(q, k, row));
  }
  template <int PART>
  __device__ __forceinline__ void load_units(const uint8_t* const* data, const uint8_t* const* scale, int tid) {
    constexpr int k0 = PART == 1 ? kUF / 2 : 0, k1 = PART == 0 ? kUF / 2 : kUF;
#pragma unroll
    for (int k = k0; k < k1; ++k) {
      raw[k] = make_uint4(0u, 0u, 0u, 0u);
      if (kFp8 && !kRowScales) sraw[kFp8 ? k : 0] = 0u;
      int row, c;
      if (!unit<kUnitsF, kNF, kRuns>(tid, k, row, c)) continue;
      const uint8_t* d = data[row];
      if (d == nullptr) continue;
      if (!SPLIT && kFp8 && c >= FT::kFp8Chunks) {
        raw[k] = *reinterpret_cast<const uint4*>(d + FT::kRopeByte + 16 * (c - FT::kFp8Chunks));
        continue;
      }
      raw[k] = *reinterpret_cast<const uint4*>(d + 16 * c);
      if (kFp8 && !kRowScales) {
        if (kLayout == KvFormat::kFP8DsMlaV4) {
          sraw[kFp8 ? k : 0] = scale[row][c >> 2];
        } else {
          sraw[kFp8 ? k : 0] = *reinterpret_cast<const uint32_t*>(d + 512 + 4 * (c >> 3));
        }
      }
    }
#pragma unroll
    for (int k = 0; k < (PART == 0 ? 0 : kUR); ++k) {
      raw[kUF + k] = make_uint4(0u, 0u, 0u, 0u);
      int row, c;
      if (!unit<kUnitsR, kNRd>(tid, k, row, c)) continue;
      const uint8_t* d = data[row];
      if (d == nullptr) continue;
      raw[kUF + k] = *reinterpret_cast<const uint4*>(d + FT::kRopeByte + 16 * c);
    }
    if constexpr (kRowScales && PART != 1) {
      const uint8_t* d = data[tid >> 2];
      sraw[0] = d != nullptr ? *reinterpret_cast<const uint32_t*>(d + 512 + 4 * (tid & 3)) : 0u;
    }
  }

  // kScaled (fp8_ds_mla): K gets the raw e4m3 values (exact in bf16) and ksc[g * BN + row]
  // the fp32 scale of 128-element group g; otherwise K gets value x scale rounded to bf16.
  static constexpr bool kScaled = kv_layout(F) == KvFormat::kFP8DsMla;
  // Rows at or past `live` (a tile's positions past its split's end) are not
  // read by the products: rows up to the next multiple of 16 get zeros (their
  // 16-row MMA block is still multiplied), later rows are not written at all.
  template <bool SKIP>
  __device__ __forceinline__ void store(uint16_t* K, int kst, float* ksc, int tid, int live) const {
    if (fast_dequant_ok()) {
      store_dq<SKIP, kFastDq>(K, kst, ksc, tid, live);
    } else {
      store_dq<SKIP, false>(K, kst, ksc, tid, live);
    }
  }
  template <bool SKIP, bool FAST>
  __device__ __forceinline__ void store_dq(uint16_t* K, int kst, float* ksc, int tid, int live) const {
    if constexpr (kQuarters) {
      store_quarters<SKIP, FAST>(K, kst, ksc, tid, live);
    } else {
      store_units<SKIP, FAST>(K, kst, ksc, tid, live);
    }
  }
  // V4 e4m3fn rows in row quarters (the mma.sync and warpgroup kernels): dequant4_ue8m0_fast
  // (no conversion instructions) where this thread's FP8 units hold no NaN code and its scale
  // bytes are all <= 134 (FastDequantCheck); otherwise (or other formats) the general
  // dequant4. Per thread and tile: the branch diverges only where rows carry NaN codes or
  // scales above 2^7.
#if defined(MLA_EXT_DECODE_MMA)
  static constexpr bool kFastDq = kLayout == KvFormat::kFP8DsMlaV4 && !kv_is_fnuz(F) && kQuarters;
  // fp8_ds_mla (e4m3fn) rows in the asymmetric kernels (EXPK): see store_quarter_row.
  static constexpr bool kFastExpk = kScaled && EXPK && !kv_is_fnuz(F) && kQuarters;
#else
  static constexpr bool kFastDq = false;
  static constexpr bool kFastExpk = false;
#endif
  // FastDequantCheck over this thread's FP8 words (raw[0 .. kUF)).
  __device__ __forceinline__ FastDequantCheck fp8_words_check() const {
    FastDequantCheck chk;
#pragma unroll
    for (int k = 0; k < kUF; ++k) {
      chk.word(raw[k].x);
      chk.word(raw[k].y);
      chk.word(raw[k].z);
      chk.word(raw[k].w);
    }
    return chk;
  }
  __device__ __forceinline__ bool fast_dequant_ok() const {
    if constexpr (!kFastDq) {
      return false;
    } else {
      FastDequantCheck chk = fp8_words_check();
      chk.scales(sraw[0]);
      chk.scales(sraw[1] & 0x00ffffffu);  // byte 7: padding
      return chk.ok();
    }
  }
  template <bool SKIP, bool FAST>
  __device__ __forceinline__ void store_quarters(uint16_t* K, int kst, float* ksc, int tid, int live) const {
    const int row = quarter_row(tid);
    if (SKIP && row >= ((live + 15) & ~15)) return;  // past the last live 16-row block: not read
    uint16_t* krow = K + size_t(row) * kst;
    store_quarter_row<FAST>([&](int ch, const uint4& v) { *reinterpret_cast<uint4*>(krow + 8 * ch) = v; }, ksc, tid,
                      SKIP && row >= live);
  }
  // This thread's quarter of its row (quarter_row(tid)): scale (kScaled), FP8
  // chunks dequantised, RoPE chunks copied, zeros where dead; put(ch, v) stores
  // 16-byte chunk ch of the row (padded or swizzled tile).
  // EXPK (fp8_ds_mla rows in the asymmetric kernel, decode_body): each group's scale s is
  // split into a power of two 2^k, multiplied into K (value x 2^k: exact in bf16, e4m3
  // values having 4 significant bits), and e = s / 2^k in [1, 2), written to ksc[g][row];
  // rows 4-6 get e_g / e_{g + 1}, by which Q.K's running sum is multiplied between groups
  // (its S = (((X0 r0 + X1) r1 + X2) r2 + X3) e3 + RoPE, X_g the raw products). A scale
  // of 0, inf or NaN is multiplied into K whole (K = value x s, exact: 0, inf or NaN, as
  // the reference's value x s) with e = 1; k is clamped to [-100, 100] (subnormal
  // scales: e = s x 2^100), so every ratio is finite and nonzero. Rows past `live`: e = 1.
  template <bool FAST, class PUT>
  __device__ __forceinline__ void store_quarter_row(const PUT& put, float* ksc, int tid, bool dead) const {
    const int row = quarter_row(tid), q = tid & 3;
    const uint4 z = make_uint4(0u, 0u, 0u, 0u);
    if constexpr (kScaled && EXPK) {
      const uint32_t b = sraw[0];
      const int ex = int((b >> 23) & 0xffu);
      float p2, e = 1.f;
      if (ex == 0xff || (b & 0x7fffffffu) == 0u) {
        p2 = bits_to_float(b);  // 0, inf or NaN: into K whole
      } else {
        const int k = ex - 127 < -100 ? -100 : (ex - 127 > 100 ? 100 : ex - 127);
        p2 = bits_to_float(uint32_t(k + 127) << 23);
        e = bits_to_float(b) * bits_to_float(uint32_t(127 - k) << 23);
      }
      if (dead) e = 1.f;
      // The row's other quarters' values (lanes q ^ 1, q ^ 2, q ^ 3 of the quad).
      const float p2x1 = MLA_EXT_SHFL_XOR(p2, 1), p2x2 = MLA_EXT_SHFL_XOR(p2, 2), p2x3 = MLA_EXT_SHFL_XOR(p2, 3);
      const float ex1 = MLA_EXT_SHFL_XOR(e, 1), ex3 = MLA_EXT_SHFL_XOR(e, 3);
      ksc[q * BN + row] = e;
      if (q < 3) ksc[(4 + q) * BN + row] = e / (q == 1 ? ex3 : ex1);  // e_q / e_{q + 1}
      // kFastExpk: value x 2^k as dequant4_ue8m0_fast with the multiplier 2^(k + 120), no
      // conversion instructions. The product is exact in bf16 for k in [-100, 7] (e4m3 values
      // have 4 significant bits and lie in [2^-9, 448]), so the bits are dequant16's. Taken
      // where all four groups' p2 are such powers of two (exponent fields 1..134: not the
      // whole-scale cases 0, inf or NaN, nor k > 7) and this thread's words hold no NaN code.
      bool fast = false;
      uint32_t m2[4] = {0u, 0u, 0u, 0u};
      if constexpr (kFastExpk) {
        const float pv[4] = {p2, p2x1, p2x2, p2x3};
        bool ok = !dead;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const uint32_t pb = float_to_bits(pv[i]);
          ok = ok && (pb >> 23) - 1u < 134u;
          m2[i] = ((pb >> 16) + (120u << 7)) * 0x00010001u;  // bf16x2 {2^(k + 120), 2^(k + 120)}
        }
        const FastDequantCheck chk = fp8_words_check();
        fast = ok && chk.ok();
      }
      if (fast) {
#pragma unroll
        for (int k = 0; k < kUF; ++k) {
          const int c = q + 4 * k;  // group c / 8 = k / 2
          const int gx = (k >> 1) ^ q;
          const uint32_t m = gx == 0 ? m2[0] : gx == 1 ? m2[1] : gx == 2 ? m2[2] : m2[3];
          uint4 lo, hi;
          dequant16_fast(raw[k], m, lo, hi);
          put(2 * c, lo);
          put(2 * c + 1, hi);
        }
      } else {
#pragma unroll
        for (int k = 0; k < kUF; ++k) {
          const int c = q + 4 * k;  // group c / 8 = k / 2
          const int gx = (k >> 1) ^ q;
          const float m = gx == 0 ? p2 : gx == 1 ? p2x1 : gx == 2 ? p2x2 : p2x3;
          uint4 lo = z, hi = z;
          if (!dead) dequant16<kv_is_fnuz(F), true>(raw[k], m, lo, hi);
          put(2 * c, lo);
          put(2 * c + 1, hi);
        }
      }
    } else {
      if constexpr (kScaled) ksc[q * BN + row] = dead ? 0.f : bits_to_float(sraw[0]);
#pragma unroll
      for (int k = 0; k < kUF; ++k) {
        const int c = q + 4 * k;
        uint4 lo = z, hi = z;
        if (!dead) dequant_unit<FAST>(k, c, row, ksc, lo, hi);
        put(2 * c, lo);
        put(2 * c + 1, hi);
      }
    }
#pragma unroll
    for (int k = 0; k < kUR; ++k) put(FT::kRopeDim / 8 + rope_chunk(q, k, row), dead ? z : raw[kUF + k]);
  }
  // FP8 units dealt one row per warp (V3.2's 32 FP8 chunks per row, row-major
  // dealing: c = lane), stores in full phases (PHASES: the 16-head mma.sync
  // tile, -2..3% at 8-16 heads x >= 64 tokens; the 32-head tile measured +3..4%
  // with it, seventeenth session): see store_units.
  static constexpr bool kPhaseSwap = PHASES && kFp8 && SPLIT && !kRuns && kNF == 32 && kThreads % 32 == 0;
  template <bool SKIP, bool FAST>
  __device__ __forceinline__ void store_units(uint16_t* K, int kst, float* ksc, int tid, int live) const {
    const int zero_end = (live + 15) & ~15;
    const uint4 z = make_uint4(0u, 0u, 0u, 0u);
    // Every row's scales, zero past `live` (the products read up to zero_end;
    // the softmax's P copies read all BN columns, those past zero_end unused).
    if constexpr (kScaled && kRowScales)
      ksc[(tid & 3) * BN + (tid >> 2)] = (SKIP && (tid >> 2) >= live) ? 0.f : bits_to_float(sraw[0]);
#pragma unroll
    for (int k = 0; k < kUF; ++k) {
      int row, c;
      if (!unit<kUnitsF, kNF, kRuns>(tid, k, row, c)) continue;
      if (SKIP && row >= zero_end) continue;
      uint16_t* krow = K + size_t(row) * kst;
      if (!kFp8) {
        *reinterpret_cast<uint4*>(krow + 8 * c) = (SKIP && row >= live) ? z : raw[k];
        continue;
      }
      if (!SPLIT && c >= FT::kFp8Chunks) {
        *reinterpret_cast<uint4*>(krow + FT::kRopeDim + 8 * (c - FT::kFp8Chunks)) =
            (SKIP && row >= live) ? z : raw[k];
        continue;
      }
      if (SKIP && row >= live) {
        if (kScaled && !kRowScales && (c & 7) == 0) ksc[(c >> 3) * BN + row] = 0.f;
        *reinterpret_cast<uint4*>(krow + 16 * c) = z;
        *reinterpret_cast<uint4*>(krow + 16 * c + 8) = z;
        continue;
      }
      uint4 lo, hi;
      if constexpr (kPhaseSwap) {
        // A store phase (8 lanes) holds chunks c = 8 m .. 8 m + 7 of one row,
        // whose low halves lie on 16-byte slots 2 c (4 distinct of 8 mod 128
        // bytes: 2-way conflicts) and high halves on 2 c + 1. Lanes with c & 4
        // dequantise and store their high half first (the raw words swapped),
        // so each of the two stores covers 8 slots.
        const bool sw = (c & 4) != 0;
        dequant_unit<FAST>(k, c, row, ksc, lo, hi, sw);
        *reinterpret_cast<uint4*>(krow + 16 * c + (sw ? 8 : 0)) = lo;
        *reinterpret_cast<uint4*>(krow + 16 * c + (sw ? 0 : 8)) = hi;
      } else {
        dequant_unit<FAST>(k, c, row, ksc, lo, hi);
        *reinterpret_cast<uint4*>(krow + 16 * c) = lo;
        *reinterpret_cast<uint4*>(krow + 16 * c + 8) = hi;
      }
    }
#pragma unroll
    for (int k = 0; k < kUR; ++k) {
      int row, c;
      if (!unit<kUnitsR, kNRd>(tid, k, row, c)) continue;
      if (SKIP && row >= zero_end) continue;
      *reinterpret_cast<uint4*>(K + size_t(row) * kst + FT::kRopeDim + 8 * c) =
          (SKIP && row >= live) ? z : raw[kUF + k];
    }
  }

  // The same into the swizzled K tile of the warpgroup kernels (swz_chunk),
  // where every row past `live` gets zeros, and kScaled zero scales (their
  // products multiply every row: a stale or unwritten scale times a zero
  // probability could be NaN).
  // WHOLE: each 16-byte chunk stored by one instruction (st_shared16).
  template <bool WHOLE>
  __device__ __forceinline__ void store_swizzled(uint16_t* K, float* ksc, int tid, int live) const {
    if (fast_dequant_ok()) {
      store_swizzled_dq<WHOLE, kFastDq>(K, ksc, tid, live);
    } else {
      store_swizzled_dq<WHOLE, false>(K, ksc, tid, live);
    }
  }
  template <bool WHOLE, bool FAST>
  __device__ __forceinline__ void store_swizzled_dq(uint16_t* K, float* ksc, int tid, int live) const {
    auto put = [&](int row, int ch, const uint4& v) {
      uint16_t* dst = swz_chunk<true, BN>(K, 0, row, ch);
      if (WHOLE) {
        st_shared16(dst, v);
      } else {
        *reinterpret_cast<uint4*>(dst) = v;
      }
    };
    if constexpr (kQuarters) {
      // Row quarters: every store phase (8 lanes: 4 chunks of a row pair) hits 8
      // slots, the pair's rows having opposite swizzle parity.
      const int row = quarter_row(tid);
      store_quarter_row<FAST>([&](int ch, const uint4& v) { put(row, ch, v); }, ksc, tid, row >= live);
    } else {
      store_swizzled_units<FAST>(put, ksc, tid, live);
    }
  }
  template <bool FAST, class PUT>
  __device__ __forceinline__ void store_swizzled_units(const PUT& put, float* ksc, int tid, int live) const {
    const uint4 z = make_uint4(0u, 0u, 0u, 0u);
    if constexpr (kScaled) {  // (V3.2 rows take the row-quarter branch of store_swizzled)
      static_assert(kRowScales, "the warpgroup kernels load V3.2 scales by row");
      ksc[(tid & 3) * BN + (tid >> 2)] = (tid >> 2) < live ? bits_to_float(sraw[0]) : 0.f;
    }
#pragma unroll
    for (int k = 0; k < kUF; ++k) {
      int row, c;
      if (!unit<kUnitsF, kNF, kRuns>(tid, k, row, c)) continue;
      if (!kFp8) {
        put(row, c, row >= live ? z : raw[k]);
        continue;
      }
      if (!SPLIT && c >= FT::kFp8Chunks) {
        put(row, FT::kRopeDim / 8 + (c - FT::kFp8Chunks), row >= live ? z : raw[k]);
        continue;
      }
      uint4 lo = z, hi = z;
      if (row < live) dequant_unit<FAST>(k, c, row, ksc, lo, hi);
      put(row, 2 * c, lo);
      put(row, 2 * c + 1, hi);
    }
#pragma unroll
    for (int k = 0; k < kUR; ++k) {
      int row, c;
      if (!unit<kUnitsR, kNRd>(tid, k, row, c)) continue;
      put(row, FT::kRopeDim / 8 + c, row >= live ? z : raw[kUF + k]);
    }
  }

  // FP8 unit k (chunk c of row `row`) dequantised into two 16-byte bf16 chunks;
  // kScaled: its fp32 scale goes to ksc instead (the raw values are exact in bf16).
  // Invalid rows: raw bytes and scale bits are 0 -> +0 * 2^-127 = 0.
  // swap: the chunk's two halves exchanged (hi dequantised into lo and back).
  // FAST (kFastDq, fast_dequant_ok()): dequant4_ue8m0_fast, the same bits.
  template <bool FAST = false>
  __device__ __forceinline__ void dequant_unit(int k, int c, int row, float* ksc, uint4& lo, uint4& hi,
                                               bool swap = false) const {
    // V4 row quarters: unit k's scale is byte k of the row's 8 scale bytes.
    // V3.2 with kRowScales or quarters: the scale went to ksc in store, sb unused.
    uint32_t sb = 0u;
    if constexpr (kQuarters && kLayout == KvFormat::kFP8DsMlaV4) {
      sb = k < 4 ? sraw[0] >> (8 * k) : sraw[1] >> (8 * (k - 4));
    } else if constexpr (!kQuarters && !kRowScales) {
      sb = sraw[kFp8 ? k : 0];
    }
    if constexpr (FAST) {
      static_assert(!FAST || kFastDq, "fast dequantisation: V4 e4m3fn rows in row quarters");
      uint4 r = raw[k];
      if (swap) r = make_uint4(r.z, r.w, r.x, r.y);
      dequant16_fast(r, ue8m0_bf16x2_multiplier(sb, 0), lo, hi);
      return;
    }
    float sc;
    if (kLayout == KvFormat::kFP8DsMlaV4) {
      sc = ue8m0_to_float(uint8_t(sb));
    } else {
      if (!kRowScales && !kQuarters && (c & 7) == 0) ksc[(c >> 3) * BN + row] = bits_to_float(sb);
      sc = 1.f;
    }
    uint4 r = raw[k];
    if (swap) r = make_uint4(r.z, r.w, r.x, r.y);
    dequant16<kv_is_fnuz(F), !kScaled>(r, sc, lo, hi);
  }


};

// Index of effective position k (in [p_lo, p_hi)) of token t: main set for
// k < em, extra set after. Returns -1 past the split end.
__device__ __forceinline__ int32_t load_index(const SparseDecodeParams& p, int64_t t, int64_t k,
                                              int64_t em, int64_t p_hi) {
  if (k >= p_hi) return -1;
  if (k < em) return p.main.indices[t * p.main.indices_stride_token + k];
  return p.extra.indices[t * p.extra.indices_stride_token + (k - em)];
}

// Asymmetric kernels: the validity bits of the 64 rows of a row-address slot
// (threads 0-63 call it together), one 32-bit word per 32 rows (a 64-lane
// wavefront's ballot holds both words).
__device__ __forceinline__ void valid_mask_store(uint32_t* vmask, int slot, bool valid, int tid) {
  const lane_mask_t b = MLA_EXT_BALLOT(valid);
  if ((tid & 31) == 0) vmask[2 * slot + (tid >> 5)] = uint32_t(b >> (tid & (kWarpSize - 32)));
}

template <KvFormat F>
__device__ __forceinline__ void row_address(const SparseDecodeParams& p, int64_t k, int64_t em, int32_t idx,
                                            const uint8_t*& data, const uint8_t*& scale) {
  data = nullptr;
  scale = nullptr;
  const KvSet& set = k < em ? p.main : p.extra;
  if (idx < 0 || int64_t(idx) >= set.num_slots) return;
  const uint32_t ps = uint32_t(set.page_size);
  const uint32_t page = uint32_t(idx) / ps;
  const uint32_t off = uint32_t(idx) - page * ps;
  const uint8_t* base = set.cache + int64_t(page) * set.page_stride_bytes;
  if (kv_layout(F) == KvFormat::kFP8DsMlaV4) {
    data = base + int64_t(off) * kFP8DsMlaV4DataBytes;
    scale = base + int64_t(ps) * kFP8DsMlaV4DataBytes + int64_t(off) * kFP8DsMlaV4ScaleBytes;
  } else {
    data = base + int64_t(off) * set.token_stride_bytes;
  }
}


// ---- the split kernel body ----
// WG (sm_90a, 64-head tile, every format): Q.K and P.V as warpgroup MMAs
// straight from shared memory (decode_split_mma_kernel).
// sub (the one-token bodies only; a compile-time -1 everywhere but below): >= 0 makes the block
// serve token 2 b + sub of a two-token grid (decode_split_mma_kernel's TWO fallback).
template <int MT, int DQK, KvFormat F, bool MMA, bool BAL, bool WG = false, bool ASYM = false, bool TWO = false,
          bool QREG = false, bool ANCH = false, bool CL = false, bool RAW = false>
__device__ __forceinline__ void decode_body(const DecodeArgs& a, int sub = -1) {
  constexpr bool SC = kv_layout(F) == KvFormat::kFP8DsMla;  // scales applied after the products
  static_assert(!CL || (ASYM && SC && !BAL && !TWO), "2-block clusters: the asymmetric fp8_ds_mla kernel, uniform map");
  static_assert(!ANCH || (BAL && !TWO && !QREG), "anchored map: the balanced kernels");
  static_assert(!ASYM || (WG && DQK == (SC ? 576 : 512) && !(SC && BAL)),
                "asymmetric warpgroups: the 64-head tile of the V4 rows, or of fp8_ds_mla's (uniform map)");
  static_assert(!TWO || (ASYM && !BAL && !SC), "two-token blocks: the asymmetric V4 kernel, uniform map");
  // A16: the asymmetric tile at 16 heads (transposed products; the ASYM branch below).
  constexpr bool A16 = ASYM && MT == 1;
  static_assert(!A16 || ((kv_layout(F) == KvFormat::kFP8DsMlaV4 || (SC && !BAL)) && !TWO && !CL && !QREG && !ANCH),
                "the asymmetric 16-head tile: FP8 rows (fp8_ds_mla on the uniform map), one token per block, "
                "not the anchored map");
  using C = Cfg<MT, DQK, MMA, SC, WG, decode_two_stages(F, DQK, WG, BAL) || ASYM, ASYM>;
  // Warpgroup MMA descriptors by one add per step (wg_desc_add), except in the
  // symmetric kernels of bf16 caches, which then spill (ptxas: 24 -> 124 bytes
  // at d_qk 512, 72 -> 220 at 576; the FP8 kernels' counts are unchanged).
  constexpr bool kDescAdd = ASYM || kv_layout(F) != KvFormat::kBF16;
  // Whole, conflict-free 16-byte K stores (st_shared16, Gather's PAIRED runs) in
  // the warpgroup kernels of the uniform split map: H200, 64-128 heads x 512
  // tokens -3..-7%. Not in the balanced map's (252 registers): there they cost
  // +2..4% (C128 at 16-64 tokens), likely from the 4-register groups the whole
  // stores need (not verified). The anchored 64-head kernel (257-512 tokens, each
  // block most often a whole row, as under the uniform map) has them: without them
  // (and kPairs) its blocks on rows of equal length ran 5-8% longer than the uniform
  // kernel's (H200, thirty-ninth session, 64-128 heads x 264-512 tokens).
  constexpr bool kWholeK = WG && (!BAL || ANCH);
  // Row quarters (Gather): V4 rows in the padded K tile of the mma.sync kernels
  // and the swizzled one of the warpgroup kernels; V3.2 rows in the warpgroup
  // kernels only. H200, V3.2, same-session A/B: 64-128 heads x 64-128 tokens
  // -8..-9%, but the 16-head mma.sync tile +5% at 64-128 tokens (-4% at one
  // token), so it keeps the row-major dealing (benchmarks/NOTES.md, fifteenth
  // session).
  constexpr bool kQuartersK =
      MMA && (kv_layout(F) == KvFormat::kFP8DsMlaV4 || (WG && kv_layout(F) == KvFormat::kFP8DsMla));
  using G = Gather<F, DQK, C::BN, !(SC && MT == 4 && !WG), kWholeK, kQuartersK, WG, MMA && !WG && MT == 1, ASYM && SC && !A16>;
  constexpr int HTp = C::HTp, BN = C::BN, KST = C::KST, SST = C::SST, PST = C::PST;
  constexpr int TPR = C::TPR, CPT = C::CPT;
  static_assert(!SC || MT > 2 || TPR % 2 == 0, "SC P-pair writes need an even number of threads per softmax row");
  MLA_EXT_DYNAMIC_SMEM(smem_base);
  // The swizzled layout needs 1024-byte aligned regions: round the base up
  // (kAlignPad spare bytes are allocated for this).
  uint8_t* const smem = smem_base + (WG ? ((1024u - (smem_addr(smem_base) & 1023u)) & 1023u) : 0u);
  uint16_t* Ks = reinterpret_cast<uint16_t*>(smem + C::kOff);
  uint16_t* Qs = reinterpret_cast<uint16_t*>(smem + C::qOff);
  float* Ss = reinterpret_cast<float*>(smem + C::sOff);
  uint16_t* Ps = reinterpret_cast<uint16_t*>(smem + C::pOff);
  float* alpha_s = reinterpret_cast<float*>(smem + C::aOff);
  float* inv_s = reinterpret_cast<float*>(smem + C::invOff);
  const uint8_t** meta_d = reinterpret_cast<const uint8_t**>(smem + C::metaOff);  // [kMetaSlots][BN]
  const uint8_t** meta_s = meta_d + C::kMetaSlots * BN;                            // [kMetaSlots][BN]
  uint32_t* const vmask = reinterpret_cast<uint32_t*>(smem + C::vmOff);             // ASYM: [kMetaSlots][2]
  float* ksc = reinterpret_cast<float*>(smem + C::scOff);                          // [4][BN] (SC)

  const SparseDecodeParams& p = a.p;
  const int tid = threadIdx.x;
  const int HG = a.head_groups;
  const int S = p.num_splits;
  uint32_t bid = blockIdx.x;
  const int hg = int(bid % uint32_t(HG));
  bid /= uint32_t(HG);
  // This block's split slot q = t * S + s; under the uniform map token t owns
  // slots [t * S, t * S + S), under the balanced one the block finds the owner.
  int s = int(bid % uint32_t(S));
  int64_t t = int64_t(bid / uint32_t(S));
  // Two-token blocks (TWO, a separate instantiation: one split, uniform map): tokens
  // 2 bid and 2 bid + 1 walk their tiles one after the other through one pipeline.
  if constexpr (TWO) {
    t *= 2;
  } else if (sub >= 0) {
    t = 2 * t + sub;
    if (t >= p.num_tokens) return;
  }
  int ns = S;            // splits of the token
  int64_t q0 = t * S;    // its first slot
  // ANCH (the anchored map, decode_active_slack; a separate instantiation): block q < T runs
  // token q's first split and learns its split count after its first loads are out
  // (first_split below); the others find their owner first, as under the balanced map.
  bool first_split = false;
  // BAL: the balanced map (a separate instantiation, so that uniform calls run
  // a kernel without its prologue; V4 formats only, decode_balanced).
  if constexpr (ANCH) {
    const int64_t q = t * S + s;
    if (q >= a.active.live_slots) return;  // no bucket uses it
    if (q < p.num_tokens) {
      t = q;
      s = 0;
      ns = 1;  // (for the index guess below: split 0 starts at position 0 whatever the count)
      first_split = true;
    } else {
      int64_t owner;
      if (!balanced_slot_owner<kThreads, true>(p, a.active, q, &owner, &q0, &ns,
                                               reinterpret_cast<int64_t*>(smem + C::sOff), &s))
        return;  // idle
      t = owner;
    }
  } else if constexpr (BAL) {
    // Slots no bucket of the active splits uses: nothing to do, nothing to wait for.
    if (a.active.on() && t * S + s >= a.active.live_slots) return;
    int64_t owner;
    if (!balanced_slot_owner<kThreads>(p, a.active, t * S + s, &owner, &q0, &ns,
                                       reinterpret_cast<int64_t*>(smem + C::sOff))) {
      return;  // idle slot: nothing to compute, no workspace cell of its own
    }
    s = int(t * S + s - q0);
    t = owner;
    // The reduce's token map (sparse_mla_decode.h workspace layout): written by the token's
    // first split, head group 0.
    if (s == 0 && hg == 0 && tid == 0) a.ws_map[t] = make_uint2(uint32_t(q0), uint32_t(ns));
  }
  const int64_t H = p.num_heads;
  const int64_t h0 = int64_t(hg) * a.head_tile;
  const int nh = int((H - h0) < a.head_tile ? (H - h0) : a.head_tile);

  // A split's first tile of indices is loaded beside the lengths instead of
  // after them (one memory round trip fewer before the first gather), at the
  // positions the split starts at when both index sets are full (its range of
  // the widths' sum), and used where the lengths confirm it: both sets full, or
  // split 0's main-set rows (split 0 starts at position 0 whatever the
  // lengths). FP8 tensor-core kernels only (the bf16-cache ones spilled 4-24
  // more bytes with split 0's part). kSpecAll: every split, not only split 0;
  // not in the V3.2 kernels (48-168 bytes of spills with it, even with nothing
  // of the guess but the index kept live) nor the two-token ones (8 bytes; one
  // split there anyway), nor the asymmetric warpgroup kernels (64-head tiles,
  // mostly many-token calls: 128 heads x 128 tokens was 2.5-3% slower with it on
  // the H200, its schedule moved at ~2,000 of 6,300 instructions; split 0's part
  // costs nothing there).
  constexpr bool kSpecAll = !SC && !TWO && !ASYM;
  const bool spec = MMA && kv_layout(F) != KvFormat::kBF16 && tid < BN && (kSpecAll || s == 0);
  auto full_width = [&](const KvSet& set) -> int64_t { return set.cache != nullptr && set.width > 0 ? set.width : 0; };
  // The guessed start in the 32-bit arithmetic of decode_split_range (every real
  // call: fewer than 2^23 positions, at most kMaxSplits splits; no guess
  // otherwise), and one load through a selected pointer. The 64-bit form (a
  // second decode_split_range and a branch per set, c7478c8) cost 1-3% at 8-16
  // heads x 64-128 tokens on the H200 against this one: its prologue reshuffled
  // the tile loop's schedule.
  const int64_t wm_g = full_width(p.main), e_g = wm_g + full_width(p.extra);
  const bool g_ok = !kSpecAll || (e_g < (int64_t(1) << 23) && ns <= kMaxSplits);
  int32_t idx_spec = -1;
  if (spec && g_ok) {
    const uint32_t lo_g = kSpecAll ? uint32_t(e_g) * uint32_t(s) / uint32_t(ns) : 0u;
    const int64_t k = int64_t(lo_g) + tid;
    const int32_t* ip = k < wm_g ? p.main.indices + t * p.main.indices_stride_token + k
                                 : p.extra.indices + t * p.extra.indices_stride_token + (k - wm_g);
    if (k < (kSpecAll ? e_g : wm_g)) idx_spec = *ip;
  }
  int64_t em, ee;
  effective_lens(p.main, p.extra, t, &em, &ee);
  // The second token of a two-token block: its lengths (one split: positions [0, E1)).
  const bool two = TWO && t + 1 < p.num_tokens;
  int64_t em1 = 0, ee1 = 0;
  if (two) effective_lens(p.main, p.extra, t + 1, &em1, &ee1);
  const int64_t E1 = em1 + ee1;
  const int64_t E = em + ee;
  if constexpr (ANCH) {
    // A token's first split: its first index tile (the guess above) and lengths are in flight
    // while the block works out the token's split count and first cell (its Q goes out after,
    // asynchronously, as in every block: off the index -> address -> gather chain).
    if (first_split) {
      int64_t owner;
      int s0;
      balanced_slot_owner<kThreads, true>(p, a.active, t, &owner, &q0, &ns,
                                          reinterpret_cast<int64_t*>(smem + C::sOff), &s0);
      if (tid == 0 && hg == 0) a.ws_map[t] = make_uint2(uint32_t(q0), uint32_t(ns));  // the reduce's token map
    }
  }
  int64_t p_lo, p_hi;
  decode_split_range(E, s, ns, &p_lo, &p_hi);
  const int ntiles = int((p_hi - p_lo + BN - 1) / BN);
  // Rows of the last tile (1..BN). The balanced kernel counts a tile's rows from
  // this 32-bit value (with the 64-bit split length live in the loop its MT=1
  // instance spilled 8 bytes); the others from the split range (V3.2's MT=1
  // instance spills 40 bytes the other way round).
  const int last_rows = int(p_hi - p_lo - int64_t(ntiles - 1) * BN);
  // Tiles of the block: token t's 0 .. ntiles - 1, then (two) token t + 1's.
  const int nt1 = int((E1 + BN - 1) / BN);
  const int NT = ntiles + nt1;
  // Global tile g: its index load and row address for this thread (tid < BN).
  auto g_second = [&](int gt) { return TWO && gt >= ntiles; };
  auto g_index = [&](int gt) -> int32_t {
    if (g_second(gt)) return load_index(p, t + 1, int64_t(gt - ntiles) * BN + tid, em1, E1);
    return load_index(p, t, p_lo + int64_t(gt) * BN + tid, em, p_hi);
  };
  auto g_address = [&](int gt, int32_t idx, int slot) {
    if (g_second(gt)) {
      row_address<F>(p, int64_t(gt - ntiles) * BN + tid, em1, idx, meta_d[slot * BN + tid], meta_s[slot * BN + tid]);
    } else {
      row_address<F>(p, p_lo + int64_t(gt) * BN + tid, em, idx, meta_d[slot * BN + tid], meta_s[slot * BN + tid]);
    }
  };

  // (a two-token block whose first token has no rows starts with the second's Q)
  const uint16_t* qt = p.q + (two && ntiles == 0 ? t + 1 : t) * p.q_stride_token + h0 * p.q_stride_head;

  // Q tile -> shared (tensor-core path), zero rows past the head tile. The
  // copies are asynchronous (no register round trip, every load in flight at
  // once) and overlap the index / address / first-gather latency chain; they
  // are waited for before the first barrier of the tile loop.
  if constexpr (RAW) {
    // (raw_q_word's interleaved layout: 4-byte copies, 16 per thread)
    static_assert(HTp == 16 && DQK == 512 && size_t(8) * kRawQPairUnits * 16 <= size_t(HTp) * KST * 2, "RAW Q layout");
#pragma unroll 4
    for (int u = tid; u < HTp * (DQK / 2); u += kThreads) {
      const int r = u / (DQK / 2), d = 2 * (u - r * (DQK / 2));
      uint32_t* const dst = reinterpret_cast<uint32_t*>(Qs) + raw_q_word(r, d);
      if (r < nh) {
        copy4_async(dst, qt + int64_t(r) * p.q_stride_head + d);
      } else {
        *dst = 0u;
      }
    }
  } else if (MMA) {
    constexpr int QCH = DQK / 8;
#pragma unroll 4
    for (int u = tid; u < HTp * QCH; u += kThreads) {
      const int r = u / QCH, c = u - (u / QCH) * QCH;
      if constexpr (WG) {
        uint16_t* dst = swz_chunk<true, HTp>(Qs, KST, r, c);
        if (r < nh) {
          copy16_async(dst, qt + int64_t(r) * p.q_stride_head + 8 * c);
        } else {
          *reinterpret_cast<uint4*>(dst) = make_uint4(0u, 0u, 0u, 0u);
        }
      } else if (r < nh) {
        copy16_async(Qs + r * KST + 8 * c, qt + int64_t(r) * p.q_stride_head + 8 * c);
      } else {
        *reinterpret_cast<uint4*>(Qs + r * KST + 8 * c) = make_uint4(0u, 0u, 0u, 0u);
      }
    }
  }

  // Softmax row ownership: row = tid / TPR (fixed for the whole block), running m, l.
  const int srow = tid / TPR, ssub = tid % TPR;
  // row_l sums the probabilities as the P.V product sees them (bf16 on the
  // tensor-core path), so the output's normaliser matches its numerator;
  // row_le sums them unrounded, for the lse.
  float row_m = neg_inf(), row_l = 0.f, row_le = 0.f;

  // Accumulators.
  constexpr int kAcc = MMA ? MT * 8 * 4 : (HTp / 4) * 8;
  float acc[kAcc];
#pragma unroll
  for (int i = 0; i < kAcc; ++i) acc[i] = 0.f;

  // CL (2-block clusters): rank r of the pair gathers rows 32 r .. 32 r + 31 of every tile,
  // all by its warpgroup 1 (the 256-thread row-quarter dealing's virtual threads 128 r ..
  // 128 r + 127), into its own stage; one thread of warpgroup 1 then copies their value dims
  // 0-511 and scale rows on to the peer's stage (cp.async.bulk: 8 x 4 KB of K, 7 x 128 B of
  // scales) completing on the peer's FULLR[s]. The RoPE dims (512-575, the block that P
  // overwrites after Q.K) are not copied: warpgroup 1 loads those of the peer's 32 rows as well
  // (2 x 16 B per thread), so that no copy reads the block P goes to. A copy's completion is
  // seen only by the receiver (FULLR), so the sender learns that its source was read from the
  // peer's release of the stage (this block's EMPTYR[s], arrived by the peer's 8 warps once done
  // with the tile, hence after its FULLR): warpgroup 1 waits for it before storing the next
  // tile into the stage, and its copy into the peer's stage needs the same release.
  // Warpgroup 0 gathers nothing: its store phase leaves the Q.K -> softmax -> P.V chain.
  const uint32_t crank = CL ? cluster_rank() : 0u, peer = crank ^ 1u;
  const uint32_t mbar = smem_addr(smem + C::mbOff);
  auto fullr = [&](int st) { return mbar + uint32_t(8 * st); };        // FULLR[st]
  auto emptyr = [&](int st) { return mbar + uint32_t(16 + 8 * st); };  // EMPTYR[st]
  if constexpr (CL) {
    if (tid == 0) {
      for (int st = 0; st < 2; ++st) {
        mbar_init(fullr(st), 1);   // the peer's rows (1 arrival + their bytes)
        mbar_init(emptyr(st), 8);  // the peer's 8 warps are done with its stage st
      }
      fence_mbar_init();
    }
    cluster_sync();  // barriers initialised, the peer running
  }
  // CL: rows 32 r .. 32 r + 31 of this block's stage st (value dims and scale rows) to the peer's
  // stage st, completing on the peer's FULLR[st]. One thread, after the rows' stores and proxy fences.
  auto copy_rows_cl = [&](int st) {
    if constexpr (CL) {
      const int row0 = int(32 * crank);
      const uint32_t fr = cluster_map(fullr(st), peer);
      constexpr uint32_t kRowBytes = 32 * 128, kScBytes = 32 * 4;
      mbar_arrive_expect_tx_remote(fr, 8 * kRowBytes + 7 * kScBytes);
      const uint32_t kb = smem_addr(Ks + st * (C::kStageBytes / 2)) + uint32_t(row0 * 128);
#pragma unroll
      for (int b = 0; b < 8; ++b) {
        const uint32_t src = kb + uint32_t(b * BN * 128);
        bulk_copy_to_peer(cluster_map(src, peer), src, kRowBytes, fr);
      }
      const uint32_t sb = smem_addr(ksc + st * C::kScaleRows * BN) + uint32_t(row0 * 4);
#pragma unroll
      for (int e = 0; e < 7; ++e) {
        const uint32_t src = sb + uint32_t(e * BN * 4);
        bulk_copy_to_peer(cluster_map(src, peer), src, kScBytes, fr);
      }
    }
  };
  G g;
  // kRawQK (RAW: V4 rows in the 16-head mma.sync tile, where decode_raw_qk says so, on every
  // map; not the QREG instance): Q.K's key fragments come straight from the gathered
  // registers instead of the dequantised tile in shared memory. Each thread loads exactly the
  // bytes its B fragments need: warp w (kg = w / 2, dh = w % 2: a tile of <= 32 live rows keeps
  // warps 0-3 busy, one per scheduler; with kg = w % 4 its dequantisation ran on two of the four,
  // +4% at one token) takes key rows kg * 16 + lane / 4 and that + 8 over
  // its k-steps, which lane quarter q = lane % 4 of a quad fills with 4 dims of each row:
  // dh 0 takes FP8 groups 0-3 (16-byte chunk 4 g + q of group g: 16 dims, 4 k-steps) and
  // RoPE k-step 0, dh 1 groups 4-6 and RoPE k-steps 1-3 (8 bytes at RoPE byte 32 e + 8 q:
  // dims 16 e + 4 q ..); 18 words per row and thread, each load instruction reading 32 or
  // 64 contiguous bytes of 8 rows. Inside a k-step the quad's dims are permuted (lane q's
  // 4 dims at fragment positions 2 q, 2 q + 1, 2 q + 8, 2 q + 9), and Q's alike: its A
  // fragments are lane q's own dims of head rows lane / 4 and + 8, plain 16- or 8-byte
  // shared loads (conflict-free for the FP8 chunks at the row stride KST).
  // The dequantised values are also stored into the K tile for P.V, as before; Q.K no
  // longer reads that tile (64 of the ~290 KB a tile moved through shared memory) nor
  // waits for the barrier after the store, and the barrier after Q.K goes. The registers
  // hold one tile, so tile j + 1's loads leave after tile j's Q.K (before the barrier; their
  // addresses are written a tile earlier, after the softmax, so that they are visible then):
  // later than the other tile's, which loads before its Q.K. Loads issued chunk by chunk
  // inside Q.K as the words free up measured +13..+57% (H100), and in two batches (the
  // first FP8 chunks inside Q.K once used, the rest after it) +2..+6%: likely the loads and
  // Q's shared loads then share scoreboards, so Q.K waits on global memory (not verified).
  // The anchored instance spills 12 / 24 bytes (sm_90a; its map's state) and measured
  // -4..-5% at C128 x 300-512 tokens (H100, fifty-eighth session).
  static_assert(!RAW || (MMA && MT == 1 && !SC && !WG && !ASYM && !QREG && !TWO &&
                         kv_layout(F) == KvFormat::kFP8DsMlaV4),
                "Q.K from the gathered registers: the 16-head V4 mma.sync tile (not QREG)");
  constexpr bool kRawQK = RAW;
  uint32_t rw[kRawQK ? 2 : 1][kRawQK ? 18 : 1];  // words of the thread's two rows
  uint32_t rqs[kRawQK ? 2 : 1];                  // their scale bytes of dh's groups
  // First dim of quarter q's piece of FP8 chunk g4 of half DH (16 dims, one byte each: also its
  // byte in the row), and of its RoPE k-step e (4 dims, two bytes each).
  auto rq_fp8_dim = [](int DH, int g4, int q) { return 64 * (4 * DH + g4) + 16 * q; };
  auto rq_rope_dim = [](int DH, int e, int q) { return G::FT::kRopeDim + 16 * (DH + e) + 4 * q; };
  // This thread's words of its two rows of a tile (data / scale: the tile's row-address
  // slot); rows at or past `live_n` and rows without an address load nothing: zeros.
  auto rq_load = [&](const uint8_t* const* data, const uint8_t* const* scale, int live_n) {
    if constexpr (kRawQK) {
      const int lane = tid & 31, w = tid >> 5, q = lane & 3, dh = w & 1;
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int row = (w >> 1) * 16 + 8 * i + (lane >> 2);
#pragma unroll
        for (int k = 0; k < 18; ++k) rw[i][k] = 0u;
        rqs[i] = 0u;
        const uint8_t* const d = row < live_n ? data[row] : nullptr;
        if (d == nullptr) continue;
        rqs[i] = *reinterpret_cast<const uint32_t*>(scale[row] + 4 * dh);
        // (dh as a constant: the words' indices must be, or rw goes to local memory)
        auto words = [&](auto dhc) {
          constexpr int DH = decltype(dhc)::value, NF = DH == 0 ? 4 : 3, NE = DH == 0 ? 1 : 3;
#pragma unroll
          for (int g4 = 0; g4 < NF; ++g4) {
            const uint4 v = *reinterpret_cast<const uint4*>(d + rq_fp8_dim(DH, g4, q));
            rw[i][4 * g4] = v.x; rw[i][4 * g4 + 1] = v.y; rw[i][4 * g4 + 2] = v.z; rw[i][4 * g4 + 3] = v.w;
          }
#pragma unroll
          for (int e = 0; e < NE; ++e) {
            const uint2 v = *reinterpret_cast<const uint2*>(d + G::FT::kRopeByte +
                                                             2 * (rq_rope_dim(DH, e, q) - G::FT::kRopeDim));
            rw[i][4 * NF + 2 * e] = v.x;
            rw[i][4 * NF + 2 * e + 1] = v.y;
          }
        };
        if (dh == 0) {
          words(std::integral_constant<int, 0>());
        } else {
          words(std::integral_constant<int, 1>());
        }
      }
    }
  };
  // Q.K of this warp's 16 key rows over its k-steps from rw into its S copy (Ss + dh
  // copies), and the values dequantised into the K tile (rows below zero_end; zeros at and
  // past `live`, whose words were not loaded).
  auto rq_qk_store = [&](int live) {
    if constexpr (kRawQK) {
      const int lane = tid & 31, w = tid >> 5, q = lane & 3, kg = w >> 1, dh = w & 1, rr = lane >> 2;
      if (kg * 16 >= live) return;  // no live row: nothing stored or read (the softmax masks)
      const int zero_end = (live + 15) & ~15;
      float c2[2][4];
#pragma unroll
      for (int i = 0; i < 2; ++i) c2[i][0] = c2[i][1] = c2[i][2] = c2[i][3] = 0.f;
      // Q's fragments: one 16-byte load each (raw_q_word's layout). The lane's FP8 units are
      // 16 (4 DH + g4) + 4 q + 2 h + half, swizzled: bit 1 ^= bit 3 = q's bit 1, i.e. h ^ qb;
      // its RoPE units 112 + 4 (DH + e) + q (kRopeDim 448), bit 1 ^= bit 1 of DH + e. Per-lane bases, so that
      // the loads take constant offsets.
      const uint32_t* const qp = reinterpret_cast<const uint32_t*>(Qs) + rr * (4 * kRawQPairUnits);
      const int qb = (q >> 1) & 1;
      const uint32_t* const qf[2] = {qp + 4 * (4 * q + 2 * qb), qp + 4 * (4 * q + 2 * (qb ^ 1))};
      const uint32_t* const qr[2] = {qp + 4 * q, qp + 4 * (q ^ 2)};
      auto q_frag = [&](const uint32_t* base, int unit, uint32_t (&a)[4]) {
        const uint4 v = *reinterpret_cast<const uint4*>(base + 4 * unit);
        a[0] = v.x; a[1] = v.y; a[2] = v.z; a[3] = v.w;
      };
      auto steps = [&](auto dhc, auto fastc) {
        constexpr int DH = decltype(dhc)::value, NF = DH == 0 ? 4 : 3, NE = DH == 0 ? 1 : 3;
        constexpr bool FAST = decltype(fastc)::value;
        // FP8 chunks, 8 dims (two k-steps) at a time: Q's two head rows, then per row its
        // values dequantised (words 4 g4 + 2 h, + 1), stored and multiplied.
#pragma unroll
        for (int g4 = 0; g4 < NF; ++g4) {
          const int dim0 = rq_fp8_dim(DH, g4, q);
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            uint32_t a0[4], a1[4];
            q_frag(qf[h], 16 * (4 * DH + g4), a0);
            q_frag(qf[h], 16 * (4 * DH + g4) + 1, a1);
#pragma unroll
            for (int i = 0; i < 2; ++i) {
              uint4 kv;
              if constexpr (FAST) {
                const uint32_t m2 = ue8m0_bf16x2_multiplier(rqs[i], g4);
                dequant4_ue8m0_fast(rw[i][4 * g4 + 2 * h], m2, kv.x, kv.y);
                dequant4_ue8m0_fast(rw[i][4 * g4 + 2 * h + 1], m2, kv.z, kv.w);
              } else {
                const float sc = ue8m0_to_float(uint8_t(rqs[i] >> (8 * g4)));
                dequant4<kv_is_fnuz(F), true>(rw[i][4 * g4 + 2 * h], sc, kv.x, kv.y);
                dequant4<kv_is_fnuz(F), true>(rw[i][4 * g4 + 2 * h + 1], sc, kv.z, kv.w);
              }
              const int row = kg * 16 + 8 * i + rr;
              if (row < zero_end) *reinterpret_cast<uint4*>(Ks + row * KST + dim0 + 8 * h) = kv;
              mma16816(c2[i], a0, kv.x, kv.y);
              mma16816(c2[i], a1, kv.z, kv.w);
            }
          }
        }
        // RoPE k-steps (bf16 words as loaded).
#pragma unroll
        for (int e = 0; e < NE; ++e) {
          const int dim0 = rq_rope_dim(DH, e, q);
          uint32_t a[4];
          q_frag(qr[((DH + e) >> 1) & 1], G::FT::kRopeDim / 4 + 4 * (DH + e), a);
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            const uint2 kv = make_uint2(rw[i][4 * NF + 2 * e], rw[i][4 * NF + 2 * e + 1]);
            const int row = kg * 16 + 8 * i + rr;
            if (row < zero_end) *reinterpret_cast<uint2*>(Ks + row * KST + dim0) = kv;
            mma16816(c2[i], a, kv.x, kv.y);
          }
        }
      };
      // The conversion-free dequantisation (dequant4_ue8m0_fast) where the whole warp may take
      // it: e4m3fn, no NaN code in the lanes' FP8 words, every scale byte used <= 134. Rare
      // tiles (NaN codes, scales above 2^7) run the exact general path.
      auto fast_ok = [&](auto dhc) {
        if constexpr (kv_is_fnuz(F)) {
          return false;
        } else {
          constexpr int NF = decltype(dhc)::value == 0 ? 4 : 3;
          FastDequantCheck chk;
#pragma unroll
          for (int i = 0; i < 2; ++i) {
#pragma unroll
            for (int k = 0; k < 4 * NF; ++k) chk.word(rw[i][k]);
            chk.scales(NF == 4 ? rqs[i] : rqs[i] & 0x00ffffffu);  // dh 1: byte 3 is padding
          }
          return MLA_EXT_BALLOT(!chk.ok()) == 0u;
        }
      };
      auto run = [&](auto dhc) {
        if (fast_ok(dhc)) {
          steps(dhc, std::true_type());
        } else {
          steps(dhc, std::false_type());
        }
      };
      if (dh == 0) {
        run(std::integral_constant<int, 0>());
      } else {
        run(std::integral_constant<int, 1>());
      }
      float* Sh = Ss + dh * (HTp * SST);
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int col = (kg * 2 + i) * 8 + q * 2;
        *reinterpret_cast<float2*>(Sh + rr * SST + col) = make_float2(c2[i][0], c2[i][1]);
        *reinterpret_cast<float2*>(Sh + (rr + 8) * SST + col) = make_float2(c2[i][2], c2[i][3]);
      }
    }
  };
  // CL: warpgroup 1 gathers as the 256-thread dealing's virtual threads 0-127 (rows 0-31) of the
  // tile shifted by c32 rows (row addresses, K rows, scale rows and the live count), so that its
  // row arithmetic stays the committed kernel's (a rank-dependent dealing spilled registers).
  const int c32 = CL ? int(32 * crank) : 0;
  // CL (warpgroup 1, virtual thread vt = tid - 128): RoPE chunks 2 q, 2 q + 1 of the peer's row
  // 32 (r ^ 1) + row (row, q: vt's row quarter), loaded with the thread's own rows of the tile
  // (row addresses of slot `slot`) and stored beside them into the stage at K (zeros past `live`).
  uint4 rope_peer[CL ? 2 : 1];
  auto load_rope_peer = [&](int slot, int vt) {
    if constexpr (CL) {
      const int row = G::quarter_row(vt) + 32 * int(peer), q = vt & 3;
      const uint8_t* const d = meta_d[slot * BN + row];
#pragma unroll
      for (int k = 0; k < 2; ++k)
        rope_peer[k] = d != nullptr ? *reinterpret_cast<const uint4*>(d + G::FT::kRopeByte + 16 * G::rope_chunk(q, k, row))
                                    : make_uint4(0u, 0u, 0u, 0u);
    }
  };
  auto store_rope_peer = [&](uint16_t* K, int vt, int live) {
    if constexpr (CL) {
      const int row = G::quarter_row(vt) + 32 * int(peer), q = vt & 3;
#pragma unroll
      for (int k = 0; k < 2; ++k)
        st_shared16(swz_chunk<true, BN>(K, 0, row, G::FT::kRopeDim / 8 + G::rope_chunk(q, k, row)),
                    row >= live ? make_uint4(0u, 0u, 0u, 0u) : rope_peer[k]);
    }
  };
  int32_t idx_next = -1, idx_next2 = -1;
  if (NT > 0) {
    if (tid < BN) {
      const int64_t k = p_lo + tid;
      const bool full = kSpecAll && g_ok && E == e_g;
      const int32_t idx = spec && k < p_hi && (full || (s == 0 && k < em)) ? idx_spec : g_index(0);
      g_address(0, idx, 0);
      if constexpr (ASYM) valid_mask_store(vmask, 0, meta_d[tid] != nullptr, tid);
    }
    __syncthreads();
    if constexpr (CL) {
      if (tid >= 128) {
        g.load(meta_d + c32, meta_s + c32, tid - 128);
        load_rope_peer(0, tid - 128);
      }
    } else if constexpr (kRawQK) {
      rq_load(meta_d, meta_s, BN);  // (rows past the split have no address)
    } else {
      g.load(meta_d, meta_s, tid);
    }
    if (tid < BN) {
      idx_next = g_index(1);
      if (ASYM) idx_next2 = g_index(2);
      if constexpr (kRawQK) {  // tile 1's addresses too (published by the barrier below)
        g_address(1, idx_next, 1);
        idx_next = g_index(2);
      }
    }
  }
  if (MMA) copy_async_wait_all();  // Q tile landed (made visible by the loop's first barrier)
  if constexpr (kRawQK) __syncthreads();  // (its first Q.K comes before that barrier; and tile 1's addresses)

  // Rows of tile jj inside the split (>= 1): the rest are skipped by the
  // dequantisation and the products (MMA path), not just masked. Not for the
  // V3.2 64-head tile, where the extra live state costs 116-208 bytes of spills.
  constexpr bool kSkipRows = MMA && !(SC && MT == 4 && !WG);
  auto live_rows = [&](int jj) {
    return !kSkipRows     ? BN
           : BAL          ? (jj == ntiles - 1 ? last_rows : BN)
           : g_second(jj) ? int((E1 - int64_t(jj - ntiles) * BN) < BN ? (E1 - int64_t(jj - ntiles) * BN) : BN)
                          : int((p_hi - p_lo - int64_t(jj) * BN) < BN ? (p_hi - p_lo - int64_t(jj) * BN) : BN);
  };
  // Two K stages (Cfg::kStages): tile j + 1 is dequantised into stage (j + 1) % 2
  // while the P.V wgmmas of tile j run on stage j % 2, and one barrier per tile
  // goes. Row addresses in three slots (tile j in slot j % 3). Per tile:
  // addresses of tile j + 2, Q.K(j) -> S (in the free stage) | softmax(j) -> P |
  // P.V(j) issued; store(j + 1); loads of tile j + 2; P.V(j) waited for |.
  // Tile 0 is stored here.
  constexpr bool kPipe = C::kStages == 2;  // (ASYM too: its two warpgroups then load tile 1 by halves)
  if constexpr (kPipe) {
    if (NT > 0) {
      if constexpr (CL) {
        if (tid >= 128) {
          g.template store_swizzled<kWholeK>(Ks + c32 * 64, ksc + c32, tid - 128, live_rows(0) - c32);
          store_rope_peer(Ks, tid - 128, live_rows(0));
        }
      } else {
        g.template store_swizzled<kWholeK>(Ks, ksc, tid, live_rows(0));
      }
      fence_proxy_async();  // the K tile and the Q tile are read by the async proxy
      if (tid < BN) {
        g_address(1, idx_next, 1);
        if constexpr (ASYM) {  // and tile 2's (slot 2)
          g_address(2, idx_next2, 2);
          valid_mask_store(vmask, 1, meta_d[BN + tid] != nullptr, tid);
          valid_mask_store(vmask, 2, meta_d[2 * BN + tid] != nullptr, tid);
          idx_next = g_index(3);
        } else {
          idx_next = g_index(2);
        }
      }
      __syncthreads();  // K tile 0 + addresses of tile 1 (ASYM: and 2) visible
      if constexpr (CL) {  // tile 0's rows of this block to the peer
        if (tid == 128) copy_rows_cl(0);
      }
      if (!ASYM && ntiles > 1) g.load(meta_d + BN, meta_s + BN, tid);
    }
  }
  if constexpr (ASYM) {
    // ---- asymmetric warpgroups (ASYM; V4 rows on either split map, fp8_ds_mla rows on the
    // uniform one; two K stages) ----
    // Warpgroup 0: Q.K of the whole tile (64 heads x 64 keys over all 512 dims)
    // into registers, the online softmax on those registers (a row's 16
    // columns per thread, its 4 threads a quad), P into shared memory for
    // warpgroup 1 and straight from its registers into its own P.V (value
    // dims 0-255). Warpgroup 1: the P.V of value dims 256-511, P from shared
    // memory. Each warpgroup gathers half of every tile (rows 32-63 / 0-31, as
    // the virtual threads tid + 128 / tid - 128 of the 256-thread row-quarter
    // dealing): during tile j it dequantises its half of tile j + 1 into the
    // stage tile j - 1 used, while its P.V of tile j runs, then issues the loads
    // of its half of tile j + 2 (one tile of lead). Warpgroup 0's threads
    // tid < 64 compute the row addresses, three tiles ahead (tile j + 3 in slot
    // (j + 3) % 4, during tile j after the store; tiles 1 and 2 in the prologue).
    // Warpgroup 1 stores its half of tile j + 1 early, while warpgroup 0
    // multiplies Q.K(j) and runs the softmax, and its P.V(j) after that.
    // Named barriers, 128 arriving + 128 waiting: FULL[s] (warpgroup 1 stored
    // its half of the tile of stage s), PRDY[s] (P and alpha of tile j, s = j %
    // 2, are in shared memory), FREE[s] (warpgroup 1's P.V of the tile in stage
    // s is done), DONE[s] (warpgroup 0 is done with the tile in stage s: its
    // Q.K and P.V; also publishes the row addresses it wrote during that tile).
    // Pairing over n = ntiles tiles (each generation: one warpgroup's 128
    // arrivals, the other's 128 syncs; an arrive's condition changes only with
    // its sync's, or a thread arrives twice on a live generation / a sync hangs):
    // FULL of tile k = 1..n-1, arrived by warpgroup 1 at j = k - 1, synced by 0 at
    // j = k; PRDY of every tile, same j; FREE and DONE of tile k = 0..n-3, arrived
    // at j = k (FREE by 1, DONE by 0), synced at j = k + 1.
    // fp8_ds_mla rows (SC; d_qk 576, keys exact): the K stages hold value x 2^k per scale
    // group and each stage its own [8][BN] scale rows (ksc_of; Gather's EXPK: the mantissas
    // e_g and the ratios e_g / e_{g + 1}). Warpgroup 0 runs Q.K as one accumulator chain
    // over the four groups, multiplied by the ratios in between (five waits instead of one),
    // keeps P in fp32 and feeds its P.V of groups 0 and 1 with P times that group's e; P
    // goes to shared memory once, unscaled, into the RoPE block of the tile's own stage
    // (dims 512-575, read by nothing after Q.K: no P buffers, so the two 72 KB stages fit
    // beside Q), and warpgroup 1 scales its ldmatrix fragments by e_2 and e_3 before its
    // register-A P.V.
    // CL (V3.2 at 65-128 heads: the pair of blocks of a (token, split)'s two head groups as a
    // 2-block cluster): warpgroup 1 alone gathers this block's 32 rows of every tile (rows 32 r ..;
    // the gh, store and FULL steps above, rows shifted by c32) and one of its threads copies them
    // (but their RoPE dims) into the peer's stage (send_rows_cl), and it loads and stores the
    // RoPE dims of the peer's 32 rows itself; warpgroup 1 waits for the peer's release of the
    // stage (EMPTYR) before storing into it; warpgroup 0 stores nothing and waits on FULLR (the
    // peer's rows) beside FULL at the top of each tile; every warp releases a stage to the peer
    // (EMPTYR) where it arrives on DONE / FREE. The default (decode_use_cluster).
    constexpr int kFull = 1, kPrdy = 3, kFree = 5, kDone = 7;
    constexpr int kWg1 = 11;  // CL: warpgroup 1 alone
    auto ksc_of = [&](int st) -> float* { return ksc + (SC ? st * C::kScaleRows * BN : 0); };
    auto p_of = [&](int st) -> uint16_t* {
      return SC ? Ks + st * (C::kStageBytes / 2) + 8 * BN * 64 : Ps + st * (HTp * PST);
    };
    const int warp = tid / 32, lane = tid % 32, wg = warp >> 2;
    const int r0 = (warp & 3) * 16 + (lane >> 2);  // rows r0, r0 + 8 of this thread's fragments
    // This warpgroup's half of tile j + 1 (loaded during tile j - 1). CL: warpgroup 1's 32 rows
    // of the block's (32 r ..), warpgroup 0 none.
    G gh;
    const int vt = wg == 0 ? tid + 128 : tid - 128;  // virtual thread of the 256-thread dealing
    auto load_half = [&](int slot) {
      if (!CL || wg == 1) {
        gh.load(meta_d + slot * BN + c32, meta_s + slot * BN + c32, vt);
        load_rope_peer(slot, vt);
      }
    };
    // CL (warpgroup 1): before storing tile tl into stage st (tl >= 2), the peer's release of its
    // stage st (there: tile tl - 2), which both lets this block's copy overwrite the peer's stage
    // and says that the copy of tile tl - 2 out of this block's stage st has been read.
    auto wait_peer_release_cl = [&](int st, int tl) {
      if constexpr (CL) {
        if (tl >= 2) mbar_wait_cta(emptyr(st), uint32_t((tl - 2) >> 1) & 1u);
      }
    };
    // CL (warpgroup 1): after the block's rows of a tile are in stage st (and proxy-fenced): all
    // its threads' stores done (warpgroup barrier), then one thread copies them to the peer.
    auto send_rows_cl = [&](int st) {
      if constexpr (CL) {
        named_bar_sync(kWg1, 128);
        if (tid == 128) copy_rows_cl(st);
      }
    };
    // CL: this warp is done with the tile in stage st: the peer may copy into this block's
    // stage st (the peer's EMPTYR[st]).
    auto release_stage_cl = [&](int st) {
      if constexpr (CL) {
        if (lane == 0) mbar_arrive_remote_cta(cluster_map(emptyr(st), peer));
      }
    };
    if (NT > 1) load_half(1);
    float rm[2] = {neg_inf(), neg_inf()}, rl[2] = {0.f, 0.f}, rle[2] = {0.f, 0.f};  // warpgroup 0's rows
    // Two-token blocks: after token t's last tile each warpgroup writes its half of
    // token t's output (value dims 256 wg ..) straight from the fragments, scaled by
    // the rows' 1 / D that warpgroup 0 publishes (INV), and restarts its accumulators.
    // Warpgroup 1 copies token t + 1's Q into the Q tile once it has P of token t's last
    // tile (so warpgroup 0's last Q.K of token t is done), waits for the copies at its
    // boundary and publishes them (QRDY) for Q.K of token t + 1's first tile. A
    // first token without rows is written (zeros) before the loop, Q then being token
    // t + 1's from the prologue on.
    constexpr int kInv = 9, kQrdy = 10;
    auto write_token_half = [&](float inv_a, float inv_b) {
      const int col0 = wg * 256 + (lane & 3) * 2;
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int row = r0 + 8 * hf;
        const float inv = hf ? inv_b : inv_a;
        if (row < nh) {
          uint16_t* o = p.output + t * p.output_stride_token + (h0 + row) * p.output_stride_head + col0;
#pragma unroll
          for (int n = 0; n < 32; ++n) {
            const float* c = acc + n * 4 + 2 * hf;
            const uint32_t pk = pack_bf16x2(c[0] * inv, c[1] * inv);
            if (a.out_pairs) {
              *reinterpret_cast<uint32_t*>(o + 8 * n) = pk;
            } else {
              o[8 * n] = uint16_t(pk & 0xffffu);
              o[8 * n + 1] = uint16_t(pk >> 16);
            }
          }
        }
      }
#pragma unroll
      for (int i = 0; i < kAcc; ++i) acc[i] = 0.f;
    };
    auto wg0_boundary = [&]() {
      float inv2[2];
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        float l = rl[hf], le = rle[hf];
        l += MLA_EXT_SHFL_XOR(l, 1);
        l += MLA_EXT_SHFL_XOR(l, 2);
        le += MLA_EXT_SHFL_XOR(le, 1);
        le += MLA_EXT_SHFL_XOR(le, 2);
        const int row = r0 + 8 * hf;
        float inv = 0.f, lse = neg_inf();
        if (l > 0.f || is_nan(l)) {  // the epilogue's rule below
          lse = rm[hf] * kLn2 + logf(le);
          float den = l;
          if (p.attn_sink != nullptr && row < nh)
            den = l + exp2f(p.attn_sink[(h0 + row) * p.attn_sink_stride] * kLog2e - rm[hf]);
          inv = 1.f / den;
        }
        inv2[hf] = inv;
        if ((lane & 3) == 0) {
          inv_s[row] = inv;
          if (p.lse != nullptr && row < nh) p.lse[t * p.lse_stride_token + (h0 + row) * p.lse_stride_head] = lse;
        }
        rm[hf] = neg_inf();
        rl[hf] = 0.f;
        rle[hf] = 0.f;
      }
      named_bar_arrive(kInv, 2 * 128);
      write_token_half(inv2[0], inv2[1]);
    };
    // in_loop: warpgroup 1 copied token t + 1's Q (below) and publishes it (QRDY) first,
    // so that warpgroup 0's next Q.K does not wait for this warpgroup's output stores.
    auto wg1_boundary = [&](bool in_loop) {
      if (in_loop && ntiles < NT) {  // (as many QRDY arrivals as warpgroup 0's syncs)
        copy_async_wait_all();
        fence_proxy_async();  // the Q tile is read by the async proxy
        named_bar_arrive(kQrdy, 2 * 128);
      }
      named_bar_sync(kInv, 2 * 128);
      write_token_half(inv_s[r0], inv_s[r0 + 8]);
    };
    if constexpr (A16) {
      // ---- the asymmetric 16-head tile (A16, sm_90a: V4 rows on either split map but the
      // anchored one, V3.2 rows on the uniform map; where decode_use_asym16 says) ----
      // The 64-head kernel's schedule, stages, barriers and gather halves (above), with the
      // products transposed so that nothing pads to 64 heads: warpgroup 0 multiplies
      // S^T = K Q^T (64 key rows x 16 heads, wgmma m64n16k16: A the K stage, B the Q tile, both
      // K-major) over all 512 dims, runs the online softmax on the fragments (a head's 64 keys
      // lie across the warpgroup's 128 threads: the per-head maximum over the 4 warps through
      // shared memory, the sums kept per thread and added once after the loop), writes P^T
      // (16 heads x 64 keys, one swizzled 128-byte row per head) and alpha, and runs the P.V
      // of value dims 0-255; warpgroup 1 runs dims 256-511. P.V is O^T = V^T P^T, m64n16k16
      // with A = V^T (the K stage read MN-major: one 64-dim block of the stage, 16 key rows
      // per step) and B = P^T: 4 m-tiles x 4 k-steps per warpgroup, O^T in 32 registers.
      // fp8_ds_mla rows (SC): raw e4m3 keys and [4][BN] scale rows per stage (not Gather's
      // EXPK), each scale group's Q.K in its own accumulator, and 4 P^T copies (P times each
      // V group's key scales) in the stage's RoPE block.
      // Fragment element e of a thread (S^T and each O^T m-tile): row 16 (warp % 4) +
      // lane / 4 + 8 ((e >> 1) & 1) (a key; for O^T a value dim of the m-tile), column
      // (head) 8 (e >> 2) + 2 (lane % 4) + (e & 1); the thread's heads hq(q), q = (e & 1) +
      // 2 (e >> 2).
      constexpr int kRed = 12;  // warpgroup 0 alone: the per-warp head maxima visible
      float* const red = reinterpret_cast<float*>(smem + C::rdOff);  // [2][4][HTp]
      const int c0 = 2 * (lane & 3);
      auto hq = [&](int q) { return 8 * (q >> 1) + c0 + (q & 1); };
      auto qof = [](int e) { return (e & 1) + 2 * (e >> 2); };
      // P^T of the tile in stage st: p_of (SC: its 4 copies, 2 KB apart, in the stage's RoPE
      // block, which nothing reads after Q.K; the stage is not refilled before both P.V are done).
      float hm[4], hl[4], hle[4];  // warpgroup 0: its heads' running max, and this thread's sums
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        hm[q] = neg_inf();
        hl[q] = 0.f;
        hle[q] = 0.f;
      }
      // O^T = O^T * alpha + V^T P^T over this warpgroup's 4 value-dim blocks of stage st (issued, not waited for).
      auto pv_issue = [&](int st, const float (&al)[4]) {
#pragma unroll
        for (int i = 0; i < 32; ++i) acc[i] *= al[qof(i & 7)];
        // (SC: m-tiles 0-1 and 2-3 are V scale groups 2 wg and 2 wg + 1, each with its P^T copy)
        const uint64_t pd = wg_desc(smem_addr(p_of(st) + (SC ? 2 * wg * HTp * 64 : 0)), 16, 1024);
        const uint64_t vd = wg_desc(smem_addr(Ks + st * (C::kStageBytes / 2)) + uint32_t(wg * 4 * BN * 128),
                                    uint32_t(BN * 128), 1024);
        wg_fence_operands(*reinterpret_cast<float(*)[32]>(acc));
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk)
#pragma unroll
          for (int mt = 0; mt < 4; ++mt)  // (m-tiles innermost: independent accumulators back to back)
            wgmma_m64n16k16<true>(*reinterpret_cast<float(*)[8]>(acc + 8 * mt),
                                  wg_desc_add(vd, uint32_t(mt * BN * 128 + kk * 16 * 128)),
                                  wg_desc_add(pd, uint32_t((SC && mt >= 2 ? HTp * 128 : 0) + kk * 32)));
        wg_commit();
      };
      if (wg == 0) {
        const uint64_t qd0 = wg_desc(smem_addr(Qs), 16, 1024);
        for (int j = 0; j < NT; ++j) {
          const int cur = j & 1, nxt = cur ^ 1;
          if (j > 0) named_bar_sync(kFull + cur, 2 * 128);  // warpgroup 1's half of tile j
          const uint64_t kd0 = wg_desc(smem_addr(Ks + cur * (C::kStageBytes / 2)), 16, 1024);
          auto qk_step = [&](float (&d)[8], int kk) {
            const uint32_t off = uint32_t((kk & 3) * 32);
            wgmma_m64n16k16<false>(d, wg_desc_add(kd0, uint32_t((kk >> 2) * BN * 128) + off),
                                   wg_desc_add(qd0, uint32_t((kk >> 2) * HTp * 128) + off));
          };
          float s[8];
#pragma unroll
          for (int e = 0; e < 8; ++e) s[e] = 0.f;
          // SC: the scales of this thread's two key rows (r0, r0 + 8) in each group, for Q.K
          // and for the P^T copies.
          float ksr[SC ? 4 : 1][2];
          // Four more accumulators (back-to-back wgmmas on one accumulator wait for each other).
          float x[4][8];
#pragma unroll
          for (int a4 = 0; a4 < 4; ++a4) {
#pragma unroll
            for (int e = 0; e < 8; ++e) x[a4][e] = 0.f;
            wg_fence_operands(x[a4]);
          }
          if constexpr (SC) {
            // fp8_ds_mla (raw e4m3 keys, exact in bf16): each scale group's 8 k-steps into its
            // own accumulator x[g], all 36 steps issued together; S^T = sum_g scale_g[key] X_g +
            // RoPE, the key rows' scales per fragment row.
            wg_fence_operands(s);
            wg_fence();
            // (issued round-robin over the five accumulators: back-to-back wgmmas on one
            // accumulator wait for each other)
#pragma unroll
            for (int i = 0; i < 8; ++i) {
#pragma unroll
              for (int g4 = 0; g4 < 4; ++g4) qk_step(x[g4], 8 * g4 + i);
              if (i < 4) qk_step(s, 32 + i);
            }
            wg_commit_wait();
            wg_fence_operands(s);
            const float* const ks = ksc_of(cur);
#pragma unroll
            for (int g4 = 0; g4 < 4; ++g4) {
              wg_fence_operands(x[g4]);
              ksr[g4][0] = ks[g4 * BN + r0];
              ksr[g4][1] = ks[g4 * BN + r0 + 8];
#pragma unroll
              for (int e = 0; e < 8; ++e) s[e] = fmaf(x[g4][e], ksr[g4][(e >> 1) & 1], s[e]);
            }
          } else {
            // k-step kk into x[kk % 4], the four added at the end.
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < DQK / 16; ++kk) qk_step(x[kk & 3], kk);
            wg_commit_wait();
#pragma unroll
            for (int a4 = 0; a4 < 4; ++a4) wg_fence_operands(x[a4]);
#pragma unroll
            for (int e = 0; e < 8; ++e) s[e] = (x[0][e] + x[1][e]) + (x[2][e] + x[3][e]);
          }
          // Rows without an address (bit r of the tile's validity mask clear): -inf.
          const uint64_t vm = *reinterpret_cast<const uint64_t*>(vmask + 2 * (j & 3));
          const bool va = (vm >> r0) & 1u, vb = (vm >> (r0 + 8)) & 1u;
#pragma unroll
          for (int e = 0; e < 8; ++e) s[e] = ((e >> 1) & 1 ? vb : va) ? s[e] * a.scale_log2 : neg_inf();
          float tm[4];
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            const int e0 = (q & 1) + 4 * (q >> 1);
            float m = fmaxf(s[e0], s[e0 + 2]);
            m = fmaxf(m, MLA_EXT_SHFL_XOR(m, 4));
            m = fmaxf(m, MLA_EXT_SHFL_XOR(m, 8));
            m = fmaxf(m, MLA_EXT_SHFL_XOR(m, 16));
            tm[q] = m;
          }
          float* const rd = red + cur * 4 * HTp;
          if (lane < 4) {
#pragma unroll
            for (int q = 0; q < 4; ++q) rd[warp * HTp + hq(q)] = tm[q];
          }
          named_bar_sync(kRed, 128);
          float alpha[4], mu[4];
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            const int h = hq(q);
            const float m_new =
                fmaxf(fmaxf(hm[q], fmaxf(rd[h], rd[HTp + h])), fmaxf(rd[2 * HTp + h], rd[3 * HTp + h]));
            mu[q] = m_new == neg_inf() ? 0.f : m_new;
            alpha[q] = fast_exp2(hm[q] - mu[q]);
            hm[q] = m_new;
          }
          // P^T of tile j (bf16, row h = head, swizzled), the sums of what P.V sees (rounded)
          // and of the unrounded probabilities.
          // SC: one copy per V scale group g, P times the key rows' scales of g, rounded once;
          // the normaliser then sums P unrounded (as the other V3.2 kernels).
          uint16_t* const Pj = p_of(cur);
          float ls[4] = {0.f, 0.f, 0.f, 0.f}, lse4[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
          for (int e = 0; e < 8; e += 2) {
            const int q = qof(e);
            const float p0 = fast_exp2(s[e] - mu[q]), p1 = fast_exp2(s[e + 1] - mu[q + 1]);
            lse4[q] += p0;
            lse4[q + 1] += p1;
            const int k = r0 + 8 * ((e >> 1) & 1), h = hq(q);
            const int o0 = h * 64 + ((((k >> 3) ^ h) & 7) << 3) + (k & 7);
            const int o1 = (h + 1) * 64 + ((((k >> 3) ^ (h + 1)) & 7) << 3) + (k & 7);
            if constexpr (SC) {
              ls[q] += p0;
              ls[q + 1] += p1;
#pragma unroll
              for (int g4 = 0; g4 < 4; ++g4) {
                const float kv = ksr[g4][(e >> 1) & 1];  // (key row k)
                const uint32_t pk = pack_bf16x2(p0 * kv, p1 * kv);
                Pj[g4 * HTp * 64 + o0] = uint16_t(pk & 0xffffu);
                Pj[g4 * HTp * 64 + o1] = uint16_t(pk >> 16);
              }
            } else {
              const uint32_t pk = pack_bf16x2(p0, p1);
              ls[q] += bf16_to_float(uint16_t(pk & 0xffffu));
              ls[q + 1] += bf16_to_float(uint16_t(pk >> 16));
              Pj[o0] = uint16_t(pk & 0xffffu);
              Pj[o1] = uint16_t(pk >> 16);
            }
          }
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            hl[q] = hl[q] * alpha[q] + ls[q];
            hle[q] = hle[q] * alpha[q] + lse4[q];
          }
          if (warp == 0 && lane < 4) {
#pragma unroll
            for (int q = 0; q < 4; ++q) alpha_s[cur * HTp + hq(q)] = alpha[q];
          }
          fence_proxy_async();  // P^T is read by the async proxy
          named_bar_arrive(kPrdy + cur, 2 * 128);
          named_bar_sync(kRed, 128);  // this warpgroup's P.V reads all four warps' P^T rows
          pv_issue(cur, alpha);
          // While it runs: this half of tile j + 1 into stage nxt, the addresses of tile j + 3
          // and the loads of this half of tile j + 2: the 64-head kernel's step (below), copied,
          // as one function for both changed that kernel's SASS (benchmarks/NOTES.md, 48th session).
          if (j + 1 < NT) {
            if (j > 0) named_bar_sync(kFree + nxt, 2 * 128);
            gh.template store_swizzled<kWholeK>(Ks + nxt * (C::kStageBytes / 2), ksc_of(nxt), vt, live_rows(j + 1));
            fence_proxy_async();
            if (tid < BN && j + 3 < NT) {
              const int ms3 = (j + 3) & 3;
              g_address(j + 3, idx_next, ms3);
              valid_mask_store(vmask, ms3, meta_d[ms3 * BN + tid] != nullptr, tid);
              idx_next = g_index(j + 4);
            }
            if (j + 2 < NT) load_half((j + 2) & 3);
          }
          wg_wait_all();
          wg_fence_operands(*reinterpret_cast<float(*)[32]>(acc));
          if (j + 2 < NT) named_bar_arrive(kDone + cur, 2 * 128);  // stage cur: warpgroup 1 stores tile j + 2
        }
        // This thread's sums over the 8 threads of its heads in the warp.
#pragma unroll
        for (int q = 0; q < 4; ++q) {
#pragma unroll
          for (int o = 4; o < 32; o <<= 1) {
            hl[q] += MLA_EXT_SHFL_XOR(hl[q], o);
            hle[q] += MLA_EXT_SHFL_XOR(hle[q], o);
          }
        }
      } else {
        for (int j = 0; j < NT; ++j) {
          const int cur = j & 1, nxt = cur ^ 1;
          if (j + 1 < NT) {
            if (j > 0) named_bar_sync(kDone + nxt, 2 * 128);
            gh.template store_swizzled<kWholeK>(Ks + nxt * (C::kStageBytes / 2), ksc_of(nxt), vt, live_rows(j + 1));
            fence_proxy_async();
            named_bar_arrive(kFull + nxt, 2 * 128);
            if (j + 2 < NT) load_half((j + 2) & 3);
          }
          named_bar_sync(kPrdy + cur, 2 * 128);  // P^T(j), alpha(j)
          float al[4];
#pragma unroll
          for (int q = 0; q < 4; ++q) al[q] = alpha_s[cur * HTp + hq(q)];
          pv_issue(cur, al);
          wg_wait_all();
          wg_fence_operands(*reinterpret_cast<float(*)[32]>(acc));
          if (j + 2 < NT) named_bar_arrive(kFree + cur, 2 * 128);  // stage cur free for tile j + 2
        }
      }
      __syncthreads();  // both warpgroups are done with every stage
      // The heads' state: warpgroup 0's per-warp sums (lanes 0-3 hold them) and maxima.
      float* st = reinterpret_cast<float*>(smem + C::kOff);
      if (wg == 0 && lane < 4) {
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          st[warp * 2 * HTp + hq(q)] = hl[q];
          st[warp * 2 * HTp + HTp + hq(q)] = hle[q];
          if (warp == 0) st[8 * HTp + hq(q)] = hm[q];
        }
      }
      __syncthreads();  // the heads' state visible
      row_m = st[8 * HTp + srow];
      row_l = (st[srow] + st[2 * HTp + srow]) + (st[4 * HTp + srow] + st[6 * HTp + srow]);
      row_le = (st[HTp + srow] + st[3 * HTp + srow]) + (st[5 * HTp + srow] + st[7 * HTp + srow]);
    } else {
    if (wg == 0) {
      const uint64_t qd0 = wg_desc(smem_addr(Qs), 16, 1024);
      if (two && ntiles == 0) wg0_boundary();
      for (int j = 0; j < NT; ++j) {
        const int cur = j & 1, nxt = cur ^ 1;
        if (j > 0) named_bar_sync(kFull + cur, 2 * 128);  // warpgroup 1's half of tile j
        if constexpr (CL) mbar_wait_cta(fullr(cur), uint32_t(j >> 1) & 1u);  // the peer's rows of tile j
        if (two && j == ntiles && j > 0) named_bar_sync(kQrdy, 2 * 128);  // token t + 1's Q
        const uint32_t ks0 = smem_addr(Ks + cur * (C::kStageBytes / 2));
        const uint64_t kd0 = wg_desc(ks0, 16, 1024), vd0 = wg_desc(ks0, uint32_t(BN * 128), 1024);
        float s2[32];
#pragma unroll
        for (int i = 0; i < 32; ++i) s2[i] = 0.f;
        // k-step kk of Q.K into d
        auto qk_step = [&](float (&d)[32], int kk) {
          const uint32_t off = uint32_t((kk & 3) * 32);
          wgmma_m64n64k16(d, wg_desc_add(qd0, uint32_t((kk >> 2) * HTp * 128) + off),
                          wg_desc_add(kd0, uint32_t((kk >> 2) * BN * 128) + off));
        };
        if constexpr (SC) {
          // S = (((X0 r0 + X1) r1 + X2) r2 + X3) e3 + RoPE (Gather's EXPK): one accumulator,
          // each group's 8 k-steps onto it after the running sum is multiplied by the ratio.
          const float* const ks = ksc_of(cur);
#pragma unroll
          for (int g4 = 0; g4 < 5; ++g4) {
            wg_fence_operands(s2);
            wg_fence();
            if (g4 < 4) {
#pragma unroll
              for (int kk = 8 * g4; kk < 8 * g4 + 8; ++kk) qk_step(s2, kk);
            } else {
#pragma unroll
              for (int kk = 32; kk < 36; ++kk) qk_step(s2, kk);
            }
            wg_commit_wait();
            wg_fence_operands(s2);
            if (g4 < 4) {
              const float* const kr = ks + (g4 < 3 ? 4 + g4 : 3) * BN + 2 * (lane & 3);
#pragma unroll
              for (int i = 0; i < 8; ++i) {
                const float2 k2 = *reinterpret_cast<const float2*>(kr + 8 * i);
                s2[4 * i] *= k2.x;
                s2[4 * i + 1] *= k2.y;
                s2[4 * i + 2] *= k2.x;
                s2[4 * i + 3] *= k2.y;
              }
            }
          }
        } else {
          wg_fence_operands(s2);
          wg_fence();
#pragma unroll
          for (int kk = 0; kk < DQK / 16; ++kk) qk_step(s2, kk);
          wg_commit_wait();
          wg_fence_operands(s2);
        }
        // Softmax on the fragments: element 4 i + 2 hf + e is row r0 + 8 hf,
        // column 8 i + 2 (lane % 4) + e.
        // Row validity of this tile: bit c of vm is column 2 (lane % 4) + c.
        const uint64_t vm = *reinterpret_cast<const uint64_t*>(vmask + 2 * (j & 3)) >> (2 * (lane & 3));
        uint32_t pr[16];  // P as bf16 pairs: pr[2 i + hf] = row r0 + 8 hf, columns 8 i + 2 (lane % 4) + {0, 1}
        float alpha[2];
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const bool v0 = (vm >> (8 * i)) & 1u, v1 = (vm >> (8 * i + 1)) & 1u;
#pragma unroll
          for (int hf = 0; hf < 2; ++hf) {
            s2[4 * i + 2 * hf] = v0 ? s2[4 * i + 2 * hf] * a.scale_log2 : neg_inf();
            s2[4 * i + 2 * hf + 1] = v1 ? s2[4 * i + 2 * hf + 1] * a.scale_log2 : neg_inf();
          }
        }
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          float lmax = neg_inf();
#pragma unroll
          for (int i = 0; i < 8; ++i) lmax = fmaxf(lmax, fmaxf(s2[4 * i + 2 * hf], s2[4 * i + 2 * hf + 1]));
          lmax = fmaxf(lmax, MLA_EXT_SHFL_XOR(lmax, 1));
          lmax = fmaxf(lmax, MLA_EXT_SHFL_XOR(lmax, 2));
          const float m_new = fmaxf(rm[hf], lmax);
          const float m_use = m_new == neg_inf() ? 0.f : m_new;
          alpha[hf] = fast_exp2(rm[hf] - m_use);
          float lsum = 0.f, lsum_exact = 0.f;
#pragma unroll
          for (int i = 0; i < 8; ++i) {
            const float p0 = fast_exp2(s2[4 * i + 2 * hf] - m_use), p1 = fast_exp2(s2[4 * i + 2 * hf + 1] - m_use);
            lsum_exact += p0;
            lsum_exact += p1;
            const uint32_t pk = pack_bf16x2(p0, p1);
            pr[2 * i + hf] = pk;
            if constexpr (SC) {
              // P.V multiplies P times the key scales, rounded once: the normaliser sums
              // P unrounded (as the symmetric kernel does); P stays in s2 for the products.
              s2[4 * i + 2 * hf] = p0;
              s2[4 * i + 2 * hf + 1] = p1;
              lsum += p0;
              lsum += p1;
            } else {
              lsum += bf16_to_float(uint16_t(pk & 0xffffu));
              lsum += bf16_to_float(uint16_t(pk >> 16));
            }
          }
          // Per-thread partial sums (a row's 4 threads share its max and alpha):
          // added across the quad after the loop.
          rl[hf] = rl[hf] * alpha[hf] + lsum;
          rle[hf] = rle[hf] * alpha[hf] + lsum_exact;
          rm[hf] = m_new;
        }
        // P and alpha of tile j for warpgroup 1 (P in the swizzled K-major tile).
        uint16_t* const Pj = p_of(cur);
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          const int r = r0 + 8 * hf;
#pragma unroll
          for (int i = 0; i < 8; ++i)
            *reinterpret_cast<uint32_t*>(Pj + r * 64 + ((i ^ (r & 7)) << 3) + 2 * (lane & 3)) = pr[2 * i + hf];
          if ((lane & 3) == 0) alpha_s[cur * HTp + r] = alpha[hf];
        }
        fence_proxy_async();  // P is read by the async proxy
        named_bar_arrive(kPrdy + cur, 2 * 128);
        // O[:, 0:256] = O * alpha + P V, P from registers, issued ...
        scale_rows_m64n256(acc, alpha[0], alpha[1]);
        // SC: value dims [0, 128) and [128, 256) are scale groups 0 and 1, each multiplied
        // with P times its keys' scales (A fragments built from the fp32 P in s2).
        uint32_t pa[SC ? BN / 16 : 1][2][4];
        if constexpr (SC) {
          const float* const ks = ksc_of(cur);
#pragma unroll
          for (int kk = 0; kk < BN / 16; ++kk) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              const int c = 16 * kk + 2 * (lane & 3);
              const float2 ka = *reinterpret_cast<const float2*>(ks + h * BN + c);
              const float2 kb = *reinterpret_cast<const float2*>(ks + h * BN + c + 8);
              const float* x = s2 + 8 * kk;
              pa[kk][h][0] = pack_bf16x2(x[0] * ka.x, x[1] * ka.y);
              pa[kk][h][1] = pack_bf16x2(x[2] * ka.x, x[3] * ka.y);
              pa[kk][h][2] = pack_bf16x2(x[4] * kb.x, x[5] * kb.y);
              pa[kk][h][3] = pack_bf16x2(x[6] * kb.x, x[7] * kb.y);
            }
          }
        }
        wg_fence_operands(*reinterpret_cast<float(*)[128]>(acc));
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk) {
          if constexpr (SC) {
#pragma unroll
            for (int h = 0; h < 2; ++h)
              wgmma_m64n128k16_rs(*reinterpret_cast<float(*)[64]>(acc + 64 * h), pa[kk][h],
                                  wg_desc_add(vd0, uint32_t(h * 2 * BN * 128 + kk * 16 * 128)));
          } else {
            // k-step kk: columns 16 kk .. 16 kk + 15 = fragments i = 2 kk, 2 kk + 1
            const uint32_t af[4] = {pr[4 * kk], pr[4 * kk + 1], pr[4 * kk + 2], pr[4 * kk + 3]};
            wgmma_m64n256k16_rs(*reinterpret_cast<float(*)[128]>(acc), af,
                                wg_desc_add(vd0, uint32_t(kk * 16 * 128)));
          }
        }
        wg_commit();
        // ... and while it runs: this half of tile j + 1 into stage nxt (tile j -
        // 1's: this warpgroup's P.V of it was waited for last tile, warpgroup
        // 1's is FREE), then the loads of this half of tile j + 2.
        if (j + 1 < NT) {
          if (j > 0) named_bar_sync(kFree + nxt, 2 * 128);
          if constexpr (!CL) {  // (CL: warpgroup 1 stores all of the block's rows)
            gh.template store_swizzled<kWholeK>(Ks + nxt * (C::kStageBytes / 2), ksc_of(nxt), vt, live_rows(j + 1));
            fence_proxy_async();
          }
          // Row addresses of tile j + 3 (slot (j + 3) % 4: tile j - 1's), here,
          // where no gather load is in flight: the index load shares a
          // scoreboard with the gathers, and its use at the top of the tile
          // waited for this warpgroup's loads of tile j + 2 every tile (Nsight,
          // 12% of warpgroup 0's time). Published to warpgroup 0 by FULL (or
          // the prologue's barrier), to warpgroup 1 by DONE below.
          if (tid < BN && j + 3 < NT) {
            const int ms3 = (j + 3) & 3;
            g_address(j + 3, idx_next, ms3);
            valid_mask_store(vmask, ms3, meta_d[ms3 * BN + tid] != nullptr, tid);
            idx_next = g_index(j + 4);
          }
          if (j + 2 < NT && !(two && j == ntiles - 1)) load_half((j + 2) & 3);
        }
        wg_wait_all();
        wg_fence_operands(*reinterpret_cast<float(*)[128]>(acc));
        // pr is the P.V's register operand until the wait above (ptxas keeps a
        // wgmma's registers until its wait_group; this only pins the source order).
        if constexpr (!SC) {
#pragma unroll
          for (int i = 0; i < 16; ++i) asm volatile("" : "+r"(pr[i])::"memory");
        } else {
#pragma unroll
          for (int kk = 0; kk < BN / 16; ++kk)
#pragma unroll
            for (int h = 0; h < 2; ++h)
#pragma unroll
              for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(pa[kk][h][e])::"memory");
        }
        if (j + 2 < NT) {  // stage cur: warpgroup 1 stores tile j + 2
          named_bar_arrive(kDone + cur, 2 * 128);
          release_stage_cl(cur);
        }
        if (two && j == ntiles - 1) {  // (this half of tile j + 2 is loaded after it: fewer live registers)
          wg0_boundary();
          if (j + 2 < NT) load_half((j + 2) & 3);
        }
      }
      // Row sums over the quad.
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        rl[hf] += MLA_EXT_SHFL_XOR(rl[hf], 1);
        rl[hf] += MLA_EXT_SHFL_XOR(rl[hf], 2);
        rle[hf] += MLA_EXT_SHFL_XOR(rle[hf], 1);
        rle[hf] += MLA_EXT_SHFL_XOR(rle[hf], 2);
      }
    } else {
      if (two && ntiles == 0) wg1_boundary(false);
      for (int j = 0; j < NT; ++j) {
        const int cur = j & 1, nxt = cur ^ 1;
        // First (while warpgroup 0 multiplies Q.K(j)): this half of tile j + 1
        // into stage nxt (tile j - 1's: warpgroup 0 is DONE with it, this
        // warpgroup's P.V of it was waited for last tile), then the loads of
        // this half of tile j + 2 (addresses published by DONE or the prologue).
        if (j + 1 < NT) {
          if (j > 0) named_bar_sync(kDone + nxt, 2 * 128);
          wait_peer_release_cl(nxt, j + 1);
          gh.template store_swizzled<kWholeK>(Ks + nxt * (C::kStageBytes / 2) + c32 * 64, ksc_of(nxt) + c32, vt,
                                              live_rows(j + 1) - c32);
          store_rope_peer(Ks + nxt * (C::kStageBytes / 2), vt, live_rows(j + 1));
          fence_proxy_async();
          named_bar_arrive(kFull + nxt, 2 * 128);
          send_rows_cl(nxt);
          if (j + 2 < NT && !(two && j == ntiles - 1)) load_half((j + 2) & 3);
        }
        named_bar_sync(kPrdy + cur, 2 * 128);  // P(j), alpha(j)
        if (two && j == ntiles - 1 && ntiles < NT) {
          // Warpgroup 0's Q.K of token t's last tile is done (before PRDY): token t +
          // 1's Q into the Q tile, landing during this P.V and the boundary.
          const uint16_t* q1 = p.q + (t + 1) * p.q_stride_token + h0 * p.q_stride_head;
          for (int u = tid - 128; u < nh * (DQK / 8); u += 128) {
            const int r = u / (DQK / 8), c = u - r * (DQK / 8);
            copy16_async(swz_chunk<true, HTp>(Qs, KST, r, c), q1 + int64_t(r) * p.q_stride_head + 8 * c);
          }
        }
        scale_rows_m64n256(acc, alpha_s[cur * HTp + r0], alpha_s[cur * HTp + r0 + 8]);
        const uint64_t pd0 = wg_desc(smem_addr(Ps + cur * (HTp * PST)), 16, 1024);  // (not SC)
        const uint64_t vd0 =
            wg_desc(smem_addr(Ks + cur * (C::kStageBytes / 2)) + uint32_t(4 * BN * 128), uint32_t(BN * 128), 1024);
        if constexpr (SC) {
          // P fragments by ldmatrix (rows 16 (warp % 4) + lane % 16, k-chunk lane / 16 of each
          // 16-key step: the register-A layout), times the key scales of groups 2 and 3.
          const float* const ks = ksc_of(cur);
          const uint16_t* const Pj = p_of(cur);
          // CL: the lane's offsets from a fresh read of the thread index, so that they are
          // recomputed here each tile: kept live across the loop, ptxas spilled them, and their
          // reloads waited behind this warpgroup's gather loads (DRAM latency) every tile.
          int pl = lane, pw = warp;
          if constexpr (CL) {
            const int tv = int(thread_index_x());
            pl = tv & 31;
            pw = tv >> 5;
          }
          const int prow = (pw & 3) * 16 + (pl & 15);
          uint32_t pa[BN / 16][2][4];
#pragma unroll
          for (int kk = 0; kk < BN / 16; ++kk) {
            uint32_t pf[4];
            ldsm_x4(pf, smem_addr(Pj + prow * 64 + (((2 * kk + (pl >> 4)) ^ (prow & 7)) << 3)));
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              const int c = 16 * kk + 2 * (pl & 3);
              const float2 ka = *reinterpret_cast<const float2*>(ks + (2 + h) * BN + c);
              const float2 kb = *reinterpret_cast<const float2*>(ks + (2 + h) * BN + c + 8);
#pragma unroll
              for (int e = 0; e < 4; ++e) {
                const float2 k2 = e < 2 ? ka : kb;
                pa[kk][h][e] = pack_bf16x2(bf16_to_float(uint16_t(pf[e] & 0xffffu)) * k2.x,
                                           bf16_to_float(uint16_t(pf[e] >> 16)) * k2.y);
              }
            }
          }
          wg_fence_operands(*reinterpret_cast<float(*)[128]>(acc));
          wg_fence();
#pragma unroll
          for (int kk = 0; kk < BN / 16; ++kk)
#pragma unroll
            for (int h = 0; h < 2; ++h)
              wgmma_m64n128k16_rs(*reinterpret_cast<float(*)[64]>(acc + 64 * h), pa[kk][h],
                                  wg_desc_add(vd0, uint32_t(h * 2 * BN * 128 + kk * 16 * 128)));
        } else {
          wg_fence_operands(*reinterpret_cast<float(*)[128]>(acc));
          wg_fence();
#pragma unroll
          for (int kk = 0; kk < BN / 16; ++kk)
            wgmma_m64n256k16_bt(*reinterpret_cast<float(*)[128]>(acc), wg_desc_add(pd0, uint32_t(kk * 32)),
                                wg_desc_add(vd0, uint32_t(kk * 16 * 128)));
        }
        wg_commit();
        wg_wait_all();
        wg_fence_operands(*reinterpret_cast<float(*)[128]>(acc));
        if (j + 2 < NT) {  // stage cur free for tile j + 2
          named_bar_arrive(kFree + cur, 2 * 128);
          release_stage_cl(cur);
        }
        if (two && j == ntiles - 1) {
          wg1_boundary(true);
          if (j + 2 < NT) load_half((j + 2) & 3);
        }
      }
    }
    if constexpr (CL) {
      cluster_sync();  // both blocks are done with every stage of both (no store or arrive comes after)
    } else {
      __syncthreads();  // both warpgroups are done with every stage
    }
    float* st = reinterpret_cast<float*>(smem + C::kOff);
    if (wg == 0 && (lane & 3) == 0) {
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        st[r0 + 8 * hf] = rm[hf];
        st[HTp + r0 + 8 * hf] = rl[hf];
        st[2 * HTp + r0 + 8 * hf] = rle[hf];
      }
    }
    __syncthreads();  // the rows' state visible
    row_m = st[srow];
    row_l = st[HTp + srow];
    row_le = st[2 * HTp + srow];
    if (two) t += 1;  // the epilogue below writes the block's last token
    }  // !A16
  } else {

  // QREG (the 16-head V4 tile, kHalfK, at one block per processor): each warp's Q.K
  // A fragments (its half of the dims: 16 x 4 registers) are loaded from the Q tile once,
  // at the first tile, instead of once per tile (the Q tile is 64 of the ~240 KB the
  // tile's products read from shared memory).
  static_assert(!QREG || (MMA && MT == 1 && !SC && !WG), "Q fragments in registers: the kHalfK tile");
  uint32_t qf[QREG ? DQK / 32 : 1][4];
  // kSplitLoads (V3.2's 16-head tile, 128 registers at two blocks per processor): the next
  // tile's gather loads leave in two halves, one before Q.K and one after it, so that Q.K
  // has the second half's 24 registers (4 FP8 and 2 RoPE chunks) for its fragments.
  constexpr bool kSplitLoads = MMA && !WG && SC && MT == 1;
  for (int j = 0; j < ntiles; ++j) {
    const int cur = j & 1, nxt = cur ^ 1;
    // This tile's K stage, and where its S copies go.
    uint16_t* const Kt = kPipe ? Ks + cur * (C::kStageBytes / 2) : Ks;
    float* const St = kPipe ? reinterpret_cast<float*>(smem + C::kOff + nxt * C::kStageBytes) : Ss;
    const int live = live_rows(j);
    // Row-address slot of this tile, and of tile j + 2 ((j + 2) % 3 = (j - 1) % 3).
    const int ms = kPipe ? j % 3 : cur;
    const int ms2 = ms == 0 ? 2 : ms - 1;
    if constexpr (kPipe) {
      if (tid < BN) {
        row_address<F>(p, p_lo + int64_t(j + 2) * BN + tid, em, idx_next, meta_d[ms2 * BN + tid],
                       meta_s[ms2 * BN + tid]);
        idx_next = load_index(p, t, p_lo + int64_t(j + 3) * BN + tid, em, p_hi);
      }
    }
    if constexpr (kRawQK) {
      // Q.K and the store of tile j from its words, then tile j + 1's loads (its addresses, in
      // slot nxt, were written during tile j - 1 after the softmax, below; tile 1's in the
      // prologue).
      rq_qk_store(live);
      if (j + 1 < ntiles) rq_load(meta_d + nxt * BN, meta_s + nxt * BN, live_rows(j + 1));
      __syncthreads();  // K tile and S copies visible
    } else if constexpr (!kPipe) {
      if constexpr (WG) {
        g.template store_swizzled<kWholeK>(Ks, ksc, tid, live);
      } else {
        g.template store<kSkipRows>(Ks, KST, ksc, tid, live);
      }
      // WG: the K tile (and, before the first tile, the Q tile: its copies were
      // waited for above) is read by the async proxy.
      if (WG) fence_proxy_async();
      if (tid < BN) {
        row_address<F>(p, p_lo + int64_t(j + 1) * BN + tid, em, idx_next, meta_d[nxt * BN + tid],
                       meta_s[nxt * BN + tid]);
      }
      __syncthreads();  // K tile + next meta visible
      if (j + 1 < ntiles) {
        if constexpr (kSplitLoads) {
          g.template load<0>(meta_d + nxt * BN, meta_s + nxt * BN, tid);
        } else {
          g.load(meta_d + nxt * BN, meta_s + nxt * BN, tid);
        }
        if (tid < BN) idx_next = load_index(p, t, p_lo + int64_t(j + 2) * BN + tid, em, p_hi);
      }
    }

    // ---- S = Q K^T (raw dot products) -> Ss ----
    // kHalfK (16-head tile, unscaled formats): warp w multiplies key rows
    // [16 (w % 4), +16) over half of the dims (w / 4) and writes its own S
    // copy; the softmax adds the two. Against 8 rows over all dims per warp
    // this halves the k-steps of each warp's dependent chain and the Q
    // fragments every warp reloads from shared memory each tile.
    constexpr bool kHalfK = MMA && MT == 1 && !SC;
    // kHalfKSc (V3.2's fp8_ds_mla rows in the 16- and 32-head tiles): the same split of the
    // tile, warp w taking key rows [16 (w % 4), +16) of every head over half of the dims
    // (dh = w / 4: scale groups 2 dh and 2 dh + 1, then RoPE k-steps 32 + 2 dh, +1), so
    // each warp reads half of Q per tile instead of all of it (16 heads: 147 -> 74 KB of
    // the ~390 KB of shared-memory traffic per tile). H200, 16 heads x 128 tokens: the
    // shared pipe was 56% busy and the tile waited on ldmatrix results (short scoreboard,
    // 42% of the warps' cycles), hence also the fragments loaded a step ahead below.
    constexpr bool kHalfKSc = MMA && !WG && SC && MT <= 2;
    if constexpr (WG) {
      // Warpgroup g (threads 128 g ..) multiplies all 64 heads x 64 keys over
      // half of the dims (DQK / 32 k-steps of 16) and writes its own S copy; the
      // softmax adds the two. Operands straight from the swizzled tiles: Q
      // (A, K-major) and K (B, K-major: key rows of dims). Rows past the
      // split's end are zeros; the softmax masks their S columns.
      const int warp = tid / 32, lane = tid % 32, wg = warp >> 2;
      const WgOperand<kDescAdd> qop(smem_addr(Qs), 16), kop(smem_addr(Kt), 16);
      float* Sh = St + wg * (HTp * SST);
      const int r0 = (warp & 3) * 16 + (lane >> 2);
      // Product of k-steps [k0, k0 + NK) into s2 (global k-step kk: 64-column
      // block kk / 4, 32 bytes per step inside it).
      float s2[32];
      auto qk_steps = [&](int k0, auto nk) {
#pragma unroll
        for (int i = 0; i < 32; ++i) s2[i] = 0.f;
        wg_fence_operands(s2);
        wg_fence();
#pragma unroll
        for (int i = 0; i < decltype(nk)::value; ++i) {
          const int kk = k0 + i;
          const uint32_t off = uint32_t((kk & 3) * 32);
          const uint32_t qo = uint32_t((kk >> 2) * HTp * 128) + off, ko = uint32_t((kk >> 2) * BN * 128) + off;
          wgmma_m64n64k16(s2, qop.at(qo), kop.at(ko));
        }
        wg_commit_wait();
        wg_fence_operands(s2);
      };
      if constexpr (SC) {
        // fp8_ds_mla (raw e4m3 keys, exact in bf16): warpgroup g takes scale
        // groups 2g and 2g + 1 (8 k-steps each) and half of the RoPE dims
        // (2 k-steps), one product per part, and adds each into its S copy
        // times the key row's scale of that group (RoPE: 1), as the mma.sync
        // kernel does; three waits per tile instead of one.
#pragma unroll
        for (int part = 0; part < 3; ++part) {
          if (part < 2) {
            qk_steps(wg * 16 + part * 8, std::integral_constant<int, 8>());
          } else {
            qk_steps(32 + wg * 2, std::integral_constant<int, 2>());
          }
#pragma unroll
          for (int i = 0; i < 8; ++i) {
            const int col = i * 8 + (lane & 3) * 2;
            const float2 ks = part < 2 ? *reinterpret_cast<const float2*>(ksc + (2 * wg + part) * BN + col)
                                       : make_float2(1.f, 1.f);
            float2* d0 = reinterpret_cast<float2*>(Sh + r0 * SST + col);
            float2* d1 = reinterpret_cast<float2*>(Sh + (r0 + 8) * SST + col);
            if (part == 0) {
              *d0 = make_float2(s2[4 * i] * ks.x, s2[4 * i + 1] * ks.y);
              *d1 = make_float2(s2[4 * i + 2] * ks.x, s2[4 * i + 3] * ks.y);
            } else {
              const float2 o0 = *d0, o1 = *d1;
              *d0 = make_float2(fmaf(s2[4 * i], ks.x, o0.x), fmaf(s2[4 * i + 1], ks.y, o0.y));
              *d1 = make_float2(fmaf(s2[4 * i + 2], ks.x, o1.x), fmaf(s2[4 * i + 3], ks.y, o1.y));
            }
          }
        }
      } else {
        // Warpgroup g: half of the dims (DQK / 32 k-steps of 16).
        qk_steps(wg * (DQK / 32), std::integral_constant<int, DQK / 32>());
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const int col = i * 8 + (lane & 3) * 2;
          *reinterpret_cast<float2*>(Sh + r0 * SST + col) = make_float2(s2[4 * i], s2[4 * i + 1]);
          *reinterpret_cast<float2*>(Sh + (r0 + 8) * SST + col) = make_float2(s2[4 * i + 2], s2[4 * i + 3]);
        }
      }
    } else if constexpr (kHalfKSc) {
      // Each group's raw product (8 k-steps) times its key rows' scale, the two groups summed,
      // then the half's two RoPE k-steps accumulated on top, unscaled; into S copy dh.
      const int warp = tid / 32, lane = tid % 32;
      const int kg = warp & 3, dh = warp >> 2;
      const uint32_t qa = smem_addr(Qs + (lane & 15) * KST + (lane >> 4) * 8);
      const uint32_t kb = smem_addr(Ks + (kg * 16 + ((lane >> 4) & 1) * 8 + (lane & 7)) * KST +
                                    ((lane >> 3) & 1) * 8);
      if (kg * 16 < live) {  // (rows past the split's end: the softmax masks their columns)
        // The half's 18 k-steps (step i: dims 16 (16 dh + i) for i < 16, then RoPE k-step
        // 32 + 2 dh + i - 16), each step's fragments loaded one step ahead (two register
        // buffers): loaded and used in the same step, every mma waited for its ldmatrix
        // (short-scoreboard stalls, 44% of the tile's samples at 16 heads x 128 tokens).
        uint32_t fa[2][MT][4], fb[2][4];
        auto load = [&](int b, int i) {
          const uint32_t off = uint32_t(i < 16 ? (16 * dh + i) * 32 : (32 + 2 * dh + i - 16) * 32);
          ldsm_x4(fb[b], kb + off);
#pragma unroll
          for (int m = 0; m < MT; ++m) ldsm_x4(fa[b][m], qa + uint32_t(m * 16 * KST * 2) + off);
        };
        float sacc[MT][2][4], x[MT][2][4];
        load(0, 0);
#pragma unroll
        for (int i = 0; i < 18; ++i) {
          if (i + 1 < 18) load((i + 1) & 1, i + 1);
          if (i == 0 || i == 8) {
#pragma unroll
            for (int m = 0; m < MT; ++m)
#pragma unroll
              for (int n = 0; n < 2; ++n) x[m][n][0] = x[m][n][1] = x[m][n][2] = x[m][n][3] = 0.f;
          }
          float(&c)[MT][2][4] = i < 16 ? x : sacc;
#pragma unroll
          for (int m = 0; m < MT; ++m) {
            mma16816(c[m][0], fa[i & 1][m], fb[i & 1][0], fb[i & 1][1]);
            mma16816(c[m][1], fa[i & 1][m], fb[i & 1][2], fb[i & 1][3]);
          }
          if (i == 7 || i == 15) {
            // columns (key rows) of n-tile n: c[0], c[2] -> col, c[1], c[3] -> col + 1
            const int h = i >> 3;
#pragma unroll
            for (int m = 0; m < MT; ++m)
#pragma unroll
              for (int n = 0; n < 2; ++n) {
                const float2 k2 =
                    *reinterpret_cast<const float2*>(ksc + (2 * dh + h) * BN + (kg * 2 + n) * 8 + (lane & 3) * 2);
                float* o = sacc[m][n];
                const float* v = x[m][n];
                if (h == 0) {
                  o[0] = v[0] * k2.x; o[1] = v[1] * k2.y; o[2] = v[2] * k2.x; o[3] = v[3] * k2.y;
                } else {
                  o[0] = fmaf(v[0], k2.x, o[0]); o[1] = fmaf(v[1], k2.y, o[1]);
                  o[2] = fmaf(v[2], k2.x, o[2]); o[3] = fmaf(v[3], k2.y, o[3]);
                }
              }
          }
        }
        float* Sh = Ss + dh * (HTp * SST);
#pragma unroll
        for (int m = 0; m < MT; ++m) {
          const int r0 = m * 16 + (lane >> 2);
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            const int col = (kg * 2 + i) * 8 + (lane & 3) * 2;
            *reinterpret_cast<float2*>(Sh + r0 * SST + col) = make_float2(sacc[m][i][0], sacc[m][i][1]);
            *reinterpret_cast<float2*>(Sh + (r0 + 8) * SST + col) = make_float2(sacc[m][i][2], sacc[m][i][3]);
          }
        }
      }
      if constexpr (kSplitLoads) {
        if (j + 1 < ntiles) g.template load<1>(meta_d + nxt * BN, meta_s + nxt * BN, tid);
      }
    } else if constexpr (kRawQK) {
      // (done above, before the barrier: rq_qk_store)
    } else if constexpr (kHalfK) {
      const int warp = tid / 32, lane = tid % 32;
      const int kg = warp & 3, dh = warp >> 2;
      constexpr int KH = DQK / 32;  // k-steps per half
      const uint32_t qa = smem_addr(Qs + (lane & 15) * KST + (lane >> 4) * 8) + uint32_t(dh * KH * 32);
      const uint32_t kb = smem_addr(Ks + (kg * 16 + ((lane >> 4) & 1) * 8 + (lane & 7)) * KST +
                                    ((lane >> 3) & 1) * 8) + uint32_t(dh * KH * 32);
      const bool qk_live = !kSkipRows || kg * 16 < live;
      if constexpr (QREG) {
        if (j == 0) {  // (every warp, live or not: later tiles use them)
#pragma unroll
          for (int kk = 0; kk < KH; ++kk) ldsm_x4(qf[kk], qa + kk * 32);
        }
      }
      if (qk_live) {
        // One accumulator chain per n-tile (two per warp, 16 k-steps each at d_qk 512): a
        // second chain per n-tile cost the 128-register kernels 4-44 bytes of spills.
        float c2[2][4];
#pragma unroll
        for (int i = 0; i < 2; ++i) c2[i][0] = c2[i][1] = c2[i][2] = c2[i][3] = 0.f;
        // Each k-step's fragments loaded one step ahead (two register buffers, the steps
        // unrolled), as in kHalfKSc above (V3.2's tile: about -3..-5% from this alone). Here
        // the unroll-4 loop already overlapped most loads: H200, V4 layers at 8-16 heads x
        // 1-512 tokens, -0.4% on geometric mean (C4 -0.8%, C128 0; benchmarks/NOTES.md,
        // forty-seventh session).
        if constexpr (QREG) {
          uint32_t bf[2][4];
          ldsm_x4(bf[0], kb);
#pragma unroll
          for (int kk = 0; kk < KH; ++kk) {
            if (kk + 1 < KH) ldsm_x4(bf[(kk + 1) & 1], kb + (kk + 1) * 32);
            mma16816(c2[0], qf[kk], bf[kk & 1][0], bf[kk & 1][1]);
            mma16816(c2[1], qf[kk], bf[kk & 1][2], bf[kk & 1][3]);
          }
        } else {
          uint32_t af[2][4], bf[2][4];
          ldsm_x4(af[0], qa);
          ldsm_x4(bf[0], kb);
#pragma unroll
          for (int kk = 0; kk < KH; ++kk) {
            if (kk + 1 < KH) {
              ldsm_x4(af[(kk + 1) & 1], qa + (kk + 1) * 32);
              ldsm_x4(bf[(kk + 1) & 1], kb + (kk + 1) * 32);
            }
            mma16816(c2[0], af[kk & 1], bf[kk & 1][0], bf[kk & 1][1]);
            mma16816(c2[1], af[kk & 1], bf[kk & 1][2], bf[kk & 1][3]);
          }
        }
        float* Sh = Ss + dh * (HTp * SST);
        const int r0 = lane >> 2;
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const int col = (kg * 2 + i) * 8 + (lane & 3) * 2;
          *reinterpret_cast<float2*>(Sh + r0 * SST + col) = make_float2(c2[i][0], c2[i][1]);
          *reinterpret_cast<float2*>(Sh + (r0 + 8) * SST + col) = make_float2(c2[i][2], c2[i][3]);
        }
      }
    } else if (MMA) {
      const int warp = tid / 32, lane = tid % 32;
      const int mt = warp % MT;
      const int nt0 = (warp / MT) * MT;
      // NACC independent accumulator sets (k-steps alternate between them) so the
      // dependent mma chain is DQK/16/NACC long instead of DQK/16. SC: the k loop
      // runs in 5 groups (4 x 128 latent dims, each times its per-row fp32 scale
      // when folded into sc, then the unscaled RoPE dims).
      constexpr int NACC = MT <= 2 ? 2 : 1;
      constexpr int NGRP = SC ? 5 : 1;
      float sc[MT][4];
      // Lane base addresses (shared space, bytes); a k-step adds 32 bytes.
      const uint32_t qa = smem_addr(Qs + (mt * 16 + (lane & 15)) * KST + (lane >> 4) * 8);
      const uint32_t kb = MT == 1 ? smem_addr(Ks + (nt0 * 8 + (lane & 7)) * KST + ((lane >> 3) & 1) * 8)
                                  : smem_addr(Ks + (nt0 * 8 + ((lane >> 4) & 1) * 8 + (lane & 7)) * KST +
                                              ((lane >> 3) & 1) * 8);
      // This warp's key rows [nt0 * 8, (nt0 + MT) * 8) all past the split's end:
      // nothing to multiply (the softmax masks those columns).
      const bool qk_live = !kSkipRows || nt0 * 8 < live;
#pragma unroll
      for (int grp = 0; grp < NGRP; ++grp) {
        if (!qk_live) break;
        const int k0 = SC ? grp * 8 : 0;
        const int k1 = (SC && grp < 4) ? k0 + 8 : DQK / 16;
        float sc2[NACC][MT][4];
#pragma unroll
        for (int v = 0; v < NACC; ++v)
#pragma unroll
          for (int i = 0; i < MT; ++i) sc2[v][i][0] = sc2[v][i][1] = sc2[v][i][2] = sc2[v][i][3] = 0.f;
#pragma unroll 4
        for (int kk = k0; kk < k1; ++kk) {
          const int v = NACC == 1 ? 0 : (kk & (NACC - 1));
          uint32_t af[4];
          ldsm_x4(af, qa + kk * 32);
          if (MT == 1) {
            uint32_t bf[2];
            ldsm_x2(bf, kb + kk * 32);
            mma16816(sc2[v][0], af, bf[0], bf[1]);
          } else {
#pragma unroll
            for (int np = 0; np < MT / 2; ++np) {
              uint32_t bf[4];
              ldsm_x4(bf, kb + uint32_t(np * 16 * KST * 2 + kk * 32));
              mma16816(sc2[v][2 * np], af, bf[0], bf[1]);
              mma16816(sc2[v][2 * np + 1], af, bf[2], bf[3]);
            }
          }
        }
#pragma unroll
        for (int i = 0; i < MT; ++i) {
          float x[4];
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            x[e] = sc2[0][i][e];
#pragma unroll
            for (int v = 1; v < NACC; ++v) x[e] += sc2[v][i][e];
          }
          if constexpr (SC) {
            // columns (key rows) of this fragment: c[0], c[2] -> col, c[1], c[3] -> col + 1
            float2 ks = make_float2(1.f, 1.f);
            if (grp < 4) ks = *reinterpret_cast<const float2*>(ksc + grp * BN + (nt0 + i) * 8 + (lane & 3) * 2);
            if (grp == 0) {
              sc[i][0] = x[0] * ks.x; sc[i][1] = x[1] * ks.y; sc[i][2] = x[2] * ks.x; sc[i][3] = x[3] * ks.y;
            } else {
              sc[i][0] = fmaf(x[0], ks.x, sc[i][0]); sc[i][1] = fmaf(x[1], ks.y, sc[i][1]);
              sc[i][2] = fmaf(x[2], ks.x, sc[i][2]); sc[i][3] = fmaf(x[3], ks.y, sc[i][3]);
            }
          } else {
#pragma unroll
            for (int e = 0; e < 4; ++e) sc[i][e] = x[e];
          }
        }
      }
      const int r0 = mt * 16 + (lane >> 2);
#pragma unroll
      for (int i = 0; i < MT; ++i) {
        if (!qk_live) break;
        const int col = (nt0 + i) * 8 + (lane & 3) * 2;
        *reinterpret_cast<float2*>(Ss + r0 * SST + col) = make_float2(sc[i][0], sc[i][1]);
        *reinterpret_cast<float2*>(Ss + (r0 + 8) * SST + col) = make_float2(sc[i][2], sc[i][3]);
      }
    } else {
      // thread: KV row r, heads hq + 8*i; Q through the cache.
      constexpr int NHQ = HTp / 8;
      const int r = tid % BN, hq = tid / BN;
      float sacc[NHQ];
#pragma unroll
      for (int i = 0; i < NHQ; ++i) sacc[i] = 0.f;
      const uint16_t* krow = Ks + r * KST;
      // kKeepQ: this thread's first Q row (elements from p.q) computed once and kept
      // (keep_value). Recomputed from the token and head group inside the loop, it cost the
      // 64-head balanced kernels ~20% more instructions per step (381 -> 302 with it). H200,
      // fortieth session, portable kernels against that build: 16 heads -12..-15% (both maps),
      // 32 heads -1..-6%, 64-head balanced and anchored -8..-9%; but the uniform 64-head kernels
      // +4..+6% (window, C4, V3.2 and C128 at one split; 317 -> 302 instructions, not
      // understood), so they keep the plain form.
      constexpr bool kKeepQ = BAL || MT < 4;
      int64_t q_row = 0;
      if constexpr (kKeepQ) {
        q_row = (qt - p.q) + int64_t(hq) * p.q_stride_head;
        keep_value(q_row);
      }
      const int64_t qs8 = int64_t(8) * p.q_stride_head;  // 8 head rows
      for (int c = 0; c < DQK / 8; ++c) {
        float kf[8];
        bf16x8_to_float(*reinterpret_cast<const uint4*>(krow + 8 * c), kf);
        if constexpr (SC) {
          if (c < 64) {
            const float ks = ksc[(c >> 4) * BN + r];
#pragma unroll
            for (int e = 0; e < 8; ++e) kf[e] *= ks;
          }
        }
#pragma unroll
        for (int i = 0; i < NHQ; ++i) {
          const int hr = hq + 8 * i;
          if (hr < nh) {
            float qf[8];
            const uint16_t* qp = kKeepQ ? p.q + q_row + i * qs8 + 8 * c : qt + int64_t(hr) * p.q_stride_head + 8 * c;
            bf16x8_to_float(*reinterpret_cast<const uint4*>(qp), qf);
#pragma unroll
            for (int e = 0; e < 8; ++e) sacc[i] = fmaf(qf[e], kf[e], sacc[i]);
          }
        }
      }
#pragma unroll
      for (int i = 0; i < NHQ; ++i) Ss[(hq + 8 * i) * SST + r] = sacc[i];
    }
    if constexpr (!kRawQK) __syncthreads();  // S visible (kRawQK: by the barrier above)

    // ---- online softmax: TPR threads per head row ----
    {
      const uint8_t* const* vrow = meta_d + ms * BN;
      float sv[CPT];
      float lmax = neg_inf();
      // Column of element i: TPR apart; kPairs: pairs 8 (i / 2) + 2 ssub + {0, 1}
      // (4-byte P stores; the 4 threads of a row fill one 16-byte chunk).
      // kPairs: the warpgroup kernels of the uniform map (H200: -1..3% there;
      // +1..3% in the balanced-map kernel, C128 at 16-128 tokens, which keeps
      // one column per store) and always for V3.2 (its 4 swizzled P copies).
      constexpr bool kPairs = WG && (!BAL || ANCH);  // (ANCH: as kWholeK)
      static_assert(!kPairs || (TPR == 4 && CPT == 16 && BN == 64), "column pairs of one 64-column block");
      static_assert(!(WG && SC) || kPairs, "V3.2's swizzled P copies are written in pairs");
#pragma unroll
      for (int i = 0; i < CPT; ++i) {
        const int col = kPairs ? 8 * (i >> 1) + 2 * ssub + (i & 1) : ssub + TPR * i;
        float x = St[srow * SST + col];
        if constexpr (kHalfK || kHalfKSc || WG) x += St[HTp * SST + srow * SST + col];  // the second half's S copy
        x *= a.scale_log2;
        sv[i] = vrow[col] != nullptr ? x : neg_inf();
        lmax = fmaxf(lmax, sv[i]);
      }
#pragma unroll
      for (int o = TPR / 2; o > 0; o >>= 1) lmax = fmaxf(lmax, MLA_EXT_SHFL_XOR(lmax, o));
      const float m_new = fmaxf(row_m, lmax);
      const float m_use = m_new == neg_inf() ? 0.f : m_new;
      const float alpha = fast_exp2(row_m - m_use);
      float lsum = 0.f, lsum_exact = 0.f;
      if constexpr (kPairs) {
        // P (SC: its 4 copies, each column times its key row's scale of that
        // V group) into the swizzled tile, one bf16 pair per store: pair pi is
        // in 16-byte chunk pi of the row's first 64 columns (swz_chunk), at
        // chunk slot pi ^ (row % 8).
        uint16_t* const prow = Ps + srow * 64 + 2 * ssub;
        const int r7 = srow & 7;
#pragma unroll
        for (int pi = 0; pi < CPT / 2; ++pi) {
          const int c0 = 8 * pi + 2 * ssub;
          uint16_t* const pdst = prow + ((pi ^ r7) << 3);
          const float p0 = fast_exp2(sv[2 * pi] - m_use), p1 = fast_exp2(sv[2 * pi + 1] - m_use);
          lsum_exact += p0;
          lsum_exact += p1;
          if constexpr (SC) {
#pragma unroll
            for (int g4 = 0; g4 < 4; ++g4) {
              const float2 ks = *reinterpret_cast<const float2*>(ksc + g4 * BN + c0);
              *reinterpret_cast<uint32_t*>(pdst + g4 * HTp * PST) = pack_bf16x2(p0 * ks.x, p1 * ks.y);
            }
            lsum += p0;
            lsum += p1;
          } else {
            const uint32_t pk = pack_bf16x2(p0, p1);
            *reinterpret_cast<uint32_t*>(pdst) = pk;
            lsum += bf16_to_float(uint16_t(pk & 0xffffu));
            lsum += bf16_to_float(uint16_t(pk >> 16));
          }
        }
      } else {
#pragma unroll
        for (int i = 0; i < CPT; ++i) {
          const int col = ssub + TPR * i;
          float pv = fast_exp2(sv[i] - m_use);
          lsum_exact += pv;
          if (MMA && SC && MT <= 2) {
            // One P copy per 128-dim V group g4: P[row][col] x scale[g4][col]. TPR is even,
            // so lanes ssub and ssub ^ 1 hold the adjacent columns col & ~1 and col | 1:
            // the even lane writes copies 0-1, the odd lane copies 2-3, as bf16 pairs.
            // The normaliser sums the unrounded probabilities. (At MT = 4 the pairs cost
            // 212 bytes of register spills: 305 -> 460 us at 128 heads x 64 tokens.)
            const float pn = MLA_EXT_SHFL_XOR(pv, 1);
            const bool odd = (ssub & 1) != 0;
            const float p0 = odd ? pn : pv, p1 = odd ? pv : pn;
            const int c0 = col & ~1;
#pragma unroll
            for (int gg = 0; gg < 2; ++gg) {
              const int g4 = (odd ? 2 : 0) + gg;
              const float2 ks = *reinterpret_cast<const float2*>(ksc + g4 * BN + c0);
              *reinterpret_cast<uint32_t*>(Ps + g4 * HTp * PST + srow * PST + c0) = pack_bf16x2(p0 * ks.x, p1 * ks.y);
            }
          } else if (MMA && SC) {
            // as above, one bf16 store per copy (no spills at MT = 4)
#pragma unroll
            for (int g4 = 0; g4 < 4; ++g4)
              Ps[g4 * HTp * PST + srow * PST + col] = uint16_t(pack_bf16x2(pv * ksc[g4 * BN + col], 0.f) & 0xffffu);
          } else if (MMA) {
            const uint16_t pb = uint16_t(pack_bf16x2(pv, 0.f) & 0xffffu);
            if (WG) {
              *(swz_chunk<true, HTp>(Ps, PST, srow, col >> 3) + (col & 7)) = pb;
            } else {
              Ps[srow * PST + col] = pb;
            }
            pv = bf16_to_float(pb);
          } else {
            Ss[srow * SST + col] = pv;
          }
          lsum += pv;
        }
      }
#pragma unroll
      for (int o = TPR / 2; o > 0; o >>= 1) {
        lsum += MLA_EXT_SHFL_XOR(lsum, o);
        lsum_exact += MLA_EXT_SHFL_XOR(lsum_exact, o);
      }
      row_l = row_l * alpha + lsum;
      row_le = row_le * alpha + lsum_exact;
      row_m = m_new;
      if (ssub == 0) alpha_s[srow] = alpha;
      if (WG) fence_proxy_async();  // P is read by the async proxy
    }
    __syncthreads();  // P, alpha visible
    if constexpr (kRawQK) {
      // Tile j + 2's addresses into tile j's slot (its softmax is done with it, its loads
      // were issued during tile j - 1), published by the barrier after P.V.
      if (tid < BN) {
        g_address(j + 2, idx_next, cur);
        idx_next = g_index(j + 3);
      }
    }

    // ---- O = O * alpha + P V ----
    if constexpr (WG) {
      // Warpgroup g: all 64 heads x value dims [256 g, +256) (its 4 warps hold
      // 16 heads each); P (A, K-major) and V = K's first 512 columns read as an
      // MN-major B (key rows of dims; the next 64-dim block is BN rows on).
      const int warp = tid / 32, lane = tid % 32, wg = warp >> 2;
      scale_rows_m64n256(acc, alpha_s[(warp & 3) * 16 + (lane >> 2)], alpha_s[(warp & 3) * 16 + (lane >> 2) + 8]);
      // All four 16-key steps: rows past the split's end are zeros (Gather::store),
      // and a data-dependent step count here made ptxas serialise the wgmmas
      // of the balanced-map kernels (C7520).
      const WgOperand<kDescAdd> pop(smem_addr(Ps), 16);
      const WgOperand<kDescAdd> vop(smem_addr(Kt) + uint32_t(wg * 4 * BN * 128), uint32_t(BN * 128));
      wg_fence_operands(*reinterpret_cast<float(*)[128]>(acc));
      wg_fence();
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) {
        if constexpr (SC) {
          // fp8_ds_mla: value dims [256 g, +128) and [256 g + 128, +128) are
          // scale groups 2g and 2g + 1, each multiplied with its P copy (P x
          // the key rows' scales of that group). The two halves of the
          // accumulator have the m64n256 fragment layout of their columns.
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            wgmma_m64n128k16_bt(*reinterpret_cast<float(*)[64]>(acc + 64 * h),
                                pop.at(uint32_t((2 * wg + h) * HTp * PST * 2 + kk * 32)),
                                vop.at(uint32_t(h * 2 * BN * 128 + kk * 16 * 128)));
          }
        } else {
          wgmma_m64n256k16_bt(*reinterpret_cast<float(*)[128]>(acc), pop.at(uint32_t(kk * 32)),
                              vop.at(uint32_t(kk * 16 * 128)));
        }
      }
      if constexpr (kPipe) {
        // While the P.V wgmmas run on stage cur: tile j + 1 into stage nxt
        // (where S was: the softmax is done with it), then the loads of tile
        // j + 2 (its addresses were published by the barrier after Q.K).
        wg_commit();
        if (j + 1 < ntiles) {
          g.template store_swizzled<kWholeK>(Ks + nxt * (C::kStageBytes / 2), ksc, tid, live_rows(j + 1));
          fence_proxy_async();
          if (j + 2 < ntiles) g.load(meta_d + ms2 * BN, meta_s + ms2 * BN, tid);
        }
        wg_wait_all();
      } else {
        wg_commit_wait();
      }
      wg_fence_operands(*reinterpret_cast<float(*)[128]>(acc));
    } else if (MMA) {
      const int warp = tid / 32, lane = tid % 32;
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        const float a0 = alpha_s[m * 16 + (lane >> 2)];
        const float a1 = alpha_s[m * 16 + (lane >> 2) + 8];
#pragma unroll
        for (int n = 0; n < 8; ++n) {
          float* c = acc + (m * 8 + n) * 4;
          c[0] *= a0; c[1] *= a0; c[2] *= a1; c[3] *= a1;
        }
      }
      const int kk_end = kSkipRows ? (live + 15) >> 4 : BN / 16;  // 16-row key blocks holding live rows
      const uint32_t pa = smem_addr(Ps + (SC ? (warp >> 1) * HTp * PST : 0) + (lane & 15) * PST + (lane >> 4) * 8);
      const uint32_t vb = smem_addr(Ks + (((lane >> 3) & 1) * 8 + (lane & 7)) * KST + warp * 64 + ((lane >> 4) & 1) * 8);
      if constexpr (kHalfKSc) {
        // As Q.K above: step st = (key block kk, 16-column pair np), its V fragments (and at
        // np = 0 the key block's P fragments) loaded one step ahead. (Past the live key blocks
        // the loads read rows no product uses.)
        constexpr int NST = BN / 16 * 4;
        uint32_t pf[2][MT][4], vf[2][4];
        auto load = [&](int st) {
          const int kk = st >> 2, np = st & 3;
          if (np == 0) {
#pragma unroll
            for (int m = 0; m < MT; ++m) ldsm_x4(pf[kk & 1][m], pa + uint32_t((m * 16 * PST + kk * 16) * 2));
          }
          ldsm_x4_t(vf[st & 1], vb + uint32_t((kk * 16 * KST + np * 16) * 2));
        };
        load(0);
#pragma unroll
        for (int st = 0; st < NST; ++st) {
          if ((st >> 2) >= kk_end) break;
          if (st + 1 < NST) load(st + 1);
          const int kk = st >> 2, np = st & 3;
#pragma unroll
          for (int m = 0; m < MT; ++m) {
            mma16816(*reinterpret_cast<float(*)[4]>(acc + (m * 8 + 2 * np) * 4), pf[kk & 1][m], vf[st & 1][0],
                     vf[st & 1][1]);
            mma16816(*reinterpret_cast<float(*)[4]>(acc + (m * 8 + 2 * np + 1) * 4), pf[kk & 1][m], vf[st & 1][2],
                     vf[st & 1][3]);
          }
        }
      } else {
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk) {
          if (kk >= kk_end) break;
          uint32_t af[MT][4];
#pragma unroll
          for (int m = 0; m < MT; ++m) ldsm_x4(af[m], pa + uint32_t((m * 16 * PST + kk * 16) * 2));
#pragma unroll
          for (int np = 0; np < 4; ++np) {
            uint32_t bf[4];
            ldsm_x4_t(bf, vb + uint32_t((kk * 16 * KST + np * 16) * 2));
#pragma unroll
            for (int m = 0; m < MT; ++m) {
              mma16816(*reinterpret_cast<float(*)[4]>(acc + (m * 8 + 2 * np) * 4), af[m], bf[0], bf[1]);
              mma16816(*reinterpret_cast<float(*)[4]>(acc + (m * 8 + 2 * np + 1) * 4), af[m], bf[2], bf[3]);
            }
          }
        }
      }
    } else {
      constexpr int NH4 = HTp / 4;
      const int dg = tid % 64, hq = tid / 64;
#pragma unroll
      for (int i = 0; i < NH4; ++i) {
        const float al = alpha_s[hq + 4 * i];
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[i * 8 + e] *= al;
      }
      for (int r = 0; r < BN; ++r) {
        float vf[8];
        bf16x8_to_float(*reinterpret_cast<const uint4*>(Ks + r * KST + dg * 8), vf);
        if constexpr (SC) {
          const float vs = ksc[(dg >> 4) * BN + r];
#pragma unroll
          for (int e = 0; e < 8; ++e) vf[e] *= vs;
        }
#pragma unroll
        for (int i = 0; i < NH4; ++i) {
          const float pv = Ss[(hq + 4 * i) * SST + r];
#pragma unroll
          for (int e = 0; e < 8; ++e) acc[i * 8 + e] = fmaf(pv, vf[e], acc[i * 8 + e]);
        }
      }
    }
    __syncthreads();  // K, S/P free for the next tile (two stages: tile j + 1's stage visible)
  }
  }  // !ASYM

  // ---- end of split: per-row scale (1/D or 1/l) and lse ----
  // ANCH: a token of one split is finished here (the reduce passes it by).
  const bool final_out = S == 1 || (ANCH && ns == 1);
  // The tensor-core kernels stage their output through shared memory (below), but not the
  // bf16-cache ones, whose spills grew with it (warpgroup 24 -> 100 and 72 -> 88 bytes,
  // mma.sync 64 heads 0 -> 60 and 48 -> 56).
  // The mma.sync kernels (16-32 heads; 64 heads off Hopper or with force_mma_sync) stage the
  // final bf16 output only (one split: calls with many tokens); their fp32 split partials go
  // straight from the fragments, which was 0.2 us faster in one-token calls of a few
  // blocks, where a store's latency counts and the load-store unit is not the limit
  // (twenty-second session).
  constexpr bool kStagedEpilogue = MMA && kv_layout(F) != KvFormat::kBF16;
  constexpr bool kStagedPartials = kStagedEpilogue && WG;
  // Workspace cell of head h: h * (T * S) + this block's split slot (blockIdx.x / HG
  // under either map), recomputed here rather than kept live through the tile loop
  // (read through block_index_x(): with plain blockIdx.x nvcc kept the prologue's
  // quotient and spilled it in the balanced MT=1 kernel).
  const int64_t NQ = p.num_tokens * S;
  // (ANCH: the cells stay in token order, not in block order: decode_active_slack.)
  const int64_t slot = ANCH ? q0 + s : int64_t(block_index_x() / uint32_t(HG));
  if (ssub == 0) {
    float inv = 0.f, lse = neg_inf();
    if (row_l > 0.f || is_nan(row_l)) {  // NaN scores: NaN output and lse (the CPU twin's rule)
      lse = row_m * kLn2 + logf(row_le);
      float den = row_l;
      if (final_out && p.attn_sink != nullptr && srow < nh) {
        const float sink = p.attn_sink[(h0 + srow) * p.attn_sink_stride];
        den = row_l + exp2f(sink * kLog2e - row_m);
      }
      inv = 1.f / den;
    }
    inv_s[srow] = inv;
    if (srow < nh) {
      const int64_t h = h0 + srow;
      if (final_out) {
        if (p.lse != nullptr) p.lse[t * p.lse_stride_token + h * p.lse_stride_head] = lse;
      } else {
        a.ws_lse[h * NQ + slot] = lse;
      }
    }
  }
  __syncthreads();

  auto write2 = [&](int row, int col, float v0, float v1) {
    if (row >= nh) return;
    const int64_t h = h0 + row;
    const float inv = inv_s[row];
    if (final_out) {
      uint16_t* o = p.output + t * p.output_stride_token + h * p.output_stride_head + col;
      const uint32_t pk = pack_bf16x2(v0 * inv, v1 * inv);
      if (a.out_pairs) {
        *reinterpret_cast<uint32_t*>(o) = pk;
      } else {
        o[0] = uint16_t(pk & 0xffffu);
        o[1] = uint16_t(pk >> 16);
      }
    } else {
      float* o = a.ws_out + (h * NQ + slot) * kDV + col;
      *reinterpret_cast<float2*>(o) = make_float2(v0 * inv, v1 * inv);
    }
  };

  if (kStagedEpilogue && (kStagedPartials || final_out)) {
    // Staged in shared memory below P (the K stages, Q and S: free after the
    // loop's last barrier; the asymmetric kernel's row state, read from the
    // stages' first bytes above, was read before the barrier after inv_s): each
    // thread's fragments (the loop below's layout) into a padded tile
    // (bank-conflict-free), then whole 16-byte chunks, a warp's 32 lanes 512
    // contiguous bytes of one row. Written straight from the fragments, a
    // warp's store covered 8 rows x 16 bytes (half of each 32-byte sector) and
    // the stores throttled the load-store unit (Nsight, C4 128 heads x 64
    // tokens: the epilogue 16% of the warp samples).
    const int warp = tid / 32, lane = tid % 32;
    constexpr int EM = WG ? 1 : MT, EN = WG ? 32 : 8;
    const int col0 = (WG ? (warp >> 2) * 256 : warp * 64) + (lane & 3) * 2;
    // f(row, col, v0, v1) for every fragment pair of this thread, scaled by its row's inv.
    auto each_pair = [&](auto&& f) {
#pragma unroll
      for (int m = 0; m < EM; ++m) {
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          const int row = (WG ? (warp & 3) * 16 : m * 16) + (lane >> 2) + 8 * hf;
          const float inv = inv_s[row];
#pragma unroll
          for (int n = 0; n < EN; ++n) {
            const float* c = acc + (m * EN + n) * 4 + 2 * hf;
            f(row, col0 + 8 * n, c[0] * inv, c[1] * inv);
          }
        }
      }
    };
    // A16: O^T's fragments one element at a time (a thread's pairs are two heads of one dim):
    // element e of m-tile mt is dim 256 (warp / 4) + 64 mt + 16 (warp % 4) + lane / 4 +
    // 8 ((e >> 1) & 1), head 8 (e >> 2) + 2 (lane % 4) + (e & 1).
    auto each_one = [&](auto&& f) {
#pragma unroll
      for (int mt = 0; mt < 4; ++mt)
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const int head = 8 * (e >> 2) + 2 * (lane & 3) + (e & 1);
          f(head, (warp >> 2) * 256 + 64 * mt + 16 * (warp & 3) + (lane >> 2) + 8 * ((e >> 1) & 1),
            acc[8 * mt + e] * inv_s[head]);
        }
    };
    if (final_out) {
      constexpr int kPitch = kDV + 8;  // bf16 per staged row: 1040 bytes, rows 4 banks apart
      static_assert(!kStagedEpilogue || (size_t(C::HTp) * kPitch * 2 <= C::pOff && kPitch * 2 % 16 == 0),
                    "the staged bf16 tile fits before P, rows 16-byte aligned");
      uint16_t* stg = reinterpret_cast<uint16_t*>(smem + C::kOff);
      if constexpr (A16) {
        each_one([&](int row, int col, float v) { stg[row * kPitch + col] = float_to_bf16(v); });
      } else {
        each_pair([&](int row, int col, float v0, float v1) {
          *reinterpret_cast<uint32_t*>(stg + row * kPitch + col) = pack_bf16x2(v0, v1);
        });
      }
      __syncthreads();
      uint16_t* const ob = p.output + t * p.output_stride_token + h0 * p.output_stride_head;
      if (a.out_vec16) {
        for (int i = tid; i < nh * (kDV / 8); i += kThreads) {
          const int row = i / (kDV / 8), ch = i % (kDV / 8);
          *reinterpret_cast<uint4*>(ob + row * p.output_stride_head + ch * 8) =
              *reinterpret_cast<const uint4*>(stg + row * kPitch + ch * 8);
        }
      } else {
        for (int i = tid; i < nh * (kDV / 2); i += kThreads) {
          const int row = i / (kDV / 2), pr2 = i % (kDV / 2);
          const uint32_t pk = *reinterpret_cast<const uint32_t*>(stg + row * kPitch + 2 * pr2);
          uint16_t* o = ob + row * p.output_stride_head + 2 * pr2;
          if (a.out_pairs) {
            *reinterpret_cast<uint32_t*>(o) = pk;
          } else {
            o[0] = uint16_t(pk & 0xffffu);
            o[1] = uint16_t(pk >> 16);
          }
        }
      }
    } else if constexpr (kStagedPartials) {
      // floats per staged row: 2080 bytes, rows 8 banks apart (a half-warp's 8-byte stores
      // over 4 rows x 4 lanes take the minimum 2 wavefronts; 2064 bytes took 4)
      constexpr int kPitch = kDV + 8;
      static_assert(!kStagedEpilogue || (size_t(C::HTp) * kPitch * 4 <= C::pOff && kPitch * 4 % 16 == 0),
                    "the staged fp32 tile fits before P, rows 16-byte aligned");
      float* stg = reinterpret_cast<float*>(smem + C::kOff);
      if constexpr (A16) {
        each_one([&](int row, int col, float v) { stg[row * kPitch + col] = v; });
      } else {
        each_pair([&](int row, int col, float v0, float v1) {
          *reinterpret_cast<float2*>(stg + row * kPitch + col) = make_float2(v0, v1);
        });
      }
      __syncthreads();
      // The workspace rows (2 KB per head and split slot) are 16-byte aligned.
      for (int i = tid; i < nh * (kDV / 4); i += kThreads) {
        const int row = i / (kDV / 4), ch = i % (kDV / 4);
        *reinterpret_cast<float4*>(a.ws_out + ((h0 + row) * NQ + slot) * kDV + ch * 4) =
            *reinterpret_cast<const float4*>(stg + row * kPitch + ch * 4);
      }
    }
  } else if (MMA) {
    // A thread holds 2 head rows per m-tile, 8 column pairs each (8 apart): the
    // row's pointer, scale and the block-uniform output choice are resolved once
    // per row, not per pair (at one token this epilogue was ~25% of a warp's
    // instructions).
    // WG: one m-tile of 16 heads per warp (16 (warp % 4) ..), 32 column pairs
    // 8 apart from 256 (warp / 4) on.
    const int warp = tid / 32, lane = tid % 32;
    constexpr int EM = WG ? 1 : MT, EN = WG ? 32 : 8;
    const int col0 = (WG ? (warp >> 2) * 256 : warp * 64) + (lane & 3) * 2;
#pragma unroll
    for (int m = 0; m < EM; ++m) {
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int row = (WG ? (warp & 3) * 16 : m * 16) + (lane >> 2) + 8 * hf;
        if (row >= nh) continue;
        const int64_t h = h0 + row;
        const float inv = inv_s[row];
        if (!final_out) {
          float* o = a.ws_out + (h * NQ + slot) * kDV + col0;
#pragma unroll
          for (int n = 0; n < EN; ++n) {
            const float* c = acc + (m * EN + n) * 4 + 2 * hf;
            *reinterpret_cast<float2*>(o + 8 * n) = make_float2(c[0] * inv, c[1] * inv);
          }
        } else {
          uint16_t* o = p.output + t * p.output_stride_token + h * p.output_stride_head + col0;
#pragma unroll
          for (int n = 0; n < EN; ++n) {
            const float* c = acc + (m * EN + n) * 4 + 2 * hf;
            const uint32_t pk = pack_bf16x2(c[0] * inv, c[1] * inv);
            if (a.out_pairs) {
              *reinterpret_cast<uint32_t*>(o + 8 * n) = pk;
            } else {
              o[8 * n] = uint16_t(pk & 0xffffu);
              o[8 * n + 1] = uint16_t(pk >> 16);
            }
          }
        }
      }
    }
  } else {
    constexpr int NH4 = HTp / 4;
    const int dg = tid % 64, hq = tid / 64;
#pragma unroll
    for (int i = 0; i < NH4; ++i) {
#pragma unroll
      for (int e = 0; e < 8; e += 2) write2(hq + 4 * i, dg * 8 + e, acc[i * 8 + e], acc[i * 8 + e + 1]);
    }
  }
}

// The one-token body (MMA: mma.sync, else portable) where the warpgroup body is not compiled.
// TWO: a two-token grid (half the blocks) on such code (a Hopper build without sm_90a, e.g.
// TORCH_CUDA_ARCH_LIST=9.0: the launcher cannot tell) runs it for each of the block's two
// tokens in turn.
template <int MT, int DQK, KvFormat F, bool MMA, bool BAL, bool TWO, bool QREG = false, bool ANCH = false,
          bool RAW = false>
__device__ __forceinline__ void decode_body_per_token(const DecodeArgs& a) {
  if constexpr (TWO) {
    decode_body<MT, DQK, F, MMA, BAL>(a, 0);
    __syncthreads();  // the first token's shared-memory reads are done
    decode_body<MT, DQK, F, MMA, BAL>(a, 1);
  } else {
    decode_body<MT, DQK, F, MMA, BAL, false, false, false, QREG, ANCH, false, RAW>(a);
  }
}

// WG: the warpgroup-MMA body where the code is compiled for sm_90a, the
// mma.sync body elsewhere (its shared memory fits the same allocation: launch_split).
// QREG: one block per processor (the Q fragments' 64 registers; launched only where the
// grid is one wave, decode_q_regs).
template <int MT, int DQK, KvFormat F, bool BAL, bool WG = false, bool ASYM = false, bool TWO = false,
          bool QREG = false, bool ANCH = false, bool RAW = false>
__global__ void __launch_bounds__(kThreads,
                                  (MT == 1 && F != KvFormat::kBF16 && !QREG && !ASYM) ? MLA_EXT_DECODE_MT1_MIN_BLOCKS : 1)
    decode_split_mma_kernel(const DecodeArgs a) {
  wait_for_prior_grids();
  if (a.early_trigger) launch_dependent_grids();
#if defined(MLA_EXT_DECODE_WGMMA)
  decode_body<MT, DQK, F, true, BAL, WG, ASYM, TWO, QREG, ANCH, false, RAW>(a);
#elif defined(MLA_EXT_DECODE_MMA)
  decode_body_per_token<MT, DQK, F, true, BAL, TWO, QREG, ANCH, RAW && MLA_EXT_DECODE_RAW_OK>(a);
#else
  // NVIDIA below sm_80 (or a host/HIP pass): the portable body fits in this
  // kernel's (larger) shared-memory allocation.
  decode_body_per_token<MT, DQK, F, false, BAL, TWO, false, ANCH>(a);
#endif
}

// The asymmetric fp8_ds_mla kernel as 2-block clusters, the pair being a (token, split)'s two
// head groups (decode_body's CL; launch_split's CL). Launched on Hopper only.
template <int DQK, KvFormat F>
__global__ void __launch_bounds__(kThreads, 1) decode_split_cluster_kernel(const DecodeArgs a) {
  wait_for_prior_grids();
  if (a.early_trigger) launch_dependent_grids();
#if defined(MLA_EXT_DECODE_WGMMA)
  decode_body<4, DQK, F, true, false, true, true, false, false, false, true>(a);
#elif defined(MLA_EXT_DECODE_MMA)
  // A Hopper build without sm_90a code (TORCH_CUDA_ARCH_LIST 9.0): decode_split_mma_kernel's
  // mma.sync body, each block on its own (its cluster barriers and copies are not compiled).
  decode_body_per_token<4, DQK, F, true, false, false, false, false>(a);
#else
  decode_body_per_token<4, DQK, F, false, false, false, false, false>(a);
#endif
}

template <int MT, int DQK, KvFormat F, bool BAL, bool ANCH = false>
__global__ void __launch_bounds__(kThreads) decode_split_portable_kernel(const DecodeArgs a) {
  wait_for_prior_grids();
  if (a.early_trigger) launch_dependent_grids();
  decode_body<MT, DQK, F, false, BAL, false, false, false, false, ANCH>(a);
}

// ---- split reduction: one block per (token, head) row (or per row and column chunk), 4 dims per thread ----
struct ReduceArgs {
  SparseDecodeParams p;
  const float* ws_out;
  const float* ws_lse;
  bool out_vec4;  // 8-byte bf16x4 stores allowed
  bool balanced;  // decode_balanced(p): the balanced split map
  bool anchored;  // DecodeArgs::anchored: tokens of one cell were finished by the split kernel
  const uint2* ws_map;  // DecodeArgs::ws_map: the split kernel's token map (balanced map)
};

constexpr int kReduceThreads = kDV / 4;
constexpr int kReduceWarps = kReduceThreads / kWarpSize;
// Column chunks per row the reduce may use (whole warps per chunk: 4 with 32-lane warps, 2 with 64).
constexpr int kReduceMaxChunks = kReduceThreads / kWarpSize >= 4 ? 4 : kReduceThreads / kWarpSize;
// The block-wide scan path folds its partials in batches of kReduceScanBatch splits, and with
// many splits runs up to kReduceMaxGroups groups of kReduceThreads threads per block, group g
// taking batches g, g + G, ... (one L2 round trip per batch and group instead of S / 16 in a
// row), then adds the groups' sums in a fixed order (deterministic).
constexpr int kReduceScanBatch = 16;
constexpr int kReduceMaxGroups = 5;
constexpr int kReduceMaxWarps = kReduceThreads * kReduceMaxGroups / kWarpSize;
// From this many splits on the reduce scans the split LSEs with the whole block
// (below it, each thread scans them itself: fewer registers, no shared memory,
// and at num_tokens 64 thousands of reduce blocks want the occupancy).
constexpr int kReduceBlockScanSplits = 16;
// Heads per reduce block on the anchored map of 17-128 heads (decode_reduce_kernel's HB): most of
// its tokens were finished by their split blocks. 4: a token it folds takes 4 rows in turn (one
// or two L2 round trips each; S' = 1 there, so a straggler's row has at most ~T cells). H200,
// thirty-ninth session, 512 tokens: the reduce 42 -> 12 us at 128 heads, 22 -> 7-9 at 64, 12 ->
// 4-7 at 32.
constexpr int kReduceAnchoredHeads = 4;
static_assert(kActiveWideGrid < kReduceBlockScanSplits, "the anchored map's reduce: the per-thread scan");
static_assert(2 * kReduceScanBatch == 32, "decode_reduce_chunks (sparse_mla_decode.h): chunks with column groups only");

// The split rule of sparse_mla_decode.h (split_merge_scan / split_merge_finish).
// BLOCK_SCAN = false: every thread scans the S split LSEs itself and folds the
// partials in batches of 8 (a batch costs one L2 round trip). BLOCK_SCAN = true
// (many splits): the split LSEs are loaded by the whole block at once, their
// max, NaN flag and weight sum are block reductions in a fixed order
// (deterministic), and the weights reach the partial loop, 16 splits per batch,
// through shared memory. H200, one token: 0.4-1 us faster at 20-32 splits; at
// num_tokens 64 (2-4 splits) its 86 registers cost 1.4-11 us, hence the switch.
// CH (GROUPED only): the row's 512 columns are split over CH blocks (blockIdx.y = column
// chunk) of kReduceThreads / CH threads per group, each scanning the split LSEs itself (the
// same fixed-order reductions in every chunk of a row, so one weight sum per row). For calls
// with fewer (token, head) rows than processors (decode_reduce_chunks).
// HB > 1 (the anchored map, per-thread scan only): one block per token and HB heads
// (blockIdx.x = t * ceil(H / HB) + j, heads j HB .. j HB + HB - 1, one after the other), so
// that a token finished by its split block costs ceil(H / HB) blocks that read its map entry
// and return, not H (H200, thirty-ninth session: 512 such tokens at 128 heads, 65,536 blocks
// of 128 threads, took 43 us, at 16 per processor each waiting out one load).
template <bool BLOCK_SCAN, int BATCH = 8, bool GROUPED = false, int CH = 1, int HB = 1>
__global__ void __launch_bounds__(GROUPED ? (kReduceThreads / CH) * kReduceMaxGroups : kReduceThreads / CH)
    decode_reduce_kernel(const ReduceArgs a) {
  constexpr int TPG = kReduceThreads / CH;  // threads per column group
  static_assert(CH == 1 || (GROUPED && TPG % kWarpSize == 0), "column chunks: column groups, whole warps");
  static_assert(HB == 1 || (!BLOCK_SCAN && !GROUPED), "heads per block: the per-thread scan (no barriers)");
  const SparseDecodeParams& p = a.p;
  const int64_t H = p.num_heads;
  int64_t t, h_first;
  if constexpr (HB == 1) {
    const int64_t row = blockIdx.x;  // t * H + h
    t = row / H;
    h_first = row - t * H;
  } else {
    const int64_t groups = (H + HB - 1) / HB;
    t = int64_t(blockIdx.x) / groups;
    h_first = (int64_t(blockIdx.x) - t * groups) * HB;
  }
  // The rows' sinks are the caller's input, not the split kernel's output: loaded before the
  // wait for the split grid, so that the fold's last step does not wait on memory (an engine's
  // per-layer sink is likely out of L2). This grid starts only once the split grid has passed
  // its own wait (its early trigger comes after it) or ended, so the kernels before the op,
  // which may have written the sink, have completed and their writes are visible.
  float sink_v[HB];
#pragma unroll
  for (int j = 0; j < HB; ++j)
    sink_v[j] = p.attn_sink != nullptr && h_first + j < H ? p.attn_sink[(h_first + j) * p.attn_sink_stride] : 0.f;
  wait_for_prior_grids();
  const int tid = threadIdx.x;
  // Column group: threads [TPG g, TPG g + TPG) cover this block's 512 / CH output columns once
  // (the per-thread path and the balanced map run one group of 128: blockDim.x == kReduceThreads).
  const int grp = GROUPED ? tid / TPG : 0, ctid = tid - grp * TPG;
  // The token's split slots (sparse_mla_decode.h split map): S of them from q0.
  const int64_t NQ = p.num_tokens * p.num_splits;
  int S = p.num_splits;
  int64_t q0 = t * S;
  if (!GROUPED && a.balanced) {  // the grouped instance never runs the balanced map
    // The token's first cell and cell count, from the split kernel's token map; on the
    // anchored map a token of one cell was finished there.
    const uint2 m = a.ws_map[t];
    if (a.anchored && m.y == 1u) return;
    q0 = int64_t(m.x);
    S = int(m.y);
  }
  // One (token, head) row; HB of them in turn (the last block's up to H).
  auto reduce_row = [&](const int64_t h, const float sink) {
    const float* lse = a.ws_lse + h * NQ + q0;
    const float* parts = a.ws_out + (h * NQ + q0) * kDV;  // split i's partial: parts + i * kDV
    const int col = (CH > 1 ? int(blockIdx.y) * TPG + ctid : ctid) * 4;
    float o[4] = {0.f, 0.f, 0.f, 0.f};
    float out_lse = neg_inf();
    // Both paths: fold a split's partial in with weight w; normalise at the end (sink once).
    auto fold = [&o](float w, const float4& v) {
      o[0] = fmaf(w, v.x, o[0]);
      o[1] = fmaf(w, v.y, o[1]);
      o[2] = fmaf(w, v.z, o[2]);
      o[3] = fmaf(w, v.w, o[3]);
    };
    auto finish = [&](float L, float mx) {
      const float inv = split_merge_finish(L, mx, p.attn_sink != nullptr, sink, &out_lse);
#pragma unroll
      for (int e = 0; e < 4; ++e) o[e] *= inv;
    };
    if constexpr (!BLOCK_SCAN) {
      // Every partial of a batch is loaded before the first is used (each was
      // written by this call; one whose weight is 0, or of a NaN / empty row, is
      // loaded but not used). The first batch goes out with the LSE loads, so the
      // two share one L2 round trip. BATCH: 2 or 4 when the call has that few
      // splits (fewer registers).
      constexpr int kBatch = BATCH;
      float4 v[kBatch];
#pragma unroll
      for (int u = 0; u < kBatch; ++u)
        if (u < S) v[u] = *reinterpret_cast<const float4*>(parts + int64_t(u) * kDV + col);  // v[u >= S]: never read
      float mx;
      const SplitMergeMode mode = split_merge_scan(lse, S, &mx);
      if (mode == SplitMergeMode::kNaN) {
        o[0] = o[1] = o[2] = o[3] = out_lse = quiet_nan();
      } else if (mode == SplitMergeMode::kMix) {
        float L = 0.f;
        for (int i0 = 0; i0 < S; i0 += kBatch) {
          float w[kBatch];
#pragma unroll
          for (int u = 0; u < kBatch; ++u) {
            const int i = i0 + u;
            w[u] = 0.f;
            if (i < S) {
              w[u] = expf(lse[i] - mx);
              if (i0 > 0) v[u] = *reinterpret_cast<const float4*>(parts + int64_t(i) * kDV + col);
            }
          }
#pragma unroll
          for (int u = 0; u < kBatch; ++u) {
            if (i0 + u < S) {
              L += w[u];
              if (w[u] > 0.f) fold(w[u], v[u]);
            }
          }
        }
        finish(L, mx);
      }
    } else {
      MLA_EXT_SHARED(float, s_w, [kMaxSplits]);
      MLA_EXT_SHARED(float, s_max, [kReduceMaxWarps]);
      MLA_EXT_SHARED(float, s_sum, [kReduceMaxWarps]);
      MLA_EXT_SHARED(int, s_nan, [kReduceMaxWarps]);
      MLA_EXT_SHARED(float4, s_part, [kReduceMaxGroups - 1][kReduceThreads]);
      const int lane = tid % kWarpSize, warp = tid / kWarpSize;
      // GROUPED = false: one group, every count below a compile-time constant.
      const int nt = GROUPED ? int(blockDim.x) : TPG;
      const int nwarps = nt / kWarpSize, groups = nt / TPG;
      constexpr int kLsePerThread = (kMaxSplits + TPG - 1) / TPG;  // (one group: the most per thread)
      // The first batch of this group's partials goes out with the LSE loads (one
      // L2 round trip for both); loaded but unused for a NaN or empty row.
      constexpr int kBatch = kReduceScanBatch;
      const float* part_out = parts + col;
      float4 v[kBatch];
#pragma unroll
      for (int u = 0; u < kBatch; ++u)
        if (grp * kBatch + u < S) v[u] = *reinterpret_cast<const float4*>(part_out + int64_t(grp * kBatch + u) * kDV);
      float l[kLsePerThread];
      float mx = neg_inf();
      int nan = 0;
#pragma unroll
      for (int u = 0; u < kLsePerThread; ++u) {
        const int i = tid + u * nt;
        l[u] = i < S ? lse[i] : neg_inf();
        mx = fmaxf(mx, l[u]);  // fmaxf skips a NaN; the flag records it
        nan |= is_nan(l[u]) ? 1 : 0;
      }
#pragma unroll
      for (int off = kWarpSize / 2; off > 0; off /= 2) {
        mx = fmaxf(mx, MLA_EXT_SHFL_XOR(mx, off));
        nan |= MLA_EXT_SHFL_XOR(nan, off);
      }
      if (lane == 0) {
        s_max[warp] = mx;
        s_nan[warp] = nan;
      }
      __syncthreads();
      mx = s_max[0];
      nan = s_nan[0];
      for (int w = 1; w < nwarps; ++w) {  // a constant trip count unless GROUPED
        mx = fmaxf(mx, s_max[w]);
        nan |= s_nan[w];
      }
      if (nan) {
        o[0] = o[1] = o[2] = o[3] = out_lse = quiet_nan();
      } else if (mx != neg_inf()) {  // kMix; the same branch for the whole block
        float part = 0.f;
#pragma unroll
        for (int u = 0; u < kLsePerThread; ++u) {
          const int i = tid + u * nt;
          if (i < S) {
            const float w = expf(l[u] - mx);
            s_w[i] = w;
            part += w;
          }
        }
#pragma unroll
        for (int off = kWarpSize / 2; off > 0; off /= 2) part += MLA_EXT_SHFL_XOR(part, off);
        if (lane == 0) s_sum[warp] = part;
        __syncthreads();
        float L = s_sum[0];
        for (int w = 1; w < nwarps; ++w) L += s_sum[w];
        for (int i0 = grp * kBatch; i0 < S; i0 += groups * kBatch) {
          if (i0 > grp * kBatch) {
#pragma unroll
            for (int u = 0; u < kBatch; ++u)
              if (i0 + u < S) v[u] = *reinterpret_cast<const float4*>(part_out + int64_t(i0 + u) * kDV);
          }
#pragma unroll
          for (int u = 0; u < kBatch; ++u) {
            if (i0 + u < S) {
              const float w = s_w[i0 + u];
              if (w > 0.f) fold(w, v[u]);
            }
          }
        }
        // The other groups' sums into group 0, in group order. (if constexpr: without groups, grp
        // is the constant 0, and clang warns about s_part[-1] in the dead branch.)
        if constexpr (GROUPED) {
          if (groups > 1) {
            if (grp > 0) s_part[grp - 1][ctid] = make_float4(o[0], o[1], o[2], o[3]);
            __syncthreads();
            if (grp == 0) {
              for (int g = 1; g < groups; ++g) {
                const float4 q = s_part[g - 1][ctid];
                o[0] += q.x; o[1] += q.y; o[2] += q.z; o[3] += q.w;
              }
            }
          }
        }
        finish(L, mx);
      }
    }
    if (grp > 0) return;  // group 0 writes the row
    uint16_t* out = p.output + t * p.output_stride_token + h * p.output_stride_head + col;
    const uint32_t lo = pack_bf16x2(o[0], o[1]), hi = pack_bf16x2(o[2], o[3]);
    if (a.out_vec4) {
      *reinterpret_cast<uint2*>(out) = make_uint2(lo, hi);
    } else {
      out[0] = uint16_t(lo & 0xffffu);
      out[1] = uint16_t(lo >> 16);
      out[2] = uint16_t(hi & 0xffffu);
      out[3] = uint16_t(hi >> 16);
    }
    if (tid == 0 && (CH == 1 || blockIdx.y == 0) && p.lse != nullptr)
      p.lse[t * p.lse_stride_token + h * p.lse_stride_head] = out_lse;
  };
  if constexpr (HB == 1) {
    reduce_row(h_first, sink_v[0]);
  } else {
#pragma unroll
    for (int j = 0; j < HB; ++j)
      if (h_first + j < H) reduce_row(h_first + j, sink_v[j]);
  }
}

// Raise the dynamic shared-memory limit of one kernel once per device (the
// caller passes a flag array that is static per kernel instantiation), without
// touching an error the caller left pending (set_max_dynamic_smem).
inline bool ensure_smem(PerDevice<bool>& done, const void* kernel, size_t bytes) {
  if (bytes <= 48 * 1024) return true;
  int dev = 0;
  if (mlaGetDevice(&dev) != MLA_EXT_GPU_SUCCESS) return false;
  if (dev >= 0 && dev < 64 && done.get(dev)) return true;
  if (!set_max_dynamic_smem(kernel, int(bytes))) return false;
  if (dev >= 0 && dev < 64) done.set(dev, true);
  return true;
}

// One reduce launch (one block per (token, head) row); programmatic where
// allowed (compat.h), so that its launch is processed while the split kernel
// runs (a split grid of at most half the processors' count triggers early) or
// drains (otherwise); its blocks wait for the split kernel's memory before
// reading the workspace. The reduce itself never triggers early: the kernel
// after it is the caller's (compat.h).
// GROUPED (block-wide scan only): one column group per batch of splits, up to
// kReduceMaxGroups; the balanced map's token-slot search is written for one group.
// HB: heads per block (decode_reduce_kernel); rows is then the block count.
template <bool SCAN, int BATCH = 8, bool GROUPED = false, int CH = 1, int HB = 1>
inline Status launch_reduce(const ReduceArgs& r, uint32_t rows, gpuStream_t stream) {
  static PerDevice<signed char> pdl_cache;
  auto* kernel = decode_reduce_kernel<SCAN, BATCH, GROUPED, CH, HB>;
  const bool pdl = use_pdl(kPdlDecodeReduce, pdl_cache, kernel);
  int groups = 1;
  if (GROUPED) {
    groups = (r.p.num_splits + kReduceScanBatch - 1) / kReduceScanBatch;
    if (groups > kReduceMaxGroups) groups = kReduceMaxGroups;
  }
  return launch_kernel(pdl, kernel, dim3(rows, CH), dim3((kReduceThreads / CH) * groups), 0, stream, r);
}

// The dynamic shared memory of a split kernel instance (launch_split; decode_wide16_rows). WG:
// room for either body of the kernel (decode_split_mma_kernel).
template <int MT, int DQK, KvFormat F, bool MMA, bool BAL, bool WG, bool ASYM>
constexpr size_t decode_split_smem_bytes() {
  constexpr bool kSc = kv_layout(F) == KvFormat::kFP8DsMla;
  using CW = Cfg<MT, DQK, MMA, kSc, WG, decode_two_stages(F, DQK, WG, BAL) || ASYM, ASYM>;
  using CM = Cfg<MT, DQK, MMA, kSc>;
  return WG && CW::bytes > CM::bytes ? CW::bytes : CM::bytes;
}

// CL: the asymmetric fp8_ds_mla kernel as 2-block clusters (decode_split_cluster_kernel).
template <int MT, int DQK, KvFormat F, bool MMA, bool BAL, bool WG = false, bool ASYM = false, bool TWO = false,
          bool QREG = false, bool ANCH = false, bool CL = false, bool RAW = false>
inline Status launch_split(const DecodeArgs& a, uint32_t blocks, gpuStream_t stream) {
  constexpr size_t kBytes = decode_split_smem_bytes<MT, DQK, F, MMA, BAL, WG, ASYM>();
  // More than the device lets a block have (A100: the 64-head kernels of d_qk
  // 576; sm_86 / sm_89: every tensor-core kernel above 16 heads): nothing is
  // launched, and the caller takes a smaller head tile.
  if (a.smem_limit != 0 && kBytes > a.smem_limit) return Status::kUnsupported;
  static PerDevice<bool> done;
  static PerDevice<signed char> pdl_cache;
  void (*kernel)(DecodeArgs);
  if constexpr (CL)
    kernel = decode_split_cluster_kernel<DQK, F>;
  else if constexpr (MMA)
    kernel = decode_split_mma_kernel<MT, DQK, F, BAL, WG, ASYM, TWO, QREG, ANCH, RAW>;
  else
    kernel = decode_split_portable_kernel<MT, DQK, F, BAL, ANCH>;
  if (!ensure_smem(done, reinterpret_cast<const void*>(kernel), kBytes)) return Status::kLaunchFailed;
  if constexpr (CL) {  // no room for a 2-block cluster (a partition of the GPU): the caller's fallback
    static PerDevice<signed char> fits;
    if (!cluster_fits(fits, kernel, 2u, dim3(kThreads), kBytes)) return Status::kUnsupported;
  }
  const bool pdl = use_pdl(kPdlDecodeSplit, pdl_cache, kernel);
  return launch_kernel_ex(pdl, CL ? 2u : 1u, kernel, dim3(blocks), dim3(kThreads), kBytes, stream, a);
}

// Whether the 64-head tile of the FP8 rows (V4; V3.2 since the forty-first session: -34..-40%
// at 64-128 heads x 64-512 tokens, RESULTS.md) runs as asymmetric warpgroups (decode_body's
// ASYM; the default) instead of the symmetric warpgroup kernel: unless the
// environment variable MLA_EXT_ASYM (read once) is "0". H200, V4, same-run A/B
// against the symmetric kernel (benchmarks/RESULTS.md, nineteenth session):
// C128 layers -21..-26% and C4 layers -11..-22% at 64-128 heads x 64-512
// tokens, window layers 0..-5%, one token -4..+2%. compute-sanitizer's
// racecheck reports hazards in it that are the tool's: it reports the same
// kinds on a race-free toy kernel with this barrier protocol, even across a
// __syncthreads (benchmarks/NOTES.md, nineteenth session).
inline bool decode_use_asym() {
  static const bool on = env_int("MLA_EXT_ASYM", 1) != 0;
  return on;
}
// Whether the 16-head tile of the FP8 rows runs as asymmetric warpgroups with transposed products
// (decode_body's A16; sm_90a; V4 rows on the uniform and balanced maps, V3.2 rows on the uniform
// map; not two-token blocks nor the anchored map). The environment variable MLA_EXT_ASYM16 (read
// once): "2", the default, V3.2 rows only, where a split spans at least kAsym16MinSplitRows index
// entries (W + W2 >= that x num_splits); "1" wherever it applies; "0" never. H100
// (benchmarks/RESULTS.md, fifty-fifth session; A16 against the mma.sync tile, same build, 8-16
// heads): V3.2 splits of 2 / 3 / 4 tiles (16 / 24 / 32 tokens: 16, 11, 8 splits of 2048
// entries) +11..+19% / +5..+8% / -2..+1%, of 5.3 / 6.4 tiles (40 / 48 tokens) -3..-5% /
// -6..-8%, of 8 tiles and more (56-512 tokens) -7.6..-21.1%; V4 rows lose with it at 16-128
// tokens (C4 Pro +3..+42%). The first H200 round (forty-eighth session, before the independent
// accumulators) had V3.2 16 x 512 at -7.7% and V4 at +0..+48% at 16-128 tokens.
// (kAsym16MinSplitRows: sparse_mla_decode.h, whose split policy models these calls.)
inline int decode_asym16_mode() {
  static const int mode = int(env_int("MLA_EXT_ASYM16", 2));
  return mode;
}
// The rows mode 2 runs A16 for (V3.2's; V4 rows lose with it, above): decode_use_asym16 and the
// split count's model of it (decode_wide16_rows).
constexpr bool decode_asym16_default_rows(KvFormat f) { return kv_layout(f) == KvFormat::kFP8DsMla; }
template <KvFormat F>
inline bool decode_use_asym16(const DecodeArgs& a) {
  const int mode = decode_asym16_mode();
  if (mode != 2) return mode != 0;
  const int64_t w = a.p.main.width + (a.p.extra.cache != nullptr ? a.p.extra.width : 0);
  return decode_asym16_default_rows(F) && w >= kAsym16MinSplitRows * int64_t(a.p.num_splits);
}
// The shared-memory limit per block a call's kernels are chosen under: the caller's
// p.smem_limit, never above the device's opt-in limit (a larger one would pick a kernel the
// runtime then refuses to launch); 0 where neither says.
inline size_t decode_smem_limit(const SparseDecodeParams& p, size_t smem_optin) {
  const size_t limit = p.smem_limit > 0 ? size_t(p.smem_limit) : smem_optin;
  return smem_optin != 0 && limit > smem_optin ? smem_optin : limit;
}
// Whether a device of compute capability major cc_major and smem_optin bytes of shared memory
// per block would run a V3.2 call's 16-head splits of kAsym16MinSplitRows+ entries as A16 (one
// block per processor), as launch_sparse_mla_decode would pick it: the automatic split count's
// `wide16` (decode_auto_splits; the op and the C API pass it). A Hopper build without sm_90a
// code runs the mma.sync body there in the same allocation (one block per processor still), so
// the count chosen for A16 stays about right. Not modelled: test switches that take A16 away at
// run time (two-token mode 2 at one split, a forced head tile).
inline bool decode_wide16_rows(const SparseDecodeParams& p, int cc_major, size_t smem_optin) {
  if (kWarpSize != 32 || !decode_asym16_default_rows(p.kv_format) || p.d_qk != 576) return false;
  if (p.force_portable || p.force_mma_sync || decode_asym16_mode() == 0 || cc_major != 9) return false;
  // launch_split's A16 instance (launch_split_mt: MT 1, the uniform map, WG and ASYM)
  constexpr size_t kBytes = decode_split_smem_bytes<1, 576, KvFormat::kFP8DsMla, true, false, true, true>();
  const size_t limit = decode_smem_limit(p, smem_optin);
  return limit == 0 || kBytes <= limit;
}
// Whether V3.2's asymmetric kernel runs as 2-block clusters at two head groups (65-128 heads;
// decode_body's CL: each block gathers and dequantises half of every tile and copies it into
// the peer's shared memory): unless the environment variable MLA_EXT_CLUSTER (read once) is
// "0". H200, same build, three alternating rounds (benchmarks/RESULTS.md, forty-fifth
// session): V3.2 at 128 heads x 1 / 4 / 16 / 64 / 128 / 512 tokens -1.6 / -4.0 / -3.4 / -6.8 /
// -5.8 / -5.8% against the one-block kernel; outputs bit-identical. (The forty-fourth session's
// forms copied the RoPE rows too, which P overwrites: racy, or +10..+15% with a LANDED barrier.)
inline bool decode_use_cluster() {
  static const bool on = env_int("MLA_EXT_CLUSTER", 1) != 0;
  return on;
}

// Whether the 16-head V4 kernel holds its Q fragments in registers (decode_body's QREG):
// where the split grid is one wave (at most one block per processor, which the kernel then
// has: its registers allow no second) and a split spans more than one 64-row tile (the
// index widths over the split count), unless the environment variable MLA_EXT_QREG (read
// once) is "0". H200, same build, three alternating rounds (benchmarks/NOTES.md,
// twenty-ninth session): C128 8-32 heads x 1 token (two tiles per split) -1.9..-2.4%;
// one-tile splits (C4 Flash, window) +1.4..2.2% with it, hence the tile condition; many
// waves: two blocks per processor pay more (C4 Flash 16 heads x 64 tokens +38% at one).
inline bool decode_q_regs(const SparseDecodeParams& p, int64_t blocks, int num_sms) {
  static const bool on = env_int("MLA_EXT_QREG", 1) != 0;
  const int64_t width = p.main.width + (p.extra.cache != nullptr ? p.extra.width : 0);
  return on && num_sms > 0 && blocks <= num_sms && width > int64_t(p.num_splits) * 64;
}

// Whether the 16-head V4 kernel (not its QREG instance) takes Q.K's key
// fragments straight from the gathered registers (decode_body's kRawQK): where a split spans
// at least kRawQKMinSplitRows index entries (W + W2 >= that x num_splits). The environment
// variable MLA_EXT_RAWQK (read once): "2", the default, that rule; "1" wherever it applies;
// "0" never. num_splits is the grid's count (on the balanced map a token may use fewer). H100,
// same-run A/B against the dequantised-tile Q.K, 8-16 heads, two rounds (RESULTS.md,
// fifty-seventh session): C4 Pro at 128 / 512 tokens -4..-6% / -9..-10%, C128 at 64-128 tokens
// -4..-6%, the window layer at 512 -2..-3%; forced on, splits of one partial tile (the window
// layer and C4 at 1-16 tokens: 32-72 entries) ran 2-8% slower, hence the rule. On the anchored
// map (C128 above 256 tokens; an instance of its own since the fifty-eighth session, before which
// those calls kept the other tile): C128 x 300-512 tokens -4..-5%, the straggler layer at 300 /
// 512 tokens +1..+2% / -1% (its short rows make short splits that the width does not show).
constexpr int64_t kRawQKMinSplitRows = 128;
inline bool decode_raw_qk(const SparseDecodeParams& p) {
  static const int mode = env_int("MLA_EXT_RAWQK", 2);
  if (mode == 0) return false;
  if (mode == 1) return true;
  const int64_t width = p.main.width + (p.extra.cache != nullptr ? p.extra.width : 0);
  return width >= kRawQKMinSplitRows * int64_t(p.num_splits);
}

// The two-token mode (decode_two_token_blocks) of a call: p.two_token where set,
// else the environment variable MLA_EXT_TWO_TOKEN (read once; "0" never, "2"
// wherever allowed, for A/B runs), else automatic.
inline int decode_two_token_mode(const SparseDecodeParams& p) {
  static const int env = env_int("MLA_EXT_TWO_TOKEN", 1);
  if (p.two_token != 0) return p.two_token;
  return env == 0 ? 1 : (env == 2 ? 2 : 0);
}

// The most column chunks the reduce may use (decode_reduce_chunks): kReduceMaxChunks unless
// the environment variable MLA_EXT_REDUCE_CHUNKS (read once) is 1 (never chunk) or 2.
inline int decode_reduce_chunk_cap() {
  static const int cap = int(env_int("MLA_EXT_REDUCE_CHUNKS", 0));
  return cap >= 1 && cap < kReduceMaxChunks ? cap : kReduceMaxChunks;
}

// The active splits' table of a call (decode_active_splits_table), the last one computed kept
// per host thread: an engine's eager calls repeat a shape across its layers, and a miss costs
// 32 evaluations of the cost model (0.5 us on this project's x86 build machine at -O2). The
// environment variable MLA_EXT_ACTIVE_SPLITS (read
// once; sweeps and A/B runs) set to 1..7 fills every entry with that count where the grid allows.
inline ActiveSplits decode_active_table(int64_t T, int64_t H, int64_t W, int num_sms, int S) {
  static const int force = int(env_int("MLA_EXT_ACTIVE_SPLITS", 0));
  struct Key {
    int64_t t, h, w;
    int sms, s;
  };
  static thread_local Key key{-1, -1, -1, 0, 0};
  static thread_local ActiveSplits table;
  if (key.t != T || key.h != H || key.w != W || key.sms != num_sms || key.s != S) {
    table = decode_active_splits_table(T, H, W, num_sms, S, force);
    key = Key{T, H, W, num_sms, S};
  }
  return table;
}

// A kernel on either balanced map: its anchored instance where the call runs the anchored map
// (a.anchored; every tile and kernel kind has one), else the plain one.
template <int MT, int DQK, KvFormat F, bool MMA, bool BAL, bool WG = false, bool ASYM = false>
inline Status launch_split_map(const DecodeArgs& a, uint32_t blocks, gpuStream_t stream) {
  if constexpr (BAL) {
    if (a.anchored) return launch_split<MT, DQK, F, MMA, BAL, WG, ASYM, false, false, true>(a, blocks, stream);
  }
  return launch_split<MT, DQK, F, MMA, BAL, WG, ASYM>(a, blocks, stream);
}

// wg: the 64-head tile as warpgroup MMAs (Hopper), every format.
template <int DQK, KvFormat F, bool MMA, bool BAL = false>
inline Status launch_split_mt(int mt, bool wg, const DecodeArgs& a, uint32_t blocks, gpuStream_t stream) {
  switch (mt) {
    case 1:
      if constexpr (MMA && (kv_layout(F) == KvFormat::kFP8DsMlaV4 ||
                            (kv_layout(F) == KvFormat::kFP8DsMla && DQK == 576 && !BAL))) {
        if (wg && !a.two_token && !a.anchored && decode_use_asym16<F>(a)) {
          // (kUnsupported: a shared-memory limit below its 157-176 KB; the mma.sync tile below)
          const Status st = launch_split<1, DQK, F, MMA, BAL, true, true>(a, blocks, stream);
          if (st != Status::kUnsupported) return st;
        }
      }
      if constexpr (MMA && kv_layout(F) == KvFormat::kFP8DsMlaV4 && !BAL) {
        if (a.q_regs) return launch_split<1, DQK, F, MMA, BAL, false, false, false, true>(a, blocks, stream);
      }
      if constexpr (MMA && kv_layout(F) == KvFormat::kFP8DsMlaV4 && DQK == 512) {
        if (a.raw_qk) {
          if constexpr (BAL) {
            if (a.anchored)
              return launch_split<1, DQK, F, MMA, BAL, false, false, false, false, true, false, true>(a, blocks, stream);
          }
          return launch_split<1, DQK, F, MMA, BAL, false, false, false, false, false, false, true>(a, blocks, stream);
        }
      }
      return launch_split_map<1, DQK, F, MMA, BAL>(a, blocks, stream);
    case 2:
      return launch_split_map<2, DQK, F, MMA, BAL>(a, blocks, stream);
    default:
      if constexpr (MMA) {
        // Asymmetric warpgroups (decode_body's ASYM) for the V4 rows, both
        // split maps, unless MLA_EXT_ASYM=0 (decode_use_asym).
        if constexpr (kv_layout(F) == KvFormat::kFP8DsMla && DQK == 576 && !BAL) {
          if (wg && decode_use_asym()) {
            if (a.head_groups == 2 && decode_use_cluster()) {
              // (kUnsupported without cluster launches, CUDA < 12.3, or without room for a
              // 2-block cluster: the one-block kernel)
              const Status st =
                  launch_split<4, DQK, F, MMA, false, true, true, false, false, false, true>(a, blocks, stream);
              if (st != Status::kUnsupported) return st;
            }
            return launch_split<4, DQK, F, MMA, false, true, true>(a, blocks, stream);
          }
        }
        if constexpr (kv_layout(F) == KvFormat::kFP8DsMlaV4 && DQK == 512) {
          if (wg && decode_use_asym()) {
            if constexpr (!BAL) {
              if (a.two_token) {  // two tokens per block: half the blocks (one split)
                const uint32_t blocks2 = uint32_t(a.head_groups) * uint32_t((a.p.num_tokens + 1) / 2);
                return launch_split<4, DQK, F, MMA, false, true, true, true>(a, blocks2, stream);
              }
            }
            return launch_split_map<4, DQK, F, MMA, BAL, true, true>(a, blocks, stream);
          }
        }
        if (wg) return launch_split_map<4, DQK, F, MMA, BAL, true>(a, blocks, stream);
      }
      return launch_split_map<4, DQK, F, MMA, BAL>(a, blocks, stream);
  }
}

template <bool MMA>
inline Status launch_split_fmt(int mt, bool wg, const DecodeArgs& a, uint32_t blocks, gpuStream_t stream) {
  const SparseDecodeParams& p = a.p;
  switch (p.kv_format) {
    case KvFormat::kBF16:
      return p.d_qk == 576 ? launch_split_mt<576, KvFormat::kBF16, MMA>(mt, wg, a, blocks, stream)
                           : launch_split_mt<512, KvFormat::kBF16, MMA>(mt, wg, a, blocks, stream);
    case KvFormat::kFP8DsMla:
      return launch_split_mt<576, KvFormat::kFP8DsMla, MMA>(mt, wg, a, blocks, stream);
    case KvFormat::kFP8DsMlaV4:  // V4 formats: the balanced map has its own instantiation
      return a.balanced ? launch_split_mt<512, KvFormat::kFP8DsMlaV4, MMA, true>(mt, wg, a, blocks, stream)
                        : launch_split_mt<512, KvFormat::kFP8DsMlaV4, MMA>(mt, wg, a, blocks, stream);
    case KvFormat::kFP8DsMlaFnuz:
      return launch_split_mt<576, KvFormat::kFP8DsMlaFnuz, MMA>(mt, wg, a, blocks, stream);
    case KvFormat::kFP8DsMlaV4Fnuz:
      return a.balanced ? launch_split_mt<512, KvFormat::kFP8DsMlaV4Fnuz, MMA, true>(mt, wg, a, blocks, stream)
                        : launch_split_mt<512, KvFormat::kFP8DsMlaV4Fnuz, MMA>(mt, wg, a, blocks, stream);
  }
  return Status::kInvalidArgument;
}

inline bool aligned16(const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15u) == 0; }

inline bool check_set(const KvSet& s, KvFormat f, int d_qk, bool required) {
  if (s.cache == nullptr) return !required;
  if (s.width < 0 || s.page_size <= 0 || s.page_size > 0x7fffffff || s.num_slots < 0) return false;
  if (s.width > 0 && s.indices == nullptr) return false;
  if (s.indices_stride_token < 0 || s.lengths_stride < 0 || s.page_stride_bytes < 0) return false;
  if (!aligned16(s.cache) || (s.page_stride_bytes & 15) != 0) return false;
  f = kv_layout(f);
  if (f == KvFormat::kFP8DsMlaV4)  // page: page_size data rows, then page_size scale rows
    return s.page_stride_bytes >= s.page_size * (kFP8DsMlaV4DataBytes + kFP8DsMlaV4ScaleBytes) ||
           s.num_slots <= s.page_size;  // one page: its stride is never used
  if ((s.token_stride_bytes & 15) != 0) return false;
  const int64_t row = f == KvFormat::kBF16 ? int64_t(2) * d_qk : int64_t(kFP8DsMlaRowBytes);
  return s.token_stride_bytes >= row || s.page_size == 1;
}

}  // namespace decode_detail

// For the automatic split count's callers (the op and the C API).
using decode_detail::decode_wide16_rows;

// Launch sparse MLA decode (DESIGN.md §4). p.num_splits must be resolved
// (1..kMaxSplits); num_splits > 1 needs decode_workspace_size(T, H, S) bytes of
// workspace (any contents). num_sms (the processor count; <= 0: 128 assumed)
// picks the head tile and the reduce's block shape (the split count is already
// resolved; neither changes the workspace). auto_splits: p.num_splits is the
// automatic count for num_sms (decode_auto_splits), so that the balanced map may use
// fewer of its slots by the rows' lengths (decode_active_splits_table; results agree
// up to rounding with any other split count). No
// allocation, no host sync; launches on stream. The caller's preconditions (a
// finite scale, 4-byte aligned int32 / fp32 arrays, non-negative q / output / lse
// strides, unshared output rows): see the top of this file.
inline Status launch_sparse_mla_decode(const SparseDecodeParams& p, void* workspace, size_t workspace_bytes,
                                       int num_sms, gpuStream_t stream, bool auto_splits = false) {
  using namespace decode_detail;
  if (p.num_tokens < 0 || p.num_heads < 0) return Status::kInvalidArgument;
  if (p.num_splits < 1 || p.num_splits > kMaxSplits) return Status::kInvalidArgument;
  if (p.two_token < 0 || p.two_token > 2) return Status::kInvalidArgument;
  if (!kv_format_d_qk_ok(p.kv_format, p.d_qk)) return Status::kInvalidArgument;
  if (!decode_overrides_ok(p.head_tile, p.smem_limit)) return Status::kInvalidArgument;
  if (p.num_tokens == 0 || p.num_heads == 0) return Status::kSuccess;
  if (p.q == nullptr || p.output == nullptr) return Status::kInvalidArgument;
  if (!aligned16(p.q) || (p.q_stride_token & 7) != 0 || (p.q_stride_head & 7) != 0)
    return Status::kInvalidArgument;
  if (!check_set(p.main, p.kv_format, p.d_qk, true)) return Status::kInvalidArgument;
  if (!check_set(p.extra, p.kv_format, p.d_qk, false)) return Status::kInvalidArgument;
  if (p.attn_sink != nullptr && p.attn_sink_stride < 0) return Status::kInvalidArgument;

  const int64_t T = p.num_tokens, H = p.num_heads;
  const int S = p.num_splits;
  // Bounds first, so that no product below can overflow (blocks <= T * H * 256).
  constexpr int64_t kMax31 = int64_t(1) << 31;
  if (T >= kMax31 || H >= kMax31 || T * H >= kMax31) return Status::kInvalidArgument;
  int64_t HT = p.head_tile > 0 ? (p.head_tile < H ? p.head_tile : H) : decode_launch_head_tile(T, H, S, num_sms);
  int64_t HG = (H + HT - 1) / HT;
  int mt = HT <= 16 ? 1 : (HT <= 32 ? 2 : 4);
  int64_t blocks = HG * S * T;
  if (blocks >= kMax31) return Status::kInvalidArgument;
  if (blocks * ((HT + 15) / 16) >= kMax31) return Status::kInvalidArgument;  // room for 16-head tiles (below)

  DecodeArgs a;
  a.p = p;
  a.ws_out = nullptr;
  a.ws_lse = nullptr;
  a.ws_map = nullptr;
  if (S > 1) {
    const size_t need = decode_workspace_size(T, H, S);
    if (workspace == nullptr || workspace_bytes < need) return Status::kWorkspaceTooSmall;
    // the kernels read and write it with 8- and 16-byte accesses
    if ((reinterpret_cast<uintptr_t>(workspace) & 15u) != 0) return Status::kInvalidArgument;
    a.ws_out = static_cast<float*>(workspace);
    a.ws_lse = reinterpret_cast<float*>(static_cast<uint8_t*>(workspace) + decode_partial_out_bytes(T, H, S));
    a.ws_map = reinterpret_cast<uint2*>(reinterpret_cast<uint8_t*>(a.ws_lse) + decode_partial_lse_bytes(T, H, S));
  }
  a.head_tile = int(HT);
  a.head_groups = int(HG);
  a.scale_log2 = p.softmax_scale * kLog2e;
  a.out_pairs = (reinterpret_cast<uintptr_t>(p.output) & 3u) == 0 && (p.output_stride_token & 1) == 0 &&
                (p.output_stride_head & 1) == 0;
  a.out_vec16 = (reinterpret_cast<uintptr_t>(p.output) & 15u) == 0 && (p.output_stride_token & 7) == 0 &&
                (p.output_stride_head & 7) == 0;
  a.balanced = decode_balanced(p);
  // Automatic counts on the balanced map: the slots in use by the rows' lengths.
  a.active = a.balanced && auto_splits ? decode_active_table(T, H, decode_total_width(p), num_sms, S)
                                       : ActiveSplits();
  // The anchored map (decode_active_slack): every kernel kind and head tile has an anchored
  // instance (launch_split_map). Until the fortieth session only the 16-head tile, the 32-head
  // tensor-core tile and the asymmetric 64-head tile had one, and the rest kept the contiguous
  // map, which on the H200 cost +12..+31% on rows of about equal length at 64-128 heads x
  // 264-512 tokens against one split (MLA_EXT_ASYM=0, force_mma_sync, portable; RESULTS.md).
  a.anchored = a.active.on() && decode_active_slack(T);
  // Two-token blocks where the asymmetric kernel runs (launch_split_mt); the uniform
  // map always with one split (decode_balanced).
  a.two_token = !a.balanced && decode_two_token_blocks(p, HG, num_sms, decode_two_token_mode(p));
  // Early trigger only toward the reduce (the kernel after it is the caller's: compat.h).
  a.early_trigger = S > 1 && pdl_trigger_early(blocks, num_sms);
  a.q_regs = decode_q_regs(p, blocks, num_sms);
  a.raw_qk = decode_raw_qk(p);
  a.smem_limit = decode_smem_limit(p, current_device_smem_optin());
  // Half the head tile (at most 16 * m heads), for a device whose blocks cannot
  // have the shared memory of the current tile's kernel.
  auto halve_tile = [&]() {
    mt /= 2;
    if (HT > 16 * mt) HT = 16 * mt;
    HG = (H + HT - 1) / HT;
    blocks = HG * S * T;
    a.head_tile = int(HT);
    a.head_groups = int(HG);
    a.early_trigger = S > 1 && pdl_trigger_early(blocks, num_sms);
    a.q_regs = decode_q_regs(p, blocks, num_sms);
    a.two_token = false;
  };

  // Tensor cores on NVIDIA sm_80+ unless forced portable (the tensor-core
  // kernels' shared-memory requests exceed what older GPUs have); HIP always portable.
  // On Hopper (compute capability 9) the 64-head tile uses the warpgroup-MMA
  // kernel unless p.force_mma_sync.
  Status st;
  const int cc = current_device_cc_major();
  if (kWarpSize == 32 && !p.force_portable && cc >= 8) {
    const bool wg = cc == 9 && !p.force_mma_sync;
    st = launch_split_fmt<kWarpSize == 32>(mt, wg, a, uint32_t(blocks), stream);  // never the MMA kernel on HIP
    // The tensor-core kernels need 96-226 KB of shared memory per block
    // (Cfg): more than A100s give the 64-head kernels of d_qk 576, or sm_86 /
    // sm_89 GPUs (99 KB) any kernel above 16 heads and the 16-head ones of
    // d_qk 576 (bf16 and V3.2 rows; launch_split returns
    // kUnsupported, launching nothing). Smaller head tiles, then the portable
    // kernels (<= 48 KB) take the call; the workspace does not depend on either.
    while (st == Status::kUnsupported && mt > 1) {
      halve_tile();
      st = launch_split_fmt<kWarpSize == 32>(mt, wg, a, uint32_t(blocks), stream);
    }
    if (st == Status::kUnsupported) st = launch_split_fmt<false>(mt, false, a, uint32_t(blocks), stream);
  } else {
    st = launch_split_fmt<false>(mt, false, a, uint32_t(blocks), stream);
  }
  if (st != Status::kSuccess || S == 1) return st;

  ReduceArgs r;
  r.p = p;
  r.ws_out = a.ws_out;
  r.ws_lse = a.ws_lse;
  r.out_vec4 = (reinterpret_cast<uintptr_t>(p.output) & 7u) == 0 && (p.output_stride_token & 3) == 0 &&
               (p.output_stride_head & 3) == 0;
  r.balanced = a.balanced;
  r.anchored = a.anchored;
  r.ws_map = a.ws_map;
  const uint32_t rows = uint32_t(T * H);
  // More than two batches of splits: column groups (H200, one token: 65 splits 18.9 -> 17.7 us
  // at 16 heads; two batches in two groups gained nothing against the barrier they add). Only
  // while the rows fit one wave of these one-per-processor blocks (95 registers x up to 640
  // threads); more rows keep the 128-thread blocks, several per processor.
  const int64_t one_wave = num_sms > 0 ? num_sms : 128;
  // At most half / a quarter as many rows as processors: each row's columns over 2 / 4 blocks
  // (at most 2 with 64-lane warps: kReduceMaxChunks), so that more processors read the
  // partials (65 splits: 130 KB per row; decode_reduce_chunks).
  if (S > 2 * kReduceScanBatch && !a.balanced && int64_t(rows) <= one_wave) {
    const int chunks = decode_reduce_chunks(rows, S, false, one_wave, decode_reduce_chunk_cap());
    if (chunks > 2) return launch_reduce<true, 8, true, kReduceMaxChunks>(r, rows, stream);
    if (chunks == 2) return launch_reduce<true, 8, true, 2>(r, rows, stream);
    return launch_reduce<true, 8, true>(r, rows, stream);
  }
  if (S >= kReduceBlockScanSplits) return launch_reduce<true>(r, rows, stream);
  // The anchored map at 17-128 heads (decode_active_wide; S = kActiveWideGrid <
  // kReduceBlockScanSplits): kReduceAnchoredHeads heads per block. Not at 1-16 heads, where the
  // empty blocks are fewer (512 tokens x 16 heads: 6.9 -> 2.7 us) and a straggler's row of up
  // to 5 x T cells, folded 4 heads in turn, cost more (the straggler layer at 16 x 384 tokens:
  // +6.6%; H200, thirty-ninth session).
  if (a.anchored && decode_active_wide(T, H)) {
    const int64_t blocks = T * ((H + kReduceAnchoredHeads - 1) / kReduceAnchoredHeads);
    return launch_reduce<false, 8, false, 1, kReduceAnchoredHeads>(r, uint32_t(blocks), stream);
  }
  if (a.balanced) return launch_reduce<false, 8>(r, rows, stream);  // a token may own many more than S splits
  if (S <= 2) return launch_reduce<false, 2>(r, rows, stream);
  if (S <= 4) return launch_reduce<false, 4>(r, rows, stream);
  return launch_reduce<false, 8>(r, rows, stream);
}

}  // namespace mla_ext
