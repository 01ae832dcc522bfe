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
  expect("splits(C128, 16 heads, 140 tokens)", decode_num_splits(140, 16, 8320, 132, true), 2);
  expect("splits(C4 Pro, 16 heads, 140 tokens, CPU)", decode_num_splits(140, 16, 1152, 132, false, false), 1);
  // A modelled gain of exactly 8% keeps the wave count on every host (integer costs: 2,525,952 is
  // 92% of 2,745,600 for 16 heads x 396 tokens x 4095 entries, one split against two).
  expect("cost(396, 16, 4095, 1 split)", long(mla_ext::decode_split_cost(396, 16, 4095, 1, 132)), 2745600);
  expect("cost(396, 16, 4095, 2 splits)", long(mla_ext::decode_split_cost(396, 16, 4095, 2, 132)), 2525952);
  expect("splits(exact 8% gain, 132 processors)", decode_num_splits(396, 16, 4095, 132, false), 1);
  expect("splits(exact 8% gain, 80 processors)", decode_num_splits(192, 16, 897, 80, false), 1);
  {
    const int64_t widths[] = {640, 1152, 2048, 8320};
    const int64_t hs[] = {8, 16, 64, 128};
    const int64_t ts[] = {1, 16, 64, 128, 512};
    for (int64_t w : widths)
      for (int64_t h : hs)
        for (int64_t t : ts)
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
              for (int map = 0; map < 2 && ok; ++map) {
                const int s = decode_num_splits(t, h, w, n, map != 0, gpu != 0);
                ok = s >= 1 && s <= mla_ext::decode_max_auto_splits(t, h, n, map != 0, gpu != 0) &&
                     mla_ext::decode_workspace_size(t, h, s) <= ws;
                if (!ok) printf("t=%ld h=%ld w=%ld sms=%d map=%d gpu=%d: %d splits\n", long(t), long(h), long(w), n, map, gpu, s);
              }
          }
    expect("automatic splits within the automatic workspace", ok, 1);
  }
  if (!bad) printf("ok\n");
  return bad;
}
