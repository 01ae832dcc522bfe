// sparse_mla_decode: parameters, split-K policy and workspace layout
// (DESIGN.md §4). Shared by the GPU kernels (sparse_mla_decode.cuh), the CPU
// twin (csrc/cpu/sparse_mla_decode.cpp) and the torch binding, so that all of
// them size the workspace and split the work the same way. No GPU or torch
// includes here.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "mla_ext/numerics.h"  // MLA_EXT_HD

namespace mla_ext {

enum class KvFormat : int {
  kBF16 = 0,            // [num_pages, page_size, d_qk] bf16
  kFP8DsMla = 1,        // DeepSeek V3.2: 656 B/token inline (512 e4m3fn + 4 fp32 scales + 64 bf16 RoPE)
  kFP8DsMlaV4 = 2,      // DeepSeek V4: 584 B/token, page = data rows (576 B each) then 8 B scale rows
  kFP8DsMlaFnuz = 3,    // kFP8DsMla's bytes, latent values e4m3fnuz (gfx942 / MI300 engines)
  kFP8DsMlaV4Fnuz = 4,  // kFP8DsMlaV4's bytes, values e4m3fnuz (same UE8M0 scales)
};

// The byte layout of a format: a fnuz format reads exactly like its OCP
// e4m3fn twin, only the FP8 value bytes decode differently.
MLA_EXT_HD constexpr KvFormat kv_layout(KvFormat f) {
  return f == KvFormat::kFP8DsMlaFnuz ? KvFormat::kFP8DsMla
                                      : (f == KvFormat::kFP8DsMlaV4Fnuz ? KvFormat::kFP8DsMlaV4 : f);
}
// True when the FP8 bytes are e4m3fnuz (bias 8, 0x80 = NaN, 0x7f/0xff = +-240).
MLA_EXT_HD constexpr bool kv_is_fnuz(KvFormat f) {
  return f == KvFormat::kFP8DsMlaFnuz || f == KvFormat::kFP8DsMlaV4Fnuz;
}
MLA_EXT_HD constexpr bool kv_format_valid(KvFormat f) {
  return int(f) >= int(KvFormat::kBF16) && int(f) <= int(KvFormat::kFP8DsMlaV4Fnuz);
}
// A known format with a d_qk it has: V3.2 rows 576, V4 rows 512, bf16 caches either.
MLA_EXT_HD constexpr bool kv_format_d_qk_ok(KvFormat f, int d_qk) {
  return kv_format_valid(f) && (d_qk == 512 || d_qk == 576) &&
         !(kv_layout(f) == KvFormat::kFP8DsMla && d_qk != 576) && !(kv_layout(f) == KvFormat::kFP8DsMlaV4 && d_qk != 512);
}
// The call's GPU overrides in range (SparseDecodeParams::head_tile 0..64, smem_limit >= 0): refused
// alike by the launcher (for every call, empty ones too) and the C API's split-count query.
MLA_EXT_HD constexpr bool decode_overrides_ok(int head_tile, int64_t smem_limit) {
  return head_tile >= 0 && head_tile <= 64 && smem_limit >= 0;
}

constexpr int kDV = 512;           // value dims (both geometries)
constexpr int kMaxSplits = 256;    // explicit num_splits range is 1..kMaxSplits
// The automatic policy's cap. H200, one token: 130 splits instead of 64 made V4 C128 at 16 heads
// 4 us faster but 8 us slower at 128 heads (two waves of the 64-head kernel) and up to 15 us
// slower when the rows are shorter than the index width (mostly empty splits). The tile
// rounding of decode_num_splits may add up to 1/8 more (at most 72).
constexpr int kMaxAutoSplits = 64;
// Entries per tile step of the GPU split kernel (tensor-core path); the split policy rounds to it.
constexpr int64_t kDecodeTileRows = 64;
constexpr int kFP8DsMlaRowBytes = 656;
constexpr int kFP8DsMlaV4RowBytes = 584;
constexpr int kFP8DsMlaV4DataBytes = 576;   // per-token data row inside a V4 page
constexpr int kFP8DsMlaV4ScaleBytes = 8;    // 7 UE8M0 bytes + 1 pad, after all data rows

// One index set (main or extra) over one paged cache.
struct KvSet {
  const uint8_t* cache = nullptr;   // base of the cache (bytes); nullptr = set absent
  int64_t page_stride_bytes = 0;    // bytes between pages (tensor stride(0) * element size)
  int64_t token_stride_bytes = 0;   // bytes between tokens inside a page (bf16 / fp8_ds_mla)
  int64_t page_size = 0;            // tokens per page
  int64_t num_slots = 0;            // num_pages * page_size; slots >= this are invalid
  const int32_t* indices = nullptr; // [num_tokens, width], element stride 1 along width
  int64_t indices_stride_token = 0; // elements
  int64_t width = 0;
  const int32_t* lengths = nullptr; // optional [num_tokens]; positions >= lengths[t] are skipped
  int64_t lengths_stride = 1;       // elements
};

// Checked by launch_sparse_mla_decode: the ranges noted below and the alignment
// of q and cache rows (16 bytes). Left to the caller (the torch op and the C API
// check them): a finite softmax_scale; indices, lengths, attn_sink and lse 4-byte
// aligned; q, output and lse strides >= 0; output rows and lse elements that no two
// (token, head) pairs share; output, lse and workspace not overlapping any input.
struct SparseDecodeParams {
  KvFormat kv_format = KvFormat::kFP8DsMlaV4;
  int d_qk = 512;                   // 576 (V3.2) or 512 (V4); V = first 512 dims
  int64_t num_tokens = 0;
  int64_t num_heads = 0;
  float softmax_scale = 1.f;

  const uint16_t* q = nullptr;      // bf16 bits, [num_tokens, num_heads, d_qk], last dim contiguous
  int64_t q_stride_token = 0, q_stride_head = 0;

  KvSet main;                       // required
  KvSet extra;                      // optional (extra.cache == nullptr when absent)

  const float* attn_sink = nullptr; // optional [num_heads] fp32 logits
  int64_t attn_sink_stride = 1;

  uint16_t* output = nullptr;       // bf16 bits, [num_tokens, num_heads, 512], last dim contiguous
  int64_t output_stride_token = 0, output_stride_head = 0;
  float* lse = nullptr;             // optional [num_tokens, num_heads] fp32, natural log, sink excluded
  int64_t lse_stride_token = 0, lse_stride_head = 0;

  int num_splits = 1;               // resolved split count, 1..kMaxSplits
  bool force_portable = false;      // GPU: use the portable (no tensor-core) path
  bool force_mma_sync = false;      // GPU, Hopper: 64-head blocks on mma.sync instead of
                                    // warpgroup MMAs (tests and A/B runs); results agree up to rounding
  int head_tile = 0;                // GPU heads per block: 0 = automatic (decode_launch_head_tile),
                                    // 1..64 forces one (tests and sweeps); results agree up to rounding
  int two_token = 0;                // GPU, V4 64-head blocks: 0 = automatic (decode_two_token_blocks),
                                    // 1 = never, 2 = wherever allowed (tests and A/B runs); bit-identical
  int64_t smem_limit = 0;           // GPU: shared memory one block may use, bytes; 0 = the device's
                                    // opt-in limit (larger values count as it). Smaller values test
                                    // the fallback to smaller head tiles and the portable kernels that
                                    // GPUs with less than the 64-head kernels' 159-215 KB take (A100,
                                    // sm_86 / sm_89)
};

// ---------------------------------------------------------------------------
// Split-K policy. Depends on shapes and the processor count only (never on
// tensor contents), so a CUDA graph captured once stays valid when indices and
// lengths change. Invariant relied on by workspace sizing:
//   decode_num_splits(T, H, W, n, map, gpu) <= decode_max_auto_splits(T, H, n, map, gpu)
// for all W, and decode_workspace_size_for covers it.
// ---------------------------------------------------------------------------

// ceil(a / b) for a >= 0, b > 0, without the a + b - 1 that overflows near INT64_MAX (the C
// API's policy query takes any non-negative num_heads).
inline int64_t decode_ceil_div(int64_t a, int64_t b) { return a / b + (a % b != 0 ? 1 : 0); }

// Heads handled together by one GPU block (the head tile). Blocks per
// (token, split) = ceil(num_heads / head tile).
inline int64_t decode_head_tile(int64_t num_heads) { return num_heads <= 64 ? num_heads : 64; }

inline int64_t decode_head_groups(int64_t num_heads) {
  const int64_t tile = decode_head_tile(num_heads);
  return tile > 0 ? decode_ceil_div(num_heads, tile) : 0;
}

// Blocks of `groups` head groups per (token, split) that fit one per processor
// for num_tokens tokens: floor(sms / (num_tokens * groups)), by two divisions so
// that no product can overflow (the C API passes any num_tokens >= 0).
inline int64_t decode_one_wave_splits(int64_t sms, int64_t num_tokens, int64_t groups) {
  if (num_tokens <= 0 || groups <= 0) return sms;
  return sms / num_tokens / groups;
}

// Splits per (token, head group) before tile rounding: ~2 blocks per
// processor, capped at kMaxAutoSplits.
inline int decode_base_splits(int64_t num_tokens, int64_t num_heads, int num_sms) {
  if (num_tokens <= 0 || num_heads <= 0) return 1;
  const int64_t target = 2 * int64_t(num_sms > 0 ? num_sms : 1);  // ~2 blocks per processor
  // Round down: T * groups * s stays within one wave of `target` blocks (rounding
  // up left a mostly idle second wave, e.g. 320 blocks on 264 slots).
  int64_t s = decode_one_wave_splits(target, num_tokens, decode_head_groups(num_heads));
  if (s < 1) s = 1;
  if (s > kMaxAutoSplits) s = kMaxAutoSplits;
  return int(s);
}

// The balanced split map's range (decode_balanced, below: up to kBalanceMapMaxTokens tokens,
// two per thread of a split block), and the policy's two-split floor for rows this long
// (decode_num_splits: up to kBalanceMaxTokens tokens).
constexpr int64_t kBalanceMaxTokens = 256;
constexpr int64_t kBalanceMapMaxTokens = 512;
constexpr int64_t kBalanceMinWidth = 4096;  // W_main + W_extra: long compressed rows (V4 C128)
// The token count and widths of a call that can take the balanced map (decode_balanced: a V4 FP8
// call with lengths; the C API's split-count query assumes one). Until the thirty-sixth session
// the map stopped at 256 tokens (one token per thread) and 257-512 took the uniform map.
MLA_EXT_HD bool decode_balanced_width(int64_t num_tokens, int64_t total_width) {
  return num_tokens >= 2 && num_tokens <= kBalanceMapMaxTokens && total_width >= kBalanceMinWidth;
}

// Two-split floor: calls of 2..kBalanceMaxTokens tokens whose index sets are
// long (total width >= kBalanceMinWidth: V4 C128 layers) get at least two
// splits, where one wave of blocks or two blocks per processor would leave
// one, because the V4 formats' balanced map (decode_balanced: S > 1) then
// deals the T x 2 split slots by row length, so one long row among short ones
// no longer walks its whole length on one block. H200, one 8320-entry token
// among ~610-entry ones, one split -> two: 128 heads x 64 tokens 425 -> 151 us
// (eighth session), 128 x 128 366 -> 215, 64 x 256 363 -> 216, 16 x 256 280 ->
// 117; uniform rows of that width pay the second split's reduce: +1.7..5.4%
// (128 x 128 1220 -> 1240 us, 16 x 256 694 -> 732; twelfth session). Calls
// that cannot take the balanced map (bf16 caches, no lengths array) would only
// pay the reduce: the launchers apply the floor to the calls that can
// (decode_auto_splits).
inline int decode_two_split_floor(int s, int64_t num_tokens, int64_t num_heads, int64_t total_width) {
  if (s < 2 && num_heads > 0 && total_width >= kBalanceMinWidth && num_tokens >= 2 &&
      num_tokens <= kBalanceMaxTokens)
    return 2;
  return s;
}

// The most splits the wave count (decode_wave_splits) can pick for (T, H) on a
// device with num_sms processors, whatever the index widths: the base count plus the
// tile rounding's headroom (up to 1/8 more, within one block per processor),
// and at least two for 2..kBalanceMaxTokens tokens (the two-split floor; not
// with floor = false, the bound for calls that cannot take the balanced map).
inline int decode_wave_max_splits(int64_t num_tokens, int64_t num_heads, int num_sms, bool floor = true) {
  const int s = decode_base_splits(num_tokens, num_heads, num_sms);
  if (num_tokens <= 0 || num_heads <= 0) return s;
  int64_t ext = int64_t(s) + s / 8;
  const int64_t one_wave =
      decode_one_wave_splits(int64_t(num_sms > 0 ? num_sms : 1), num_tokens, decode_head_groups(num_heads));
  if (ext > one_wave) ext = one_wave;
  if (floor) ext = decode_two_split_floor(int(ext), num_tokens, num_heads, kBalanceMinWidth);  // any width
  return ext > s ? int(ext) : s;
}

// Minimum index entries a split should own before splitting further pays: 32
// (half a tensor-core tile; the kernels skip a tile's rows past its split's
// end) up to 32 splits, then 64 (the reduction reads every
// split's 2 KB per head, and with many splits that dominates). Fitted to the
// H200 split sweep in benchmarks/RESULTS.md (2026-11-30): 32-entry splits win
// 1-2 us at one token for 128-640 entries; for 2048 entries 32 splits beat 64.
constexpr int64_t kMinEntriesPerSplit = 32;
constexpr int64_t kMinEntriesPerManySplits = 64;
constexpr int64_t kManySplits = 32;

// Widths above this are treated as this by the policy (no overflow; the
// answer is the same: the split count is capped far below).
constexpr int64_t kMaxPolicyWidth = int64_t(1) << 40;

// Splits worth having for total_width index entries: one per 32 entries up to
// 32 splits, then one per 64 (never fewer than 32 there).
inline int64_t decode_width_splits(int64_t total_width) {
  if (total_width > kMaxPolicyWidth) total_width = kMaxPolicyWidth;
  int64_t by_width = (total_width + kMinEntriesPerSplit - 1) / kMinEntriesPerSplit;
  if (by_width > kManySplits) {  // monotonic in the width: 32 splits until 64-entry splits give more
    by_width = (total_width + kMinEntriesPerManySplits - 1) / kMinEntriesPerManySplits;
    if (by_width < kManySplits) by_width = kManySplits;
  }
  return by_width < 1 ? 1 : by_width;
}

// Tile rounding: a split walks its entries in tiles of kDecodeTileRows, so
// 8320 entries over 64 splits (130 each) cost 3 tile steps where 65 splits
// (128 each) cost 2. The splits that save a tile step when that needs at most
// `limit` splits, else s.
inline int decode_round_splits(int s, int64_t total_width, int64_t limit) {
  const int64_t per = (total_width + s - 1) / s;
  if (per > kDecodeTileRows) {
    const int64_t steps = (per + kDecodeTileRows - 1) / kDecodeTileRows;
    const int64_t s2 = (total_width + (steps - 1) * kDecodeTileRows - 1) / ((steps - 1) * kDecodeTileRows);
    if (s2 <= limit) return int(s2);
  }
  return s;
}

// Heads per GPU block (the head tile). A block of up to 64 heads gathers and
// dequantises each KV tile once for all of them, which pays when a call has
// blocks enough to fill the GPU. With few blocks (small T) most processors
// idle while each block walks a long chain, so the GPU launcher takes the
// smallest tile of 16 / 32 heads whose blocks still fit one per processor, for
// the split count it is given (H200 sweeps, benchmarks/RESULTS.md, eighth
// session: at equal split counts the smaller tile that fits was faster in
// every case measured, e.g. C128 one token, 32 heads, 65 splits: 17.2 us in
// 16-head blocks, 19.7 in one 32-head block; two 16-head blocks sharing a
// processor lost to one 32-head block).
inline bool decode_tile_fits_one_wave(int64_t ht, int64_t num_tokens, int64_t num_heads, int64_t num_splits,
                                      int64_t sms) {
  const int64_t groups = decode_ceil_div(num_heads, ht);
  return (num_splits < 1 ? 1 : num_splits) <= decode_one_wave_splits(sms, num_tokens, groups);
}

// The head tile the GPU launcher uses for a call of T tokens, H heads and S
// resolved splits on num_sms processors (<= 0: 128 assumed): the smallest of
// 16 / 32 heads that fits one wave, else decode_head_tile(H). Shapes and
// processor count only (graph-safe); neither the workspace nor the results'
// semantics depend on it.
inline int64_t decode_launch_head_tile(int64_t num_tokens, int64_t num_heads, int num_splits, int num_sms) {
  const int64_t big = decode_head_tile(num_heads);
  const int64_t sms = num_sms > 0 ? num_sms : 128;
  for (int64_t ht = 16; ht < big; ht *= 2)
    if (decode_tile_fits_one_wave(ht, num_tokens, num_heads, num_splits, sms)) return ht;
  return big;
}

// Column chunks of the GPU reduce for a call of `rows` (token, head) rows and S
// resolved splits: with more than 32 splits (the reduce's column groups: C128
// rows of 8320 entries take 65), a row's 512 columns go to 2 blocks when there
// are at most half as many rows as processors and to 4 at most a quarter (at most
// max_chunks: 2 with 64-lane warps), whatever the token count (H200: 1 token x
// up to 33 heads -> 4, 34-66 heads -> 2), so that more processors read its
// partials (65 splits: 130 KB per row). H200, one token (twenty-fifth session):
// C128 8 / 16 / 64 heads -8 / -7 / -2.5%, the straggler layer at 8 heads -11%; at
// 20-32 splits (C4, V3.2: 40-64 KB per row) the same chunks cost +2..+4%, hence
// the 32. Uniform map only. Shapes and processor count only (graph-safe; a given
// call is bit-reproducible).
inline int decode_reduce_chunks(int64_t rows, int num_splits, bool balanced, int64_t sms, int max_chunks) {
  if (balanced || num_splits <= 32 || rows <= 0) return 1;
  const int64_t room = (sms > 0 ? sms : 128) / rows;
  int c = 1;
  while (c * 2 <= max_chunks && c * 2 <= room) c *= 2;
  return c;
}

// Rows per split up to which the automatic split count (below) gives up splits
// to let a smaller head tile fit: 16 heads while a split stays within one tile
// step (64 rows), 32 heads up to 160 rows (H200 sweeps, eighth session: 32-head
// blocks with 80-144 rows per split beat 64-head blocks with half as many rows;
// with ~250 rows they lose ~1 us or tie). Fitted to a handful of points.
constexpr int64_t kHeadTile16MaxRows = kDecodeTileRows;
constexpr int64_t kHeadTile32MaxRows = 160;
// Entries per split at least, in 32- and 64-head blocks: one tile. The reduce
// reads every split's 2 KB per head, so with many heads short splits cost more
// there than they save in the split kernel. H200 split sweep, L2-cold (thirtieth
// session), the 14 shapes this changes: C4 Pro x 1-4 tokens x 24-128 heads
// -0.3..-1.5 us (128 heads x 1 token: 32 splits 13.95 -> 18 splits 12.45), C4
// Flash x 3-4 tokens x 96-128 heads -0.4..-1.15, and +0.15..+0.35 (1-2.5%) at
// C4 Flash 32 heads x 8 tokens, 64 x 4 and 128 x 2 (16 splits of 40 entries ->
// 10 of 64).
constexpr int64_t kMinEntriesPerWideSplit = kDecodeTileRows;

// GPU calls with short index sets and blocks enough take one split. Split in two, a token of
// at most two 64-entry tiles gives each split at most one tile, and a block's fixed costs (the
// prologue's memory round trips, Q, the epilogue) are most of its time there: the split kernel
// is about as long as with one split (H200, V4 window layer, 16 heads x 128 tokens: 11.5 us at
// one split, 11.9 at two) and the reduce comes on top (4.4 us). H200 split sweeps (thirty-third
// session, L2-cold, graph replay), by `blocks` = num_tokens x ceil(num_heads / 16), the blocks
// of one split in the 16-head tiles the launcher then takes while they fit one wave:
//  - at most two tiles per token: the V4 window layer (128 entries) ran fastest with one split
//    from 40 blocks on at 8-128 heads (-3.4..-31.4% against the previous automatic count where
//    it changed; at 32 blocks two splits still won by 0.3-0.7 us); V3.2 rows of 128 entries at
//    16 heads x 48-128 tokens -2..-20%, at 40 tokens +0.2%, at 64 heads x 16 tokens +6.2% (the
//    one loss measured; DeepSeek V3.2's index sets are 2048 wide);
//  - three or four tiles at up to 16 heads: one split from 96 blocks on (-1.8..-21%; at 64
//    blocks two or four splits won), so the threshold sits at 0.7 x processors (93 of 132); with
//    more heads one split's 16-head tiles lost up to 15% (V3.2 rows of 256 entries at 64 heads
//    x 32 tokens), so those fall through to the count below.
// num_sms <= 0 counts as one processor, as in decode_base_splits. Not for the CPU twin
// (decode_num_splits' `gpu`): its processors are its threads, and one split of a call with
// fewer tokens than threads leaves threads idle (1 token x 8 heads on 2 threads: 47-52 us at
// four splits, 66-80 at one).
constexpr int64_t kOneSplitMaxTiles = 2;         // tiles per token, any head count
constexpr int64_t kOneSplitMaxTilesFewHeads = 4;  // tiles per token, up to 16 heads
inline bool decode_one_split_pays(int64_t num_tokens, int64_t num_heads, int64_t total_width, int num_sms) {
  if (num_tokens <= 0 || num_heads <= 0 || total_width <= 0) return false;
  if (total_width > kOneSplitMaxTilesFewHeads * kDecodeTileRows) return false;
  const int64_t tiles = decode_ceil_div(total_width, kDecodeTileRows);
  const int64_t sms = num_sms > 0 ? num_sms : 1;  // as decode_base_splits
  const int64_t t = num_tokens < (int64_t(1) << 20) ? num_tokens : (int64_t(1) << 20);
  int64_t groups = decode_ceil_div(num_heads, 16);
  if (groups > (int64_t(1) << 20)) groups = int64_t(1) << 20;
  const int64_t blocks = t * groups;  // <= 2^40
  if (tiles <= kOneSplitMaxTiles) return blocks * 10 >= sms * 3;  // 40 of 132 processors
  if (tiles <= kOneSplitMaxTilesFewHeads && num_heads <= 16) return blocks * 10 >= sms * 7;  // 93 of 132
  return false;
}

// The wave count of a call whose index sets have total width `total_width` (main width +
// extra width): the automatic split count before the GPU's one-split rule and balance model
// (decode_num_splits).
//
// Up to 16 heads (one 16-head tile, two blocks per processor): ~2 blocks per
// processor, at most the width's worth (decode_width_splits), tile-rounded.
//
// More heads: the 32- and 64-head kernels run one block per processor, so the
// count targets one wave of blocks. Tiles are tried from the smallest (16, 32,
// then decode_head_tile(H)); the first whose one-wave count leaves splits of at
// most kHeadTile16MaxRows / kHeadTile32MaxRows rows sets the count (the
// launcher then takes that tile, or a smaller one should the count let it fit
// one wave too), so a small call spends its spare blocks on head tiles instead
// of on splits too short to pay (H200, 128 heads x 4 tokens: C4 Flash 29.4 -> 17.4
// us; C128 128 heads x 2 tokens 58.7 -> 41.3). In 32- and 64-head blocks a split owns at least
// one tile of entries (kMinEntriesPerWideSplit).
//
// Both: then, with balanced_map (the call can take the balanced split map:
// decode_auto_splits), at least two splits for long rows
// (decode_two_split_floor). Never more than decode_wave_max_splits.
inline int decode_wave_splits(int64_t num_tokens, int64_t num_heads, int64_t total_width,
                              int num_sms, bool balanced_map = true) {
  if (total_width > kMaxPolicyWidth) total_width = kMaxPolicyWidth;
  const int64_t by_width = decode_width_splits(total_width);
  const int cap = decode_wave_max_splits(num_tokens, num_heads, num_sms, balanced_map);
  const int64_t big = decode_head_tile(num_heads);
  if (big > 16 && num_tokens > 0) {
    const int64_t sms = num_sms > 0 ? num_sms : 1;
    for (int64_t ht = 16;; ht *= 2) {
      const bool last = ht >= big;
      const int64_t groups = decode_ceil_div(num_heads, ht);  // the last ht (>= big) gives decode_head_groups
      const int64_t one_wave = decode_one_wave_splits(sms, num_tokens, groups);
      int64_t s = one_wave < 1 ? 1 : one_wave;
      if (s > kMaxAutoSplits) s = kMaxAutoSplits;
      if (s > by_width) s = by_width;
      // 32- and 64-head tiles: splits of at least a whole tile (see kMinEntriesPerWideSplit).
      const int64_t by_tile = (total_width + kMinEntriesPerWideSplit - 1) / kMinEntriesPerWideSplit;
      if (ht > 16 && s > by_tile) s = by_tile < 1 ? 1 : by_tile;
      const int64_t max_rows = ht == 16 ? kHeadTile16MaxRows : kHeadTile32MaxRows;
      if (!last && (!decode_tile_fits_one_wave(ht, num_tokens, num_heads, s, sms) ||
                    (total_width + s - 1) / s > max_rows))
        continue;
      int r = decode_round_splits(int(s), total_width, one_wave < s + s / 8 ? one_wave : s + s / 8);
      if (balanced_map) r = decode_two_split_floor(r, num_tokens, num_heads, total_width);
      return r < cap ? r : cap;
    }
  }
  int s = decode_base_splits(num_tokens, num_heads, num_sms);
  if (int64_t(s) > by_width) s = int(by_width);
  // (decode_wave_max_splits bounds the rounding, up to 1/8 more with blocks within one per
  // processor, and allows the floor's two splits)
  s = decode_round_splits(s, total_width, cap);
  return balanced_map ? decode_two_split_floor(s, num_tokens, num_heads, total_width) : s;
}

// Balance model (GPU calls of many blocks). The wave count fills at most one wave of blocks
// and takes one split once the tokens alone fill it, so a processor's share of the blocks is
// uneven whenever their count is not near a multiple of the processors, and the busiest
// processors set the call's time: V3.2 at 16 heads x 140 tokens, one split, puts two of the
// 140 blocks on 8 of 132 processors and takes 244 us, where 3-8 splits take 175-181 (H200).
// decode_split_cost models the busiest processor's time for S splits, in units of the time a
// lone 16-head block takes per 64-entry tile:
//  - n = ceil(ceil(W / S) / 64) tiles per split, B = T x ceil(H / tile) x S blocks in the head
//    tile the launcher takes (decode_launch_head_tile), m = ceil(B / processors);
//  - 16-head (and smaller) tiles run two blocks per processor: floor(m / 2) pairs at
//    1 + 1.5 n each, and a lone block at 1.5 + n when m is odd;
//  - 32- and 64-head tiles run one: m blocks at 2 + n each;
//  - S > 1 adds the reduce and the partials' round trip: 1 + T x H x S / (64 x processors).
// Fitted to an H200 sweep (thirty-fourth session, benchmarks/RESULTS.md: the V3.2, C4 Flash,
// C4 Pro and C128 layers at 8-128 heads x 48-300 tokens, 116 shapes, 1-8 splits), then checked
// on 156 other shapes against the wave count, which set where it applies
// (decode_balance_applies):
//  - num_tokens >= 0.3 x processors (40 on the H200; smaller calls keep the wave count's tuned
//    head tiles and split counts) and at most half of decode_balance_max_token_splits (beyond,
//    one split is the only count left);
//  - index sets of more than four tiles (shorter ones keep the one-split rule and the wave
//    count) and shorter than kBalanceMinWidth: the model takes every row as long as the set,
//    and long sets are the ones whose rows fall short of it (V4 C128: widths sized for the
//    longest context). On the straggler layer (one 8192-entry row, the rest ~500) the model's
//    counts lost up to 60%, where uniform C128 rows gained up to 36%;
//  - 32- and 64-head tiles only for sets of at least kBalanceWideMinWidth entries (V3.2's
//    2048): with 10-18 tiles per row (C4) their fixed costs weigh more than the model has them
//    (C4 Flash 48 heads x 150 tokens, two splits: +12%), where V3.2 at 96-128 heads x 40-88
//    tokens ran 20-27% faster.
// decode_balance_splits keeps the wave count's head tile (the 32- and 64-head tiles' costs per
// tile differ by more than the model knows: V3.2 96 heads x 40 tokens, 32-head tiles at one
// split against 64-head tiles at three: +7.8%) and moves only for a modelled gain of more than
// 8% (kBalanceMinGainPercent). Counts stay at 1..decode_balance_max_splits (8 up to 16 heads, 4
// above: the sweeps' best counts at 32-128 heads were 3-4) with num_tokens x S at most
// decode_balance_max_token_splits, which bounds the workspace (decode_workspace_size_for):
// 1,024 token-splits up to 16 heads, 512 above (the two-split floor's bound). On the H200 the
// automatic workspace at 16 heads grows from 16.8 to 33.6 MB for max_num_tokens >= 256 (8.7 ->
// 33.6 MB at 128), at 1-31 heads in proportion, and from 32 heads on only for max_num_tokens
// below 256 (64 tokens at 128 heads: 34.7 -> 67.2 MB).
constexpr int kBalanceMaxSplits = 8;
constexpr int kBalanceMaxSplitsWide = 4;
constexpr int64_t kBalanceMaxTokenSplits = 1024;
inline int decode_balance_max_splits(int64_t num_heads) {
  return num_heads <= 16 ? kBalanceMaxSplits : kBalanceMaxSplitsWide;
}
inline int64_t decode_balance_max_token_splits(int64_t num_heads) {
  return num_heads <= 16 ? kBalanceMaxTokenSplits : 2 * kBalanceMaxTokens;
}
// The most splits the model may pick for num_tokens >= 1 tokens and num_heads heads (both bounds
// above); the workspace bound (decode_max_auto_splits, decode_workspace_size_for) uses it too.
inline int decode_balance_reach(int64_t num_tokens, int64_t num_heads) {
  const int64_t by_tokens = decode_balance_max_token_splits(num_heads) / num_tokens;
  const int max_s = decode_balance_max_splits(num_heads);
  return by_tokens < max_s ? int(by_tokens) : max_s;
}
constexpr int64_t kBalanceWideMinWidth = 2048;
constexpr int64_t kBalanceMinGainPercent = 8;
constexpr int64_t kBalanceMaxHeads = 4096;  // beyond every model; keeps the products small
inline bool decode_balance_applies(int64_t num_tokens, int64_t num_heads, int64_t total_width, int num_sms) {
  if (num_sms <= 0 || num_tokens <= 0 || num_heads <= 0 || num_heads > kBalanceMaxHeads) return false;
  if (num_tokens > decode_balance_max_token_splits(num_heads) / 2) return false;
  if (total_width <= kOneSplitMaxTilesFewHeads * kDecodeTileRows || total_width >= kBalanceMinWidth) return false;
  if (num_heads > 16 && total_width < kBalanceWideMinWidth) return false;
  return num_tokens * 10 >= int64_t(num_sms) * 3;
}
// In units of 1 / (128 x processors) of a lone block's tile time, as an integer, so that the
// comparisons below come out the same on every host compiler (no rounding: below 2^53 for the
// arguments decode_balance_applies lets through).
// The busiest processor's blocks in 16-head tiles (two co-resident per processor): m blocks of n
// tiles, floor(m / 2) pairs at pair_fixed + pair_tile n and a lone one at lone_fixed + lone_tile n
// when m is odd (decode_split_cost, decode_active_cost; their units).
inline int64_t decode_paired_blocks_cost(int64_t m, int64_t n, int64_t pair_fixed, int64_t pair_tile,
                                         int64_t lone_fixed, int64_t lone_tile) {
  return (m / 2) * (pair_fixed + pair_tile * n) + (m % 2) * (lone_fixed + lone_tile * n);
}
inline int64_t decode_split_cost(int64_t num_tokens, int64_t num_heads, int64_t total_width, int num_splits,
                                 int num_sms) {
  const int64_t S = num_splits, sms = num_sms;
  const int64_t ht = decode_launch_head_tile(num_tokens, num_heads, num_splits, num_sms);
  const int64_t blocks = num_tokens * decode_ceil_div(num_heads, ht) * S;
  const int64_t m = decode_ceil_div(blocks, sms);
  const int64_t n = decode_ceil_div(decode_ceil_div(total_width, S), kDecodeTileRows);
  // 16-head tiles: pairs at 1 + 1.5 n, a lone block at 1.5 + n; wider: m x (2 + n); x 128 sms
  int64_t t = ht <= 16 ? 64 * sms * decode_paired_blocks_cost(m, n, 2, 3, 3, 2) : 128 * sms * m * (2 + n);
  if (S > 1) t += 128 * sms + 2 * num_tokens * num_heads * S;  // the reduce: 1 + T H S / (64 sms)
  return t;
}
// The count of least modelled cost among 1..decode_balance_reach with the head tile of `wave`
// (the wave count), if it models more than kBalanceMinGainPercent below `wave`; else `wave`. Call
// where decode_balance_applies (its sets of more than 256 entries give every count up to 8 at
// least 32 entries per split, as decode_width_splits asks).
inline int decode_balance_splits(int64_t num_tokens, int64_t num_heads, int64_t total_width, int num_sms,
                                 int wave) {
  const int64_t tile = decode_launch_head_tile(num_tokens, num_heads, wave, num_sms);
  const int64_t wave_cost = decode_split_cost(num_tokens, num_heads, total_width, wave, num_sms);
  int best = wave;
  int64_t best_cost = wave_cost;
  const int reach = decode_balance_reach(num_tokens, num_heads);
  for (int s = 1; s <= reach; ++s) {
    if (decode_launch_head_tile(num_tokens, num_heads, s, num_sms) != tile) continue;
    const int64_t c = decode_split_cost(num_tokens, num_heads, total_width, s, num_sms);
    if (c < best_cost) best = s, best_cost = c;
  }
  return best_cost * 100 < wave_cost * (100 - kBalanceMinGainPercent) ? best : wave;
}

// V3.2 rows whose 16-head tile runs one block per processor (decode_num_splits' `wide16`: the
// launcher's A16 tile, sm_90a, takes V3.2 splits of at least kAsym16MinSplitRows index entries;
// decode_use_asym16). The model above has two 16-head blocks share each processor; A16's 176 KB
// of shared memory leave one, so it picked counts whose second wave of blocks ran alone: at 16
// of 30 V3.2 shapes (8-16 heads x 40-448 tokens) its counts ran 6-32% slower than the best one
// (H100 sweep, sixty-third session, benchmarks/RESULTS.md; 64 tokens: 4 splits 60.9 µs against
// 52.4 for 2). The cost of a count whose splits take A16, in sixteenths of an A16 tile's time x
// processors (least squares over that sweep's 180 times at 1-6 splits: tile 2.68 µs, block 2.63,
// reduce 4.79 + 0.17 x T H S / processors; rounded to these integers, the picks are within 1% of
// the fastest count at 28 of its 30 shapes and 3.7% / 5.7% at the other two): m blocks on the
// busiest processor, n tiles each, m (n + 1), plus 29 / 16 + T H S / (16 processors) for the
// reduce.
// num_splits >= 1 and num_sms >= 1 (decode_wide16_splits calls it where decode_wide16_applies).
constexpr int64_t kAsym16MinSplitRows = 320;
inline int64_t decode_wide16_cost(int64_t num_tokens, int64_t num_heads, int64_t total_width, int num_splits,
                                  int num_sms) {
  const int64_t S = num_splits, sms = num_sms;
  const int64_t m = decode_ceil_div(num_tokens * decode_ceil_div(num_heads, 16) * S, sms);
  const int64_t n = decode_ceil_div(decode_ceil_div(total_width, S), kDecodeTileRows);
  int64_t t = 16 * sms * m * (n + 1);
  if (S > 1) t += 29 * sms + num_tokens * num_heads * S;
  return t;
}
// Where decode_num_splits takes it (with `wide16`): up to 16 heads, V3.2's widths within the
// balance model's (kBalanceWideMinWidth..kBalanceMinWidth - 1), up to half of
// decode_balance_max_token_splits tokens, and from 0.15 x processors tokens (20 on 132), below
// the balance model's 0.3 x: at 20-39 tokens the wave count ran the mma.sync tile at 7-13 splits,
// where one wave of A16 blocks at 3-6 was 14-25% faster (H100 sweep, sixty-third session); at
// 8-12 tokens A16's at most 6 splits leave most processors idle (the wave count was 5-32% faster),
// and at 16 they were even.
inline bool decode_wide16_applies(int64_t num_tokens, int64_t num_heads, int64_t total_width, int num_sms) {
  if (num_sms <= 0 || num_tokens <= 0 || num_heads <= 0 || num_heads > 16) return false;
  if (total_width < kBalanceWideMinWidth || total_width >= kBalanceMinWidth) return false;
  if (num_tokens > decode_balance_max_token_splits(num_heads) / 2) return false;
  return num_tokens * 20 >= int64_t(num_sms) * 3;
}
// The count of least decode_wide16_cost among those whose splits take A16 (at least
// kAsym16MinSplitRows entries each) within decode_balance_reach; ties go to fewer splits.
inline int decode_wide16_splits(int64_t num_tokens, int64_t num_heads, int64_t total_width, int num_sms) {
  const int64_t by_width = total_width / kAsym16MinSplitRows;
  const int reach = decode_balance_reach(num_tokens, num_heads);
  const int top = by_width < reach ? int(by_width) : reach;
  int best = 1;
  int64_t best_cost = decode_wide16_cost(num_tokens, num_heads, total_width, 1, num_sms);
  for (int s = 2; s <= top; ++s) {
    const int64_t c = decode_wide16_cost(num_tokens, num_heads, total_width, s, num_sms);
    if (c < best_cost) best = s, best_cost = c;
  }
  return best;
}

// Active splits (GPU calls on the balanced map with long index sets: V4 C128 layers). The policy
// sees only the sets' width W (8320 for a C128 layer: sized for the longest context), while the
// rows' real lengths decide what a split count costs. On the H200 (thirty-fifth session, rows of
// 8320, ~5100, ~3100, ~1100 and 300-8192 entries, and the straggler layer, 8-16 heads x 48-240
// tokens) the fastest split count followed the rows' mean length and the token count, not W; the
// wave count with its two-split floor was 23% slower than the fastest on geometric mean. So the
// automatic count of such a call is a grid of decode_active_grid slots per token (8 up to 128
// tokens, 1024 / T to 256, min(8, 1536 / T) above), and the kernels use as many of them as the
// rows ask for:
//  - a table of kActiveBuckets entries by the rows' mean effective length C_T / T (bucket k:
//    means in (k W / K, (k + 1) W / K]), entry k the count of least modelled time for rows as
//    long as the bucket's upper bound (decode_active_pick, decode_active_cost), at most the
//    grid - 1;
//  - with S' the entry of the call's bucket, token t takes n_t = ceil(S' T c_t / C_T) slots
//    (decode_active_slots; c_t as in the balanced map below, at least one, at most kMaxSplits),
//    in token order. Every token's rows per slot are then at most C_T / (T S'), the mean over
//    S', whatever the lengths' spread, unless its share passes kMaxSplits (the balanced map's
//    cumulative rounding gave tokens of about equal length one slot more or less than their
//    share: at S = 2 one slot, a whole row), and the slots add up to at most T (S' + 1), within
//    the grid. Above kBalanceMaxTokens, n_t = ceil(4 S' T c_t / (5 C_T)) (kActiveSlackDen): rows
//    per slot at most 5/4 of that mean, and rows within 5/4 of the mean row take no extra slot
//    (the ceil map gave half the tokens of rows of about equal length one more slot, T / 2 more
//    blocks: rows of ~1,100 entries ran 13-54% slower than one split at 264 and 384-512 tokens);
//  - slots from T x (the table's largest entry + 1) on (T + floor(4 x that entry x T / 5) above
//    kBalanceMaxTokens) are idle in every bucket: their blocks return at once; the other idle
//    slots' blocks after the prologue's sums (on the anchored map, decode_active_slack, the
//    blocks of the first T slots are never idle).
// Shapes only on the host (grid, workspace, table); the lengths pick the bucket and the slots on
// the device, so a captured graph replays with new lengths. Up to 16 heads (one 16-head tile; the
// wide tiles' costs differ from the model's: decode_balance_applies), 0.54 x processors (72 on
// the H200: at 48-64 tokens the wave count was as fast as the table's best S' on full rows and
// 2-6% faster on shorter ones, its T x S slots filling one wave exactly where the ceil map adds
// slots; at 66 the table measured -1.6..+5.9%, from 72 tokens on it gained 6-25%) to
// kBalanceMapMaxTokens tokens (above kBalanceMaxTokens on the anchored map: see
// kActiveMaxTokenSplits and decode_active_slack); automatic counts only
// (launch_sparse_mla_decode's auto_splits; an explicit count keeps the balanced map below). The
// CPU twin does not use it (its automatic count is not the GPU's).
constexpr int kActiveBuckets = 32;
struct ActiveSplits {
  int64_t live_slots = 0;  // slots any bucket may use (decode_active_splits_table); 0: off (the whole grid)
  uint8_t splits[kActiveBuckets] = {};
  MLA_EXT_HD bool on() const { return live_slots > 0; }
};
// Wide tiles (kActiveWideMinHeads..kActiveWideMaxHeads heads: the 32- and 64-head tiles) above
// kBalanceMaxTokens: the anchored map at S' = 1 on a grid of kActiveWideGrid slots per token
// (decode_active_splits_table), so that a row longer than 5/4 of the mean takes more blocks
// and the others one each, finished in their split blocks. One split per token (the count
// before) left the straggler layer's long row walking alone (H200, thirty-eighth session:
// 64 x 512 271 us, 128 x 512 329), and two plain balanced splits doubled every token's blocks
// (+30..+100%). The automatic workspace grows to 2 cells per token there (128 heads x 512
// tokens: 134.5 -> 269 MB; 32 heads 50.4 -> 67.2 MB). The 16-head table's cost model is not
// used (fitted to 16-head tiles). H200, thirty-ninth session, 32-128 heads x 264-512 tokens
// against one split (with the reduce's 4 heads per block and the 64-head kernel's whole K
// stores): the straggler layer -18..-59% (128 x 512: -4%), rows of 300-8,192 entries
// -0.5..-20%, rows of ~1,100 entries +3..+7%, of ~3,100 +1..+4.5%, full rows +0.3..+3.5%;
// geometric mean of 45 shapes -9.8%. Shapes only, like every automatic count. Every kernel kind
// runs it anchored since the fortieth session (before, the 64-head mma.sync, symmetric
// warpgroup and portable kernels ran the contiguous map). H200, auto against one split: the
// 64-head mma.sync tile (force_mma_sync; what 33-128 heads run off Hopper) at 64-128 heads x
// 264-512 tokens: straggler layer -13..-60%, rows of 300-8,192 entries -3..-19%, of ~1,100
// +2.8..+3.4%, full rows +0.2..+0.9%. The symmetric kernel (MLA_EXT_ASYM=0) keeps +9..+12% on
// rows of ~1,100 entries (likely its balanced instances' two K stages); the portable kernels
// +3..+6% at 16-64 heads x 512 tokens since their Q address fix (decode_body's kKeepQ).
constexpr int64_t kActiveWideMinHeads = 17;
constexpr int64_t kActiveWideMaxHeads = 128;
constexpr int kActiveWideGrid = 2;
MLA_EXT_HD bool decode_active_wide(int64_t num_tokens, int64_t num_heads) {
  return num_heads >= kActiveWideMinHeads && num_heads <= kActiveWideMaxHeads && num_tokens > kBalanceMaxTokens;
}
inline bool decode_active_applies(int64_t num_tokens, int64_t num_heads, int64_t total_width, int num_sms) {
  // (to kBalanceMapMaxTokens tokens: decode_balanced_width; above kBalanceMaxTokens at every
  // count since the anchored map, see kActiveMaxTokenSplits)
  if (num_sms <= 0 || !decode_balanced_width(num_tokens, total_width)) return false;
  if (decode_active_wide(num_tokens, num_heads)) return true;
  return num_heads >= 1 && num_heads <= 16 && num_tokens * 50 >= int64_t(num_sms) * 27;
}
// The grid (the automatic count) where decode_active_applies: decode_balance_reach up to
// kBalanceMaxTokens tokens (4..8 slots per token), min(8, kActiveMaxTokenSplits / T) above
// (3..5). H200, thirty-sixth session (RESULTS.md), C128 layers at 8-16 heads x 264-512 tokens
// whose one split per token (the count before) leaves idle processors or a straggler's row:
//  - 1024 / T (2-3 slots: S' = 1 only from 342 tokens) against 1536 / T (3-5): full rows at
//    300-384 tokens 943-1329 -> 851-1005 us; the straggler layer at 448-512 tokens lost 5-9%
//    with the larger grid (the table's S' = 2 there);
//  - against one split: full rows -21..-33% at 300-384 tokens, the straggler layer -40..-65% at
//    264-512, rows of 300-8,192 entries -17..-34%; but rows of about equal length (~1,100 or
//    ~3,100 entries, +-10%) +4..+37% at 264 and 448-512 tokens, where one split's T blocks fill
//    their last wave: the active path's fixed costs (the prologue's sums in every block,
//    including idle slots', and the reduce) came to 25-50 us at 512 tokens. Hence a wave rule
//    (2 x processors < T <= 3 x processors) until the anchored map (decode_active_slack) cut
//    those costs: thirty-seventh session, 8-16 heads x 264 / 448 / 512 tokens against one
//    split, the straggler layer -56..-67%, rows of 300-8,192 entries -15..-20%, full rows
//    +0.3..+2.4%, rows of ~3,100 entries +1.4..+4.3%, of ~1,100 +4.9..+6.8%; at 300-384 tokens
//    -0.7..-10% against the contiguous map. So every count to kBalanceMapMaxTokens applies.
// The automatic workspace grows accordingly at 1-47 heads (from 16 heads on it covers 16-head
// calls): on the H200 16-47 heads 33.6-49.4 -> 42.2-50.2 MB for max_num_tokens 257-306, 50.4 MB
// from 307 (the thirty-sixth session's wave rule: from 265).
constexpr int64_t kActiveMaxTokenSplits = 1536;
inline int decode_active_grid(int64_t num_tokens, int64_t num_heads) {
  if (decode_active_wide(num_tokens, num_heads)) return kActiveWideGrid;
  if (num_tokens <= kBalanceMaxTokens) return decode_balance_reach(num_tokens, num_heads);
  const int64_t g = kActiveMaxTokenSplits / num_tokens;
  return g < kBalanceMaxSplits ? int(g) : kBalanceMaxSplits;
}
// Above kBalanceMaxTokens a token takes another slot only once its row passes 5/4 of the mean
// row per slot (decode_active_slots), and the table's model counts no extra slots for it
// (decode_active_cost). With the ceil map's T / 2 extra blocks the model picked S' = 3 at 384
// tokens where 2 measured 8-9% faster on rows of ~1,100 and ~3,100 entries, and 1 at 320 tokens
// on the straggler layer (2: -14%). decode_active_slack: whether a call's map is this one.
// Its blocks are anchored (the 16-head kernels; thirty-seventh session): block q < T runs token
// q's first split, blocks T + P_t .. T + P_t + n_t - 2 (P_t = sum_{u<t} (n_u - 1)) its others, and
// the rest are idle; the workspace cells stay in token order (token t's split j: cell
// F_t + j, F_t = sum_{u<t} n_u). A first-split block knows its token before the map's sums, so
// its first index tile and lengths are in flight while it works out n_t and F_t; it leaves both
// in the workspace's token map for the reduce (as every balanced call does), and a token of n_t = 1 is finished
// there (bf16 output, lse, sink) with no cell written: the reduce's block of such a token reads
// its map entry and returns. With one slot per token a call then costs one split's blocks plus
// the map's sums and an empty reduce, where the contiguous map summed the lengths before every
// block's first load, wrote a partial per token and folded each one back in a reduce whose T x H
// blocks each summed the lengths again (H200, 8 heads x 512 tokens of ~1,100 entries: the reduce
// 16.3 -> 4.5 us, the call +11.4% -> +5.5% against one split; RESULTS.md, thirty-seventh session).
constexpr int64_t kActiveSlackDen = 5;
MLA_EXT_HD bool decode_active_slack(int64_t num_tokens) { return num_tokens > kBalanceMaxTokens; }
// The active splits' cost model: decode_split_cost's busiest processor for rows of `width`
// entries at S' = active, refitted to the ceil map (thirty-fifth session's sweep: 104 shapes,
// S' = 1..7 each; the table's pick within 0.5% of the fastest S' on geometric mean at 72+
// tokens, worst 13%):
//  - blocks: T S' plus T / 2 (the ceil map gives about half the tokens of a spread of lengths one
//    slot more than S'), except for rows as long as the set (the top bucket: equal lengths, no
//    extra slot) and on the slack map (decode_active_slack);
//  - pairs of co-resident 16-head blocks at 1 + 1.25 n per pair (decode_split_cost: 1 + 1.5 n), a
//    lone block at 1.5 + n, the reduce at 1 + T H S' / (64 processors) (the balanced map always
//    reduces, at S' = 1 too; on the anchored map a token of one slot skips the fold, which the
//    model, fitted before it, does not know).
// Integer, in units of 1 / (256 x processors) of a lone block's tile time.
inline int64_t decode_active_cost(int64_t num_tokens, int64_t num_heads, int64_t width, int active, int num_sms,
                                  bool equal_rows) {
  const int64_t sms = num_sms, T = num_tokens;
  const int64_t blocks = T * active + (equal_rows || decode_active_slack(T) ? 0 : (T + 1) / 2);
  const int64_t m = decode_ceil_div(blocks, sms);
  const int64_t n = decode_ceil_div(decode_ceil_div(width, active), kDecodeTileRows);
  return 64 * sms * decode_paired_blocks_cost(m, n, 4, 5, 6, 4) + 256 * sms + 4 * T * num_heads * active;
}
// The model's count for rows of `width` entries: the least decode_active_cost over 1..max_splits
// (the fewer splits on a tie), counting only splits of more than kActiveMinSplitRows entries
// (one split always counts). The model has a pair of one- to three-tile blocks too cheap: it took
// 7 splits of 112 entries for the straggler layer at 8 heads x 128 tokens (mean row 688; cost
// within 0.1% of 3's), 79.0 us on the H200 against 59.3 for the old count, where 3 measured
// 62.7 at 16 heads (and 5 at 16 x 120: +9.6%). On the fitting sweep and the 112 other shapes of
// that check the bound changes only those two picks.
constexpr int64_t kActiveMinSplitRows = 3 * kDecodeTileRows;
inline int decode_active_pick(int64_t num_tokens, int64_t num_heads, int64_t width, int num_sms, int max_splits,
                              bool equal_rows = false) {
  int best = 1;
  int64_t best_cost = decode_active_cost(num_tokens, num_heads, width, 1, num_sms, equal_rows);
  for (int s = 2; s <= max_splits && decode_ceil_div(width, s) > kActiveMinSplitRows; ++s) {
    const int64_t c = decode_active_cost(num_tokens, num_heads, width, s, num_sms, equal_rows);
    if (c < best_cost) best = s, best_cost = c;
  }
  return best;
}
// The table for a call of num_splits grid slots per token (off where decode_active_applies does not
// hold or num_splits < 2). force_splits 1..num_splits - 1 fills every entry with it (sweeps).
inline ActiveSplits decode_active_splits_table(int64_t num_tokens, int64_t num_heads, int64_t total_width,
                                               int num_sms, int num_splits, int force_splits = 0) {
  ActiveSplits a;
  if (total_width > kMaxPolicyWidth) total_width = kMaxPolicyWidth;
  if (num_splits < 2 || !decode_active_applies(num_tokens, num_heads, total_width, num_sms)) return a;
  int top = 1;
  for (int k = 0; k < kActiveBuckets; ++k) {
    const int64_t upper = decode_ceil_div(int64_t(k + 1) * total_width, kActiveBuckets);
    const int s = force_splits >= 1 && force_splits < num_splits ? force_splits
                  : decode_active_wide(num_tokens, num_heads)
                      ? 1
                      : decode_active_pick(num_tokens, num_heads, upper, num_sms, num_splits - 1,
                                           k == kActiveBuckets - 1);
    a.splits[k] = uint8_t(s);
    if (s > top) top = s;
  }
  // Slots in use: at most T (S' + 1) on the ceil map; on the slack map T + floor(4 S' T / 5),
  // since each n_t - 1 < 4 S' T c_t / (5 C_T) (decode_active_slots) and the c_t add up to C_T.
  const int64_t T = num_tokens;
  a.live_slots = decode_active_slack(T) ? T + (kActiveSlackDen - 1) * top * T / kActiveSlackDen : T * (top + 1);
  return a;
}
// The bucket of a call's rows: total_cost = C_T (the sum of c_t = max(1, E_t) <= total_width),
// 1 <= num_tokens <= kBalanceMapMaxTokens, total_width >= 1; the width clamped to kMaxPolicyWidth as
// the table's (so T x W < 2^49: the sets' widths are any int64 the op accepts).
MLA_EXT_HD int decode_active_bucket(int64_t total_cost, int64_t num_tokens, int64_t total_width) {
  if (total_width > kMaxPolicyWidth) total_width = kMaxPolicyWidth;
  const int64_t k = (total_cost - 1) * kActiveBuckets / (num_tokens * total_width);
  return k < 0 ? 0 : (k >= kActiveBuckets ? kActiveBuckets - 1 : int(k));
}
// S' of a call: the entry of its bucket.
MLA_EXT_HD int decode_active_count(const ActiveSplits& a, int64_t total_cost, int64_t num_tokens,
                                   int64_t total_width) {
  return a.splits[decode_active_bucket(total_cost, num_tokens, total_width)];
}
// n_t: ceil(S' T c_t / C_T) up to kBalanceMaxTokens tokens, ceil(4 S' T c_t / (5 C_T)) above
// (kActiveSlackDen), 1..kMaxSplits (c_t >= 1; 4 S' T c_t < 2^48).
MLA_EXT_HD int64_t decode_active_slots(int64_t cost, int64_t total_cost, int64_t num_tokens, int active) {
  // decode_active_slack's test, written out: calling the helper here changed the SASS of the
  // reduce and anchored kernels (nvcc 13, sm_90a; thirty-seventh session), and that code has
  // not run on the GPU. (The reduce no longer calls this since the thirty-eighth session: it
  // reads the token map.)
  const bool slack = num_tokens > kBalanceMaxTokens;
  const int64_t x = int64_t(active) * num_tokens * cost * (slack ? kActiveSlackDen - 1 : 1);
  const int64_t d = total_cost * (slack ? kActiveSlackDen : 1);
  const int64_t n = x / d + (x % d != 0 ? 1 : 0);
  return n < 1 ? 1 : (n > kMaxSplits ? kMaxSplits : n);
}

// The most splits the automatic count can pick for (T, H) on a device with num_sms processors,
// whatever the index widths: the wave count's bound (decode_wave_max_splits; floor = false for
// calls that cannot take the balanced map) and, for GPU calls the balance model may reach,
// decode_balance_reach, and for GPU calls on the balanced map where the active splits may apply,
// decode_active_grid.
inline int decode_max_auto_splits(int64_t num_tokens, int64_t num_heads, int num_sms, bool floor = true,
                                  bool gpu = true) {
  const int s = decode_wave_max_splits(num_tokens, num_heads, num_sms, floor);
  // (kBalanceWideMinWidth: a width at which the model applies at every head count)
  int top = s;
  if (gpu && floor && decode_active_applies(num_tokens, num_heads, kBalanceMinWidth, num_sms)) {
    const int g = decode_active_grid(num_tokens, num_heads);
    top = g > top ? g : top;
  }
  if (!gpu || !decode_balance_applies(num_tokens, num_heads, kBalanceWideMinWidth, num_sms)) return top;
  const int reach = decode_balance_reach(num_tokens, num_heads);
  return reach > top ? reach : top;
}

// The automatic split count for a call whose index sets have total width
// `total_width` (main width + extra width):
//  - GPU calls (gpu = true) of short index sets with blocks enough: one split
//    (decode_one_split_pays);
//  - else the wave count (decode_wave_splits);
//  - GPU calls of many blocks and index sets of 257..4095 entries
//    (decode_balance_applies): the balance model's pick between the wave count and
//    1..8 splits (decode_balance_splits). (Sets that long take no two-split floor.)
//    With wide16 (V3.2 rows on Hopper), 1-16 heads and 2048..4095 entries, from 0.15 x
//    processors tokens: decode_wide16_splits instead (decode_wide16_applies).
//  - GPU calls on the balanced map with sets of 4096+ entries, up to 16 heads and
//    0.54 x processors to 512 tokens
//    (decode_active_applies): the grid of the active splits, 3-8 slots
//    per token (decode_active_grid; the kernels then use as many of them as the rows'
//    lengths ask for: decode_active_splits_table).
// gpu = false is the CPU twin's count, whose "processors" are its threads (see
// decode_one_split_pays). Never more than decode_max_auto_splits(T, H, n, balanced_map, gpu).
inline int decode_num_splits(int64_t num_tokens, int64_t num_heads, int64_t total_width,
                             int num_sms, bool balanced_map = true, bool gpu = true, bool wide16 = false) {
  if (total_width > kMaxPolicyWidth) total_width = kMaxPolicyWidth;
  if (gpu && decode_one_split_pays(num_tokens, num_heads, total_width, num_sms)) return 1;
  if (gpu && wide16 && decode_wide16_applies(num_tokens, num_heads, total_width, num_sms))
    return decode_wide16_splits(num_tokens, num_heads, total_width, num_sms);
  int s = decode_wave_splits(num_tokens, num_heads, total_width, num_sms, balanced_map);
  if (gpu && decode_balance_applies(num_tokens, num_heads, total_width, num_sms))
    s = decode_balance_splits(num_tokens, num_heads, total_width, num_sms, s);
  else if (gpu && balanced_map && decode_active_applies(num_tokens, num_heads, total_width, num_sms))
    s = decode_active_grid(num_tokens, num_heads);
  return s;
}

// ---------------------------------------------------------------------------
// Split-K partition of one token (shared by the GPU kernel and the CPU twin).
// A token's effective positions are the main set's first
// min(W_main, max(lengths[t], 0)) entries followed by the extra set's first
// min(W_extra, max(extra_lengths[t], 0)), E in total; split s of S owns the
// contiguous positions [E*s/S, E*(s+1)/S) (floor division), empty when S > E.
// Content-dependent, but only inside a block: the grid depends on shapes only.
// ---------------------------------------------------------------------------
// effective_lens: the main and extra sets' counts above for token t (0 for a set without a
// cache or with width <= 0). Both length loads are issued before either value is used:
// written as one load-and-clamp per set, each clamp followed its load in the same branch
// on the GPU, so the second load waited for the first (two memory round trips in a row at
// the start of every split block, SASS).
MLA_EXT_HD void effective_lens(const KvSet& m, const KvSet& x, int64_t t, int64_t* em, int64_t* ee) {
  const bool has_m = m.cache != nullptr && m.width > 0, has_x = x.cache != nullptr && x.width > 0;
  const bool from_m = has_m && m.lengths != nullptr, from_x = has_x && x.lengths != nullptr;
  const int32_t lm = from_m ? m.lengths[t * m.lengths_stride] : 0;
  const int32_t lx = from_x ? x.lengths[t * x.lengths_stride] : 0;
  const int64_t vm = lm < 0 ? 0 : (int64_t(lm) < m.width ? int64_t(lm) : m.width);
  const int64_t vx = lx < 0 ? 0 : (int64_t(lx) < x.width ? int64_t(lx) : x.width);
  *em = !has_m ? 0 : from_m ? vm : m.width;
  *ee = !has_x ? 0 : from_x ? vx : x.width;
}

// ---------------------------------------------------------------------------
// Split map: the split slots each token owns. A call with S > 1 splits has
// T * S slots (one GPU block per slot and head group, one workspace cell per
// slot and head). Uniform map: token t owns slots [t * S, t * S + S).
// Balanced map (decode_balanced): the T * S slots are dealt by cumulative
// cost. With c_t = max(1, E_t) a token's cost (its effective length, capped at
// 2^31 - 1), C_t = sum_{u<t} c_u and X = T * (S - 1), token t's slots are
//   [F(t), F(t + 1)),  F(t) = t + floor(X * C_t / C_T + 1/2),
// so every token gets one slot plus its share of the X others, rounded so that
// the shares add up to exactly X (F(T) = T * S: no slot idle from rounding); a
// long row among short ones gets more splits instead of setting the call's
// time. Rounded to the nearest slot, not down (until the thirty-fifth session):
// with nearly equal lengths X * C_t / C_T stays within a fraction of a slot of
// (S - 1) t, and its floor flipped whenever that drift crossed zero, giving
// tokens S - 1 or S + 1 slots at random; at S = 2 a token with one slot walks its
// whole row and sets the call's time (H200, rows of ~5,100 entries, +-1%, 8 heads
// x 128 tokens: 383.3 us at two splits, 337.4 with rows of 8,320 entries, equal).
// The nearest slot moves only once the drift reaches half a slot. A token uses
// the first n_t = min(kMaxSplits, F(t + 1) - F(t)) of its slots; the rest stay
// idle. The map depends on the lengths (content), but only inside the kernels:
// grid, workspace and split count stay shape-only. Equal lengths give the
// uniform map exactly. (Until the twelfth session each token got
// 1 + floor(X * c_t / C_T) slots; the floors left up to T slots idle, e.g. 244
// of 512 at 256 tokens with one 8320-entry row among ~610-entry ones.)
// (kBalanceMapMaxTokens and kBalanceMinWidth are defined with the split policy.)
// ---------------------------------------------------------------------------

// W_main + W_extra of the sets present.
MLA_EXT_HD int64_t decode_total_width(const SparseDecodeParams& p) {
  return (p.main.cache != nullptr ? p.main.width : 0) + (p.extra.cache != nullptr ? p.extra.width : 0);
}

// Whether a call uses the balanced map: a V4 FP8 cache format (the C128 layers'
// long compressed rows; the other kernels keep their registers for the tile
// loop), S > 1, 2..kBalanceMapMaxTokens tokens, a lengths array on some set, and
// index widths summing to >= kBalanceMinWidth.
// decode_balanced_shape: all of these but the split count; decode_balanced_width (with the
// constants above): the token count and widths only.

MLA_EXT_HD bool decode_balanced_shape(const SparseDecodeParams& p) {
  if (kv_layout(p.kv_format) != KvFormat::kFP8DsMlaV4) return false;
  const bool has_lengths = (p.main.lengths != nullptr && p.main.cache != nullptr) ||
                           (p.extra.lengths != nullptr && p.extra.cache != nullptr);
  return has_lengths && decode_balanced_width(p.num_tokens, decode_total_width(p));
}

MLA_EXT_HD bool decode_balanced(const SparseDecodeParams& p) {
  return p.num_splits > 1 && decode_balanced_shape(p);
}

// Two-token blocks (GPU, the V4 FP8 64-head kernel of Hopper): a separate
// instantiation walks tokens 2b and 2b + 1 through one pipeline, so the second's
// first tiles load while the first's last ones multiply, and one prologue serves
// two tokens. Allowed for one split (the uniform map), two or more tokens and
// 32-bit positions; mode (SparseDecodeParams::two_token) 2 takes it wherever
// allowed, 1 never, 0 (automatic) where it measured faster on the H200 (RESULTS.md,
// twenty-third session):
//  - short rows, W_main + W_extra <= kTwoTokenMaxWidth (the window layer: 2 key
//    tiles per token; -5.5..-8.5% at 64-128 heads x 128-512 tokens). At 10-18 tiles
//    (C4) the per-tile cost of walking two tokens outweighs the saved prologue
//    (+1..+2.4%; C128 up to +4%); 3-9 tiles were not measured;
//  - and waves that halve: a two-token block costs ~1.72-1.89 one-token blocks, so it
//    pays only where ceil(blocks / 2 / SMs) * kTwoTokenCost < ceil(blocks / SMs),
//    e.g. 2 -> 1 or 4 -> 2 waves, but not 3 -> 2 (+15..18%).
constexpr int64_t kTwoTokenMaxWidth = 128;
constexpr double kTwoTokenCost = 1.9;
MLA_EXT_HD bool decode_two_token_blocks(const SparseDecodeParams& p, int64_t head_groups, int num_sms, int mode) {
  const int64_t T = p.num_tokens, W = decode_total_width(p);
  if (mode == 1 || p.num_splits != 1 || T < 2 || W >= (int64_t(1) << 30)) return false;
  if (mode == 2) return true;
  const int64_t n = num_sms > 0 ? num_sms : 128;  // (the launcher's assumption)
  const int64_t waves1 = (head_groups * T + n - 1) / n, waves2 = (head_groups * ((T + 1) / 2) + n - 1) / n;
  return W <= kTwoTokenMaxWidth && double(waves2) * kTwoTokenCost < double(waves1);
}

// The automatic split count of a call (num_splits == 0): decode_num_splits over
// its total index width, with the two-split floor where the balanced map can
// use it. Reads kv_format, num_tokens, num_heads and both sets' caches, widths
// and lengths pointers (never their contents). gpu = false: the CPU twin's count
// (num_sms = its threads; no one-split rule, decode_one_split_pays).
// wide16: the device runs V3.2 rows' 16-head splits of kAsym16MinSplitRows+ entries in one block
// per processor (the launcher's decode_wide16_rows); only V3.2 layouts take it here.
inline int decode_auto_splits(const SparseDecodeParams& p, int num_sms, bool gpu = true, bool wide16 = false) {
  return decode_num_splits(p.num_tokens, p.num_heads, decode_total_width(p), num_sms, decode_balanced_shape(p), gpu,
                           wide16 && kv_layout(p.kv_format) == KvFormat::kFP8DsMla);
}

// c_t of the balanced map: 1..2^31 - 1, so that X * C_t stays below 2^57
// (X < 2^17, C_t < 2^40 for T <= kBalanceMapMaxTokens).
MLA_EXT_HD int64_t decode_token_cost(const SparseDecodeParams& p, int64_t t) {
  int64_t em, ee;
  effective_lens(p.main, p.extra, t, &em, &ee);
  const int64_t e = em + ee;
  constexpr int64_t kMaxCost = (int64_t(1) << 31) - 1;
  return e < 1 ? 1 : (e > kMaxCost ? kMaxCost : e);
}

// F(t) of the balanced map: token t's first slot, given C_t = prefix_cost (the
// costs of tokens 0..t-1) and C_T = total_cost (> 0). F(0) = 0, F(num_tokens) = T * S
// (X + 1/2 rounds to X). 2 X C_t + C_T < 2^59 (decode_token_cost).
MLA_EXT_HD int64_t decode_balanced_first_slot(int64_t t, int64_t prefix_cost, int64_t total_cost,
                                              int64_t num_tokens, int num_splits) {
  return t + (2 * num_tokens * int64_t(num_splits - 1) * prefix_cost + total_cost) / (2 * total_cost);
}

// n_t of the balanced map from F(t) and F(t + 1).
MLA_EXT_HD int decode_balanced_slots(int64_t first, int64_t next_first) {
  const int64_t n = next_first - first;
  return n > kMaxSplits ? kMaxSplits : int(n);
}

// The call's split map on the host, token by token with plain sums (the split kernels compute
// it with block-wide scans; the CPU twin uses this one): token t's first slot first[t] and slot
// count count[t], for num_tokens tokens. Not decode_balanced(p): the uniform map, t * S and S.
// Balanced: with `active` on (automatic counts, decode_active_splits_table) n_t =
// decode_active_slots(c_t) slots in token order, else F(t) .. F(t + 1).
inline void decode_split_map(const SparseDecodeParams& p, const ActiveSplits& active, int64_t* first, int* count) {
  const int64_t T = p.num_tokens;
  const int S = p.num_splits;
  if (!decode_balanced(p)) {
    for (int64_t t = 0; t < T; ++t) {
      first[t] = t * S;
      count[t] = S;
    }
    return;
  }
  int64_t total = 0;
  for (int64_t t = 0; t < T; ++t) total += decode_token_cost(p, t);
  const int sa = active.on() ? decode_active_count(active, total, T, decode_total_width(p)) : 0;
  int64_t prefix = 0, f = 0;  // C_t; F(t), or the slots before token t
  for (int64_t t = 0; t < T; ++t) {
    const int64_t cost = decode_token_cost(p, t);
    first[t] = f;
    if (active.on()) {
      count[t] = int(decode_active_slots(cost, total, T, sa));
      f += count[t];
    } else {
      prefix += cost;
      const int64_t next = decode_balanced_first_slot(t + 1, prefix, total, T, S);
      count[t] = decode_balanced_slots(f, next);
      f = next;
    }
  }
}

MLA_EXT_HD void decode_split_range(int64_t num_positions, int64_t s, int64_t num_splits, int64_t* lo,
                                   int64_t* hi) {
  // Every real call lands in the 32-bit branch (fewer than 2^23 positions, at
  // most kMaxSplits splits): the same floor division without the 64-bit
  // division routine, which was a visible part of the GPU kernels' prologue.
  if (num_positions >= 0 && num_positions < (int64_t(1) << 23) && s >= 0 && s < num_splits &&
      num_splits <= kMaxSplits) {
    const uint32_t e = uint32_t(num_positions), ss = uint32_t(s), n = uint32_t(num_splits);
    *lo = int64_t(e * ss / n);
    *hi = int64_t(e * (ss + 1u) / n);
    return;
  }
  *lo = num_positions * s / num_splits;
  *hi = num_positions * (s + 1) / num_splits;
}

// ---------------------------------------------------------------------------
// Split-K reduction of one (token, head) row, the rule shared by the GPU reduce
// kernel and the CPU twin (each accumulates the weighted partial outputs its own
// way): a split whose lse is NaN (it met a NaN score) makes the row NaN; all
// splits empty (-inf) give 0 and lse -inf; otherwise split s weighs
// exp(lse_s - max) and the sink enters the denominator once.
// ---------------------------------------------------------------------------
enum class SplitMergeMode { kEmpty, kNaN, kMix };

MLA_EXT_HD SplitMergeMode split_merge_scan(const float* lse, int num_splits, float* max_lse) {
  float mx = neg_inf();
  bool nan = false;
  MLA_EXT_UNROLL4
  for (int i = 0; i < num_splits; ++i) {
    mx = fmaxf(mx, lse[i]);
    nan |= is_nan(lse[i]);
  }
  *max_lse = mx;
  return nan ? SplitMergeMode::kNaN : (mx == neg_inf() ? SplitMergeMode::kEmpty : SplitMergeMode::kMix);
}

// kMix, after summing the weights into L: the factor for the weighted sum and the row's lse
// (sink excluded). has_sink: whether the head has a sink, its logit `sink`.
MLA_EXT_HD float split_merge_finish(float L, float max_lse, bool has_sink, float sink, float* lse) {
  float den = L;
  if (has_sink) den = L + expf(sink - max_lse);
  *lse = max_lse + logf(L);
  return 1.f / den;
}

// ---------------------------------------------------------------------------
// Workspace layout for num_splits > 1 (256-byte aligned sections), by split slot q in
// [0, num_tokens * num_splits) (the split map above):
//   partial_out [num_heads, num_tokens * num_splits, 512] fp32 (normalised per split)
//   partial_lse [num_heads, num_tokens * num_splits]      fp32 (m + log(l); -inf = empty split)
//   token_map   [num_tokens] of uint32 pairs {F_t, n_t}: token t's first cell and cell count
//               under the balanced map (GPU; unused by the uniform map and the CPU twin)
// With one split no workspace is used (the partial kernel writes the final result).
// The token map is written by each token's first-split block (head group 0) and read by the
// reduce, whose T x H blocks until the thirty-eighth session each worked the map out again by
// summing all T tokens' lengths: O(T^2 H) work, on the H200 a third of a C128 call at 64-128
// heads x 128-256 tokens (128 x 256, the straggler layer: 125 of 331 us) and 16-21 us at
// 8-16 heads x 448-512. The thirty-seventh session's anchored map (decode_active_slack) kept
// its own map in the last two cells of partial_out; both maps are this section now.
// ---------------------------------------------------------------------------
inline size_t align256(size_t n) { return (n + 255) & ~size_t(255); }

inline size_t decode_partial_out_bytes(int64_t T, int64_t H, int64_t S) {
  return align256(size_t(T) * size_t(H) * size_t(S) * kDV * sizeof(float));
}
inline size_t decode_partial_lse_bytes(int64_t T, int64_t H, int64_t S) {
  return align256(size_t(T) * size_t(H) * size_t(S) * sizeof(float));
}
inline size_t decode_token_map_bytes(int64_t T) { return align256(size_t(T) * 2 * sizeof(uint32_t)); }

inline size_t decode_workspace_size(int64_t num_tokens, int64_t num_heads, int num_splits) {
  if (num_splits <= 1 || num_tokens <= 0 || num_heads <= 0) return 0;
  return decode_partial_out_bytes(num_tokens, num_heads, num_splits) +
         decode_partial_lse_bytes(num_tokens, num_heads, num_splits) + decode_token_map_bytes(num_tokens);
}

// Workspace for any call with at most num_tokens tokens and num_heads heads
// and this split setting (num_splits == 0: automatic; gpu as decode_num_splits).
// For the automatic setting this is the maximum over every smaller (T', H') too,
// since fewer tokens can mean more splits. Only head counts at the top of a
// head-group count matter, and only T' below the split target can split beyond
// the two-split floor, the balance model's token-split bound and (257..512 tokens)
// the active splits' grid.
inline size_t decode_workspace_size_for(int64_t num_tokens, int64_t num_heads, int num_splits,
                                        int num_sms, bool gpu = true) {
  if (num_tokens <= 0 || num_heads <= 0) return 0;
  if (num_splits > 0) return decode_workspace_size(num_tokens, num_heads, num_splits);
  size_t best = 0;
  const int64_t target = 2 * int64_t(num_sms > 0 ? num_sms : 1);
  const int64_t t_max = num_tokens < target ? num_tokens : target;
  for (int64_t h = decode_head_tile(num_heads);; h += 64) {
    if (h > num_heads) h = num_heads;
    // More head groups than the split target: one split for every t, and so for every larger h.
    if (decode_head_groups(h) > target) break;
    for (int64_t t = 1; t <= t_max; ++t) {
      const size_t b = decode_workspace_size(t, h, decode_wave_max_splits(t, h, num_sms));
      if (b > best) best = b;
    }
    if (h == num_heads) break;
  }
  // The two-split floor (decode_wave_max_splits) reaches past the loop above:
  // any head count, up to kBalanceMaxTokens tokens whatever the processor count.
  // Two-split workspaces grow with T and H, so the largest shape bounds them all.
  if (num_tokens >= 2) {
    const size_t b = decode_workspace_size(num_tokens < kBalanceMaxTokens ? num_tokens : kBalanceMaxTokens,
                                           num_heads, 2);
    if (b > best) best = b;
  }
  // The balance model (GPU): up to decode_balance_reach(T', H') splits where it applies. More
  // heads only widen where it applies (up to kBalanceMaxHeads) and add cells, except across the
  // token-split bound's step at 16 heads: check both sides of it.
  if (gpu) {
    const int64_t h_top = num_heads < kBalanceMaxHeads ? num_heads : kBalanceMaxHeads;
    const int64_t hs[2] = {h_top < 16 ? h_top : 16, h_top};
    for (const int64_t h : hs) {
      const int64_t t_top = decode_balance_max_token_splits(h) / 2;
      for (int64_t t = 1; t <= num_tokens && t <= t_top; ++t) {
        if (!decode_balance_applies(t, h, kBalanceWideMinWidth, num_sms)) continue;
        const size_t b = decode_workspace_size(t, h, decode_balance_reach(t, h));
        if (b > best) best = b;
      }
    }
    // The active splits' grid (decode_active_grid) above kBalanceMaxTokens, at 1-16 heads and
    // (decode_active_wide) kActiveWideMinHeads-kActiveWideMaxHeads.
    const int64_t has[2] = {num_heads < 16 ? num_heads : 16,
                            num_heads < kActiveWideMaxHeads ? num_heads : kActiveWideMaxHeads};
    for (int64_t t = kBalanceMaxTokens + 1; t <= num_tokens && t <= kBalanceMapMaxTokens; ++t) {
      for (const int64_t h : has) {
        if (!decode_active_applies(t, h, kBalanceMinWidth, num_sms)) continue;
        const size_t b = decode_workspace_size(t, h, decode_active_grid(t, h));
        if (b > best) best = b;
      }
    }
  }
  return best;
}

}  // namespace mla_ext
