// Host check of the decode launch policy helpers in sparse_mla_decode.h that the GPU launcher
// uses but no CPU test reaches (tools/compile_check.sh builds and runs it; exit status 1 and a
// line per mismatch on failure).
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
  if (!bad) printf("ok\n");
  return bad;
}
