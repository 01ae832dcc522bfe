// Host check of the decode launch policy helpers in sparse_mla_decode.h that the GPU launcher
// uses but no CPU test reaches (tools/compile_check.sh builds and runs it; exit status 1 and a
// line per mismatch on failure).
#include <stdint.h>
#include <stdio.h>

#include "mla_ext/sparse_mla_decode.h"

static int bad = 0;

static void expect(const char* what, long got, long want) {
  if (got != want) {
    printf("%s = %ld, expected %ld\n", what, got, want);
    bad = 1;
  }
}

int main() {
  using mla_ext::decode_reduce_chunks;
  // (rows, splits, balanced, processors, max chunks): 4 chunks at most a quarter as many rows as
  // processors, 2 at most half, only above 32 splits, never on the balanced map; 0 processors = 128.
  expect("chunks(8, 65)", decode_reduce_chunks(8, 65, false, 132, 4), 4);
  expect("chunks(33, 65)", decode_reduce_chunks(33, 65, false, 132, 4), 4);
  expect("chunks(34, 65)", decode_reduce_chunks(34, 65, false, 132, 4), 2);
  expect("chunks(66, 65)", decode_reduce_chunks(66, 65, false, 132, 4), 2);
  expect("chunks(67, 65)", decode_reduce_chunks(67, 65, false, 132, 4), 1);
  expect("chunks(128, 65)", decode_reduce_chunks(128, 65, false, 132, 4), 1);
  expect("chunks(8, 32)", decode_reduce_chunks(8, 32, false, 132, 4), 1);
  expect("chunks(8, 33)", decode_reduce_chunks(8, 33, false, 132, 4), 4);
  expect("chunks(8, 65, balanced)", decode_reduce_chunks(8, 65, true, 132, 4), 1);
  expect("chunks(8, 65, max 2)", decode_reduce_chunks(8, 65, false, 132, 2), 2);
  expect("chunks(8, 65, max 1)", decode_reduce_chunks(8, 65, false, 132, 1), 1);
  expect("chunks(32, 65, 0 processors)", decode_reduce_chunks(32, 65, false, 0, 4), 4);
  expect("chunks(33, 65, 0 processors)", decode_reduce_chunks(33, 65, false, 0, 4), 2);
  expect("chunks(0, 65)", decode_reduce_chunks(0, 65, false, 132, 4), 1);
  // The split counts the chunk rule was measured on (H200, 132 processors, twenty-fifth session):
  // one C128 token (8320 entries) takes 65 splits at 8-128 heads; C4 Flash (640) 20 at 8 heads,
  // C4 Pro (1152) and V3.2 (2048) 32: below the rule's 33.
  const int heads[] = {8, 16, 64, 128};
  for (int h : heads) expect("splits(C128, 1 token)", mla_ext::decode_num_splits(1, h, 8320, 132, true), 65);
  expect("splits(C4 Flash, 1 token, 8 heads)", mla_ext::decode_num_splits(1, 8, 640, 132, false), 20);
  expect("splits(C4 Pro, 1 token, 8 heads)", mla_ext::decode_num_splits(1, 8, 1152, 132, false), 32);
  expect("splits(V3.2, 1 token, 64 heads)", mla_ext::decode_num_splits(1, 64, 2048, 132, false), 32);
  // 32- and 64-head blocks take splits of at least one 64-entry tile (kMinEntriesPerWideSplit,
  // thirtieth session): C4 Pro x 128 heads x 1 token 18 splits of 32-head blocks (was 32 splits of
  // 36 entries), 64 heads x 2 tokens 18; C4 Flash x 128 heads x 2 tokens 10 (was 16); one token at
  // 64 heads keeps 16-head blocks and its 32 splits.
  expect("splits(C4 Pro, 1 token, 128 heads)", mla_ext::decode_num_splits(1, 128, 1152, 132, true), 18);
  expect("head tile(C4 Pro, 1 token, 128 heads)", mla_ext::decode_launch_head_tile(1, 128, 18, 132), 32);
  expect("splits(C4 Pro, 2 tokens, 64 heads)", mla_ext::decode_num_splits(2, 64, 1152, 132, true), 18);
  expect("splits(C4 Flash, 2 tokens, 128 heads)", mla_ext::decode_num_splits(2, 128, 640, 132, true), 10);
  expect("splits(C4 Pro, 1 token, 64 heads)", mla_ext::decode_num_splits(1, 64, 1152, 132, true), 32);
  expect("head tile(C4 Pro, 1 token, 64 heads)", mla_ext::decode_launch_head_tile(1, 64, 32, 132), 16);
  // Short index sets with blocks enough take one split (decode_one_split_pays, thirty-third
  // session): the V4 window layer (128 entries) from 40 blocks of 16-head tiles, any head count;
  // three or four tiles (<= 256 entries) at up to 16 heads from 93 blocks; longer sets keep theirs.
  using mla_ext::decode_num_splits;
  expect("splits(window, 16 heads, 128 tokens)", decode_num_splits(128, 16, 128, 132, true), 1);
  expect("splits(window, 8 heads, 40 tokens)", decode_num_splits(40, 8, 128, 132, true), 1);
  expect("splits(window, 128 heads, 5 tokens)", decode_num_splits(5, 128, 128, 132, true), 1);
  expect("head tile(window, 128 heads, 5 tokens, 1 split)", mla_ext::decode_launch_head_tile(5, 128, 1, 132), 16);
  expect("splits(window, 64 heads, 10 tokens)", decode_num_splits(10, 64, 128, 132, true), 1);
  expect("splits(window, 8 heads, 32 tokens) > 1", decode_num_splits(32, 8, 128, 132, true) > 1, 1);
  expect("splits(window, 32 heads, 16 tokens) > 1", decode_num_splits(16, 32, 128, 132, true) > 1, 1);
  expect("splits(window, 8 heads, 1 token)", decode_num_splits(1, 8, 128, 132, true), 4);
  expect("splits(256 entries, 16 heads, 96 tokens)", decode_num_splits(96, 16, 256, 132, true), 1);
  expect("splits(256 entries, 16 heads, 64 tokens) > 1", decode_num_splits(64, 16, 256, 132, true) > 1, 1);
  expect("splits(256 entries, 64 heads, 48 tokens) > 1", decode_num_splits(48, 64, 256, 132, true) > 1, 1);
  expect("splits(C4 Flash, 16 heads, 128 tokens)", decode_num_splits(128, 16, 640, 132, true), 2);
  expect("splits(window, 2^62 tokens, 2^62 heads)", decode_num_splits(int64_t(1) << 62, int64_t(1) << 62, 128, 132, true), 1);
  // The thresholds' edges (0.3 / 0.7 x processors), the op's balanced_map = false at these widths,
  // 17 heads (two 16-head groups) beyond two tiles, no processor count (one), extreme arguments
  // (no overflow: the C API passes any non-negative value), and the CPU twin (gpu = false: no rule).
  using mla_ext::decode_one_split_pays;
  const int64_t kMax = INT64_MAX;
  expect("one split(window, 39 blocks)", decode_one_split_pays(39, 8, 128, 132), 0);
  expect("one split(window, 40 blocks)", decode_one_split_pays(40, 8, 128, 132), 1);
  expect("one split(256 entries, 92 blocks)", decode_one_split_pays(92, 16, 256, 132), 0);
  expect("one split(256 entries, 93 blocks)", decode_one_split_pays(93, 16, 256, 132), 1);
  expect("one split(257 entries, 128 blocks)", decode_one_split_pays(128, 16, 257, 132), 0);
  expect("one split(256 entries, 17 heads)", decode_one_split_pays(128, 17, 256, 132), 0);
  expect("one split(128 entries, 17 heads, 20 tokens)", decode_one_split_pays(20, 17, 128, 132), 1);
  expect("one split(window, 1 token, no processor count)", decode_one_split_pays(1, 8, 128, 0), 1);
  expect("one split(width INT64_MAX)", decode_one_split_pays(100, 16, kMax, 132), 0);
  expect("one split(heads INT64_MAX)", decode_one_split_pays(100, kMax, 128, 132), 1);
  expect("one split(tokens INT64_MAX)", decode_one_split_pays(kMax, 8, 128, 132), 1);
  expect("one split(width 0)", decode_one_split_pays(100, 16, 0, 132), 0);
  expect("splits(window, 16 heads, 128 tokens, op's map)", decode_num_splits(128, 16, 128, 132, false), 1);
  expect("splits(window, 8 heads, 40 tokens, CPU, 64 threads) > 1", decode_num_splits(40, 8, 128, 64, false, false) > 1, 1);
  expect("splits(window, 8 heads, 40 tokens, GPU, 64 processors)", decode_num_splits(40, 8, 128, 64, false, true), 1);
  expect("splits(window, 8 heads, 1 token, CPU, 2 threads)", decode_num_splits(1, 8, 128, 2, false, false), 4);
  expect("splits(window, 8 heads, 1 token, GPU rule on 2 processors)", decode_num_splits(1, 8, 128, 2, false, true), 1);
  expect("splits(heads INT64_MAX, window) in range", decode_num_splits(1, kMax, 128, 132, true) >= 1, 1);
  expect("splits(heads INT64_MAX, C128 width) in range", decode_num_splits(1, kMax, 8320, 132, true) <= 256, 1);
  expect("head groups(INT64_MAX)", mla_ext::decode_head_groups(kMax), kMax / 64 + 1);
  // The C API's query passes balanced_map as the op decides it (decode_balanced_width): below
  // 4096 entries the op's count, not the tile rounding under the two-split floor's cap.
  expect("balanced width(200 tokens, 640)", mla_ext::decode_balanced_width(200, 640), 0);
  expect("balanced width(200 tokens, 8320)", mla_ext::decode_balanced_width(200, 8320), 1);
  expect("balanced width(1 token, 8320)", mla_ext::decode_balanced_width(1, 8320), 0);
  expect("balanced width(512 tokens, 8320)", mla_ext::decode_balanced_width(512, 8320), 1);
  expect("balanced width(513 tokens, 8320)", mla_ext::decode_balanced_width(513, 8320), 0);
  expect("splits(C4 Flash, 16 heads, 200 tokens, as the query)",
         decode_num_splits(200, 16, 640, 132, mla_ext::decode_balanced_width(200, 640)),
         decode_num_splits(200, 16, 640, 132, false));
  expect("splits(C4 Flash, 16 heads, 200 tokens, op's map)", decode_num_splits(200, 16, 640, 132, false), 1);
  // The balance model (decode_balance_splits, thirty-fourth session): GPU calls of 40..512 tokens
  // (..256 above 16 heads) and sets of 257..4095 entries (from 2048 above 16 heads) move off the
  // wave count where the model saves more than 8%; the counts the H200 sweeps measured faster.
  using mla_ext::decode_balance_applies;
  expect("balance(39 tokens)", decode_balance_applies(39, 16, 1152, 132), 0);
  expect("balance(40 tokens)", decode_balance_applies(40, 16, 1152, 132), 1);
  expect("balance(512 tokens, 16 heads)", decode_balance_applies(512, 16, 1152, 132), 1);
  expect("balance(513 tokens, 16 heads)", decode_balance_applies(513, 16, 1152, 132), 0);
  expect("balance(256 tokens, 17 heads)", decode_balance_applies(256, 17, 2048, 132), 1);
  expect("balance(257 tokens, 17 heads)", decode_balance_applies(257, 17, 2048, 132), 0);
  expect("balance(256 entries)", decode_balance_applies(100, 16, 256, 132), 0);
  expect("balance(257 entries)", decode_balance_applies(100, 16, 257, 132), 1);
  expect("balance(4095 entries)", decode_balance_applies(100, 16, 4095, 132), 1);
  expect("balance(4096 entries: C128 widths)", decode_balance_applies(100, 16, 4096, 132), 0);
  expect("balance(2047 entries, 17 heads)", decode_balance_applies(100, 17, 2047, 132), 0);
  expect("balance(2048 entries, 17 heads)", decode_balance_applies(100, 17, 2048, 132), 1);
  expect("balance(no processor count)", decode_balance_applies(100, 16, 1152, 0), 0);
  expect("balance(heads INT64_MAX)", decode_balance_applies(100, kMax, 2048, 132), 0);
  expect("splits(C4 Pro, 16 heads, 140 tokens)", decode_num_splits(140, 16, 1152, 132, false), 3);
  expect("splits(C4 Flash, 8 heads, 140 tokens)", decode_num_splits(140, 8, 640, 132, false), 5);
  expect("splits(V3.2, 8 heads, 96 tokens)", decode_num_splits(96, 8, 2048, 132, false), 8);
  expect("splits(V3.2, 16 heads, 300 tokens)", decode_num_splits(300, 16, 2048, 132, false), 3);
  expect("splits(V3.2, 128 heads, 72 tokens)", decode_num_splits(72, 128, 2048, 132, false), 4);
  expect("splits(V3.2, 128 heads, 40 tokens)", decode_num_splits(40, 128, 2048, 132, false), 3);
  // kept: the 32-head tile of one split (96 heads x 40 tokens), a modelled gain under 8% (C4 Pro
  // 16 heads x 180 tokens), C128 widths (straggler rows), the CPU twin, the token counts
  expect("splits(V3.2, 96 heads, 40 tokens)", decode_num_splits(40, 96, 2048, 132, false), 1);
  expect("splits(C4 Pro, 16 heads, 180 tokens)", decode_num_splits(180, 16, 1152, 132, false), 1);
  expect("splits(C128, 16 heads, 140 tokens, no balanced map)", decode_num_splits(140, 16, 8320, 132, false), 1);
  expect("splits(C4 Pro, 16 heads, 140 tokens, CPU)", decode_num_splits(140, 16, 1152, 132, false, false), 1);
  // V3.2 rows whose wide 16-head splits run one block per processor (wide16, sixty-third session):
  // the counts an H100 sweep measured fastest (within 1%), from decode_wide16_cost.
  expect("wide16 splits(V3.2, 16 heads, 40 tokens)", decode_num_splits(40, 16, 2048, 132, false, true, true), 3);
  expect("wide16 splits(V3.2, 16 heads, 64 tokens)", decode_num_splits(64, 16, 2048, 132, false, true, true), 2);
  expect("wide16 splits(V3.2, 16 heads, 128 tokens)", decode_num_splits(128, 16, 2048, 132, false, true, true), 1);
  expect("wide16 splits(V3.2, 16 heads, 192 tokens)", decode_num_splits(192, 16, 2048, 132, false, true, true), 2);
  expect("wide16 splits(V3.2, 8 heads, 96 tokens)", decode_num_splits(96, 8, 2048, 132, false, true, true), 4);
  expect("wide16 splits(V3.2, 16 heads, 448 tokens)", decode_num_splits(448, 16, 2048, 132, false, true, true), 2);
  expect("wide16 splits(V3.2, 16 heads, 512 tokens)", decode_num_splits(512, 16, 2048, 132, false, true, true), 1);
  expect("wide16 cost(64, 16, 2048, 2 splits)", long(mla_ext::decode_wide16_cost(64, 16, 2048, 2, 132)),
         16L * 132 * 1 * 17 + 29 * 132 + 64 * 16 * 2);
  // never a count whose splits fall below kAsym16MinSplitRows (2048 / 320: at most 6)
  {
    int ok = 1;
    for (int64_t t = 20; t <= 512; ++t)
      for (int64_t h = 1; h <= 16; ++h) {
        const int s = decode_num_splits(t, h, 2048, 132, false, true, true);
        ok = ok && s >= 1 && s <= 6;
      }
    expect("wide16 splits of >= 320 entries", ok, 1);
  }
  // not above 16 heads, below V3.2's width, where the balance model does not apply, or on the CPU
  expect("wide16 off at 17 heads", decode_num_splits(64, 17, 2048, 132, false, true, true),
         decode_num_splits(64, 17, 2048, 132, false));
  expect("wide16 off at 1152 entries", decode_num_splits(140, 16, 1152, 132, false, true, true), 3);
  // below the balance model's 40 tokens, from 0.15 x processors (20 on 132): one wave of A16 blocks
  expect("wide16 splits(V3.2, 16 heads, 20 tokens)", decode_num_splits(20, 16, 2048, 132, false, true, true), 6);
  expect("wide16 splits(V3.2, 16 heads, 24 tokens)", decode_num_splits(24, 16, 2048, 132, false, true, true), 5);
  expect("wide16 splits(V3.2, 8 heads, 32 tokens)", decode_num_splits(32, 8, 2048, 132, false, true, true), 4);
  expect("wide16 splits(V3.2, 16 heads, 36 tokens)", decode_num_splits(36, 16, 2048, 132, false, true, true), 3);
  expect("wide16 off at 19 tokens", decode_num_splits(19, 16, 2048, 132, false, true, true),
         decode_num_splits(19, 16, 2048, 132, false));
  expect("wide16 at 19 tokens: the wave count", decode_num_splits(19, 16, 2048, 132, false), 13);
  expect("wide16 applies(20 tokens, 132)", mla_ext::decode_wide16_applies(20, 16, 2048, 132), 1);
  expect("wide16 applies(4096 entries)", mla_ext::decode_wide16_applies(100, 16, 4096, 132), 0);
  expect("wide16 applies(2047 entries)", mla_ext::decode_wide16_applies(100, 16, 2047, 132), 0);
  expect("wide16 applies(513 tokens)", mla_ext::decode_wide16_applies(513, 16, 2048, 132), 0);
  expect("wide16 off on the CPU", decode_num_splits(64, 16, 2048, 132, false, false, true),
         decode_num_splits(64, 16, 2048, 132, false, false));
  // A modelled gain of exactly 8% keeps the wave count on every host (integer costs: 2,525,952 is
  // 92% of 2,745,600 for 16 heads x 396 tokens x 4095 entries, one split against two).
  expect("cost(396, 16, 4095, 1 split)", long(mla_ext::decode_split_cost(396, 16, 4095, 1, 132)), 2745600);
  expect("cost(396, 16, 4095, 2 splits)", long(mla_ext::decode_split_cost(396, 16, 4095, 2, 132)), 2525952);
  expect("splits(exact 8% gain, 132 processors)", decode_num_splits(396, 16, 4095, 132, false), 1);
  expect("splits(exact 8% gain, 80 processors)", decode_num_splits(192, 16, 897, 80, false), 1);
  // The balanced map rounds each token's cumulative share to the nearest slot (thirty-fifth
  // session): 40 nearly equal rows (4,950-5,050 entries) take exactly S slots each at S = 2 and 3,
  // where rounding down gave some tokens S - 1 and others S + 1; F(0) = 0, F(T) = T S.
  {
    int64_t cost[40], total = 0;
    unsigned r = 7;
    for (int t = 0; t < 40; ++t) {
      r = r * 1103515245u + 12345u;
      cost[t] = 4950 + int64_t((r >> 8) % 101u);
      total += cost[t];
    }
    for (int S = 2; S <= 3; ++S) {
      int64_t prefix = 0;
      int equal = 1, floor_equal = 1;
      for (int t = 0; t < 40; ++t) {
        const int64_t f0 = mla_ext::decode_balanced_first_slot(t, prefix, total, 40, S);
        const int64_t f1 = mla_ext::decode_balanced_first_slot(t + 1, prefix + cost[t], total, 40, S);
        equal = equal && f1 - f0 == S;
        const int64_t g0 = t + 40LL * (S - 1) * prefix / total, g1 = t + 1 + 40LL * (S - 1) * (prefix + cost[t]) / total;
        floor_equal = floor_equal && g1 - g0 == S;
        if (t == 0) expect("F(0)", long(f0), 0);
        prefix += cost[t];
      }
      expect("nearly equal rows: S slots each", equal, 1);
      expect("(rounding down gave other counts)", floor_equal, 0);
      expect("F(T)", long(mla_ext::decode_balanced_first_slot(40, total, total, 40, S)), 40L * S);
    }
  }
  // Active splits (decode_active_splits_table, thirty-fifth session): GPU calls on the balanced map
  // with sets of 4096+ entries at 1-16 heads x 0.54 x processors..256 tokens (and to 512 since
  // the thirty-sixth session: 2-3 x processors tokens, every count since the thirty-seventh) get
  // a grid of decode_active_grid slots per token and a table of the model's counts by the rows'
  // mean length; token t then takes ceil(S' T c_t / C_T) slots (ceil(4 S' T c_t / (5 C_T)) above
  // 256 tokens).
  using mla_ext::decode_active_applies;
  expect("active(71 tokens)", decode_active_applies(71, 16, 8320, 132), 0);
  expect("active(72 tokens)", decode_active_applies(72, 16, 8320, 132), 1);
  expect("active(256 tokens)", decode_active_applies(256, 16, 8320, 132), 1);
  // above 256 tokens at every count to 512 (the anchored map; until the thirty-seventh session
  // only at 2-3 x processors tokens), on any processor count
  expect("active(257 tokens)", decode_active_applies(257, 16, 8320, 132), 1);
  expect("active(264 tokens)", decode_active_applies(264, 16, 8320, 132), 1);
  expect("active(397 tokens)", decode_active_applies(397, 16, 8320, 132), 1);
  expect("active(512 tokens)", decode_active_applies(512, 16, 8320, 132), 1);
  expect("active(513 tokens)", decode_active_applies(513, 16, 8320, 132), 0);
  expect("active(500 tokens, 114 processors)", decode_active_applies(500, 16, 8320, 114), 1);
  expect("active(300 tokens, 78 processors)", decode_active_applies(300, 16, 8320, 78), 1);
  expect("active(512 tokens, 16 processors)", decode_active_applies(512, 16, 8320, 16), 1);
  expect("active(513 tokens, 114 processors)", decode_active_applies(513, 16, 8320, 114), 0);
  expect("active(17 heads)", decode_active_applies(100, 17, 8320, 132), 0);
  expect("active(4095 entries)", decode_active_applies(100, 16, 4095, 132), 0);
  expect("active(4096 entries)", decode_active_applies(100, 16, 4096, 132), 1);
  expect("active(no processor count)", decode_active_applies(100, 16, 8320, 0), 0);
  expect("splits(C128, 16 heads, 140 tokens)", decode_num_splits(140, 16, 8320, 132, true), 7);
  expect("splits(C128, 8 heads, 72 tokens)", decode_num_splits(72, 8, 8320, 132, true), 8);
  expect("splits(C128, 8 heads, 64 tokens: the wave count)", decode_num_splits(64, 8, 8320, 132, true), 4);
  expect("splits(C128, 8 heads, 256 tokens)", decode_num_splits(256, 8, 8320, 132, true), 4);
  expect("splits(C128, 16 heads, 140 tokens, CPU)", decode_num_splits(140, 16, 8320, 132, true, false), 2);
  expect("splits(C128, 32 heads, 140 tokens)", decode_num_splits(140, 32, 8320, 132, true), 2);
  // grids above 256 tokens: min(8, 1536 / T) slots per token
  expect("splits(C128, 16 heads, 300 tokens)", decode_num_splits(300, 16, 8320, 132, true), 5);
  expect("splits(C128, 16 heads, 384 tokens)", decode_num_splits(384, 16, 8320, 132, true), 4);
  expect("splits(C128, 16 heads, 396 tokens)", decode_num_splits(396, 16, 8320, 132, true), 3);
  expect("splits(C128, 16 heads, 257 tokens)", decode_num_splits(257, 16, 8320, 132, true), 5);
  expect("splits(C128, 16 heads, 264 tokens)", decode_num_splits(264, 16, 8320, 132, true), 5);
  expect("splits(C128, 16 heads, 512 tokens)", decode_num_splits(512, 16, 8320, 132, true), 3);
  expect("splits(C128, 32 heads, 300 tokens)", decode_num_splits(300, 32, 8320, 132, true), 2);  // decode_active_wide
  expect("splits(C128, 16 heads, 300 tokens, no lengths)", decode_num_splits(300, 16, 8320, 132, false), 1);
  expect("splits(C128, 16 heads, 16 tokens)", decode_num_splits(16, 16, 8320, 132, true),
         mla_ext::decode_wave_splits(16, 16, 8320, 132, true));
  {
    using mla_ext::decode_active_splits_table;
    using mla_ext::kActiveBuckets;
    const mla_ext::ActiveSplits a = decode_active_splits_table(140, 16, 8320, 132, 7);
    expect("table(140, 16) on", a.on(), 1);
    expect("table(140, 16) full rows: the model's count", a.splits[kActiveBuckets - 1],
           mla_ext::decode_active_pick(140, 16, 8320, 132, 6, true));
    int top = 0;
    for (int k = 0; k < kActiveBuckets; ++k) top = a.splits[k] > top ? a.splits[k] : top;
    expect("table(140, 16) live slots", long(a.live_slots), 140L * (top + 1));
    const mla_ext::ActiveSplits c = decode_active_splits_table(140, 16, 8320, 132, 3);
    for (int k = 0; k < kActiveBuckets; ++k) expect("table(140, 16, grid 3) within 1..2", c.splits[k] >= 1 && c.splits[k] <= 2, 1);
    const mla_ext::ActiveSplits f = decode_active_splits_table(140, 16, 8320, 132, 7, 5);
    for (int k = 0; k < kActiveBuckets; ++k) expect("table(forced 5)", f.splits[k], 5);
    expect("table(forced 5) live slots", long(f.live_slots), 140L * 6);
    expect("table(forced 7 > grid - 1) = the model's", decode_active_splits_table(140, 16, 8320, 132, 7, 7).splits[0], a.splits[0]);
    expect("table(grid 1) off", decode_active_splits_table(140, 16, 8320, 132, 1).on(), 0);
    expect("table(17 heads) off", decode_active_splits_table(140, 17, 8320, 132, 7).on(), 0);
    expect("table(2048 entries) off", decode_active_splits_table(140, 16, 2048, 132, 7).on(), 0);
    using mla_ext::decode_active_bucket;
    expect("bucket(empty rows)", decode_active_bucket(140, 140, 8320), 0);
    expect("bucket(full rows)", decode_active_bucket(140 * 8320, 140, 8320), kActiveBuckets - 1);
    expect("bucket(half)", decode_active_bucket(140 * 4160, 140, 8320), kActiveBuckets / 2 - 1);
    expect("bucket(half + 1)", decode_active_bucket(140 * 4160 + 1, 140, 8320), kActiveBuckets / 2);
    expect("bucket(width 2^56, no overflow)", decode_active_bucket(256LL * 2147483647, 256, int64_t(1) << 56), 0);
    using mla_ext::decode_active_slots;
    expect("slots(mean row, S' 3)", long(decode_active_slots(500, 140 * 500, 140, 3)), 3);
    expect("slots(a bit above the mean, S' 3)", long(decode_active_slots(501, 140 * 500, 140, 3)), 4);
    expect("slots(short row)", long(decode_active_slots(1, 140 * 500, 140, 3)), 1);
    // splits of more than 192 entries: the straggler layer at 8 heads x 128 tokens (mean row 688:
    // bucket 2, upper bound 780) takes 3, not 7 splits of 112 (modelled 0.1% cheaper)
    expect("pick(128, 8, 780)", mla_ext::decode_active_pick(128, 8, 780, 132, 7), 3);
    expect("pick(128, 8, 192): one split", mla_ext::decode_active_pick(128, 8, 192, 132, 7), 1);
    // above 256 tokens a token takes another slot only past 5/4 of the mean row per slot, and the
    // table models no extra slots (rows as if of equal length): 384 tokens, grid 4, S' = 2 for
    // every bucket but the first (1; the forced sweep's fastest for rows of ~1,100-4,300 entries)
    expect("slots(1.2 x mean, S' 1, 300 tokens)", long(decode_active_slots(600, 300 * 500, 300, 1)), 1);
    expect("slots(1.3 x mean, S' 1, 300 tokens)", long(decode_active_slots(650, 300 * 500, 300, 1)), 2);
    expect("slots(1.3 x mean, S' 1, 200 tokens)", long(decode_active_slots(650, 200 * 500, 200, 1)), 2);
    expect("slots(1.1 x mean, S' 1, 200 tokens)", long(decode_active_slots(550, 200 * 500, 200, 1)), 2);
    {
      const mla_ext::ActiveSplits t384 = decode_active_splits_table(384, 16, 8320, 132, 4);
      for (int k = 1; k < kActiveBuckets; ++k) expect("table(384, 16) = 2", t384.splits[k], 2);
      // the slack map's slots: T + floor(4 S' T / 5) at the table's largest S'
      expect("table(384, 16) live slots", long(t384.live_slots), 384L + 4 * 2 * 384 / 5);
    }
    expect("slots(long row, capped)", long(decode_active_slots(8320, 8320 + 500, 2, 256)), 256);
    // Every table at 1-16 heads x 2-512 tokens x widths 4096-40000 on four processor counts:
    // entries 1..grid - 1, live slots within the grid; and for any lengths, the slots add up to at
    // most T (S' + 1) <= live slots (T + floor(4 S' T / 5) above 256 tokens), each token's rows per
    // slot at most C_T / (T S') (5/4 of it above 256 tokens; checked on random costs).
    int ok = 1;
    unsigned rng = 12345;
    const int sms[] = {132, 114, 78, 16};
    for (int n : sms)
      for (int64_t h = 1; h <= 16 && ok; h += 3)
        for (int64_t t = 2; t <= 512 && ok; t += 7)
          for (int64_t w = 4096; w <= 40000 && ok; w += 2997) {
            const int grid = decode_num_splits(t, h, w, n, true);
            const mla_ext::ActiveSplits b = decode_active_splits_table(t, h, w, n, grid);
            if (b.on() != decode_active_applies(t, h, w, n)) ok = 0;
            if (!b.on()) continue;
            ok = ok && grid == mla_ext::decode_active_grid(t, h) && b.live_slots <= t * grid;
            for (int k = 0; k < kActiveBuckets; ++k) ok = ok && b.splits[k] >= 1 && b.splits[k] < grid;
            for (int rep = 0; rep < 4 && ok; ++rep) {
              int64_t cost[512], total = 0;
              const int64_t top = 1 + (rep == 0 ? w : int64_t(rng % unsigned(w)));
              for (int64_t u = 0; u < t; ++u) {
                rng = rng * 1103515245u + 12345u;
                cost[u] = 1 + int64_t((rng >> 8) % unsigned(top));
                total += cost[u];
              }
              const int sa = mla_ext::decode_active_count(b, total, t, w);
              int64_t slots = 0;
              for (int64_t u = 0; u < t; ++u) {
                const int64_t m = decode_active_slots(cost[u], total, t, sa);
                slots += m;
                // c_u / m <= C_T / (T S'), 5/4 of it above 256 tokens
                ok = ok && m >= 1 && cost[u] * t * sa * (t > 256 ? 4 : 1) <= total * m * (t > 256 ? 5 : 1);
              }
              ok = ok && slots <= t * (sa + 1) && slots <= b.live_slots;
              ok = ok && (t <= 256 || slots <= t + 4 * sa * t / 5);  // the slack map's bound
            }
            if (!ok) printf("t=%ld h=%ld w=%ld sms=%d: grid %d\n", long(t), long(h), long(w), n, grid);
          }
    expect("active tables and slots within their grids", ok, 1);
  }
  {
    // Wide tiles above 256 tokens (decode_active_wide): a grid of two, S' = 1 in every bucket,
    // the slack map's live slots, and an automatic workspace that holds the grid.
    int ok = 1;
    const int sms[] = {132, 114, 78, 16};
    const int64_t heads[] = {17, 32, 33, 64, 100, 128};
    const int64_t tokens[] = {257, 300, 511, 512};
    for (int n : sms)
      for (int64_t h : heads)
        for (int64_t t : tokens) {
          const int grid = decode_num_splits(t, h, 8320, n, true);
          const mla_ext::ActiveSplits b = mla_ext::decode_active_splits_table(t, h, 8320, n, grid);
          ok = ok && grid == 2 && b.on() && b.live_slots == t + 4 * t / 5;
          for (int k = 0; k < mla_ext::kActiveBuckets; ++k) ok = ok && b.splits[k] == 1;
          ok = ok && mla_ext::decode_workspace_size_for(t, h, 0, n) >= mla_ext::decode_workspace_size(t, h, 2);
          ok = ok && mla_ext::decode_workspace_size_for(512, 256, 0, n) >= mla_ext::decode_workspace_size(t, h, 2);
          if (!ok) printf("wide: t=%ld h=%ld sms=%d: grid %d\n", long(t), long(h), n, grid);
        }
    expect("wide tiles: the anchored grid above 256 tokens", ok, 1);
    // not above 128 heads, at 256 tokens or below the C128 widths; 16 heads keep their own grid
    expect("wide tiles: 16 heads' own grid", decode_num_splits(512, 16, 8320, 132, true), 3);
    expect("wide tiles: not at 129 heads", decode_active_applies(512, 129, 8320, 132), 0);
    expect("wide tiles: not at 256 tokens", decode_active_applies(256, 64, 8320, 132), 0);
    expect("wide tiles: not below the C128 widths", decode_active_applies(512, 64, 4095, 132), 0);
  }
  {
    const int64_t widths[] = {640, 1152, 2048, 8320};
    const int64_t hs[] = {8, 16, 64, 128};
    const int64_t ts[] = {1, 16, 64, 128, 512};
    for (int64_t w : widths)
      for (int64_t h : hs)
        for (int64_t t : ts)
          if (!(mla_ext::decode_balanced_width(t, w) && decode_active_applies(t, h, w, 132)))  // (C128, 8-16 heads x 64-128)
            expect("issue grid unchanged (wave count)", decode_num_splits(t, h, w, 132, mla_ext::decode_balanced_width(t, w)),
                   mla_ext::decode_wave_splits(t, h, w, 132, mla_ext::decode_balanced_width(t, w)));
  }
  // Every automatic count (GPU and CPU) fits the automatic workspace, at several processor counts.
  {
    const int sms[] = {132, 114, 78, 16, 2};
    const int64_t hs[] = {1, 8, 16, 17, 24, 32, 64, 65, 128, 200};
    int ok = 1;
    for (int n : sms)
      for (int64_t h : hs)
        for (int gpu = 0; gpu < 2; ++gpu)
          for (int64_t t = 1; t <= 600 && ok; t += (t < 64 ? 1 : 5)) {
            const size_t ws = mla_ext::decode_workspace_size_for(t, h, 0, n, gpu != 0);
            for (int64_t w = 1; w <= 9000 && ok; w += (w < 300 ? 1 : 37))
              for (int map = 0; map < 4 && ok; ++map) {
                const int s = decode_num_splits(t, h, w, n, (map & 1) != 0, gpu != 0, map >= 2);
                ok = s >= 1 && s <= mla_ext::decode_max_auto_splits(t, h, n, (map & 1) != 0, gpu != 0) &&
                     mla_ext::decode_workspace_size(t, h, s) <= ws;
                if (!ok) printf("t=%ld h=%ld w=%ld sms=%d map=%d (+2: wide16) gpu=%d: %d splits\n", long(t), long(h), long(w), n, map, gpu, s);
              }
          }
    expect("automatic splits within the automatic workspace", ok, 1);
  }
  if (!bad) printf("ok\n");
  return bad;
}
