/* Host-only checks of the C API's argument validation (CI, no GPU needed): every case here
 * must be rejected before any launch, so the results do not depend on a device being present.
 * Built and run by tools/cmake_check.sh against the installed package. Exit 0 = all ok. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "mla_ext_capi.h"

static int failures = 0;
#define EXPECT(cond, what)                              \
  do {                                                  \
    if (!(cond)) {                                      \
      fprintf(stderr, "capi_host_check: FAILED %s\n", what); \
      ++failures;                                       \
    }                                                   \
  } while (0)

int main(void) {
  static uint8_t buf[1 << 16];
  uint8_t* aligned = (uint8_t*)(((uintptr_t)buf + 255) & ~(uintptr_t)255);
  EXPECT(mla_ext_capi_version() == MLA_EXT_CAPI_VERSION, "version matches the header");
  EXPECT(mla_ext_merge_params_size() == sizeof(mla_ext_merge_params), "merge params size");
  EXPECT(mla_ext_sparse_decode_params_size() == sizeof(mla_ext_sparse_decode_params), "decode params size");

  /* workspace sizes */
  EXPECT(mla_ext_sparse_mla_decode_workspace_size(4, 16, 1) == 0, "one split needs no workspace");
  EXPECT(mla_ext_sparse_mla_decode_workspace_size(4, 16, 2) > 0, "two splits need a workspace");
  EXPECT(mla_ext_sparse_mla_decode_workspace_size(4, 16, 257) == MLA_EXT_INVALID_SIZE, "num_splits > 256");
  EXPECT(mla_ext_sparse_mla_decode_workspace_size(-1, 16, 2) == MLA_EXT_INVALID_SIZE, "negative tokens");
  EXPECT(mla_ext_sparse_mla_decode_workspace_size(1LL << 62, 4, 2) == MLA_EXT_INVALID_SIZE, "overflow");
  EXPECT(mla_ext_sparse_mla_decode_workspace_size_for(64, 16, -5, 132) == MLA_EXT_INVALID_SIZE, "negative splits");
  EXPECT(mla_ext_sparse_mla_decode_workspace_size_for(64, 16, 0, 132) > 0, "automatic splits on 132 SMs");
  EXPECT(mla_ext_sparse_mla_decode_workspace_size(1LL << 16, 1LL << 15, 2) == MLA_EXT_INVALID_SIZE,
         "num_tokens x num_heads = 2^31: the decode's limit");
  EXPECT(mla_ext_sparse_mla_decode_workspace_size(1LL << 16, (1LL << 15) - 1, 2) != MLA_EXT_INVALID_SIZE,
         "just below the decode's limit");
  EXPECT(mla_ext_sparse_mla_decode_workspace_size_for(64, 16, 0, 1 << 20) == MLA_EXT_INVALID_SIZE,
         "a processor count no GPU has");
  /* num_splits 0 = automatic here too: the current device's count, or invalid without one */
  EXPECT(mla_ext_sparse_mla_decode_workspace_size(4, 16, 0) == mla_ext_sparse_mla_decode_workspace_size_for(4, 16, 0, 0),
         "workspace_size(.., 0) = workspace_size_for(.., 0, current device)");
  EXPECT(mla_ext_sparse_mla_decode_num_splits(1, 16, 640, 132) == 20, "640 entries: 32-entry splits");
  /* tile rounding: 8320 entries over 64 splits would walk 3 tiles of 64; 65 splits walk 2 */
  EXPECT(mla_ext_sparse_mla_decode_num_splits(1, 16, 8320, 132) == 65, "C128 row, 16 heads: 65 splits");
  EXPECT(mla_ext_sparse_mla_decode_num_splits(1, 128, 8320, 132) == 65, "C128 row, 2 head groups: 130 blocks");
  EXPECT(mla_ext_sparse_mla_decode_num_splits(64, 16, 8320, 132) == 4, "64 tokens: 4 splits");
  /* above 16 heads: one wave of blocks for the smallest head tile whose splits stay short */
  EXPECT(mla_ext_sparse_mla_decode_num_splits(1, 128, 640, 132) == 16, "C4, 128 heads: 16 splits of 16-head blocks");
  EXPECT(mla_ext_sparse_mla_decode_num_splits(4, 128, 640, 132) == 8, "C4, 128 heads x 4: 8 splits of 32-head blocks");
  EXPECT(mla_ext_sparse_mla_decode_num_splits(2, 128, 8320, 132) == 33, "C128, 128 heads x 2: one wave of 64-head blocks");
  EXPECT(mla_ext_sparse_mla_decode_num_splits(64, 128, 8320, 132) == 2, "C128, 128 heads x 64: two splits kept");
  EXPECT(mla_ext_sparse_mla_decode_num_splits(200, 128, 8320, 132) == 2, "C128, 128 heads x 200: two-split floor");
  EXPECT(mla_ext_sparse_mla_decode_num_splits(256, 16, 8320, 132) == 4, "C128, 16 heads x 256: the active splits' grid");
  EXPECT(mla_ext_sparse_mla_decode_num_splits(140, 16, 8320, 132) == 7, "C128, 16 heads x 140: the active splits' grid");
  EXPECT(mla_ext_sparse_mla_decode_num_splits(256, 17, 8320, 132) == 2, "C128, 17 heads x 256: two-split floor");
  EXPECT(mla_ext_sparse_mla_decode_num_splits(257, 128, 8320, 132) == 2, "C128, 128 heads x 257: the anchored map's grid");
  EXPECT(mla_ext_sparse_mla_decode_num_splits(512, 17, 8320, 132) == 2, "C128, 17 heads x 512: the anchored map's grid");
  EXPECT(mla_ext_sparse_mla_decode_num_splits(257, 129, 8320, 132) == 1, "C128, 129 heads x 257: one split");
  EXPECT(mla_ext_sparse_mla_decode_num_splits(513, 64, 8320, 132) == 1, "C128, 513 tokens: one split");
  EXPECT(mla_ext_sparse_mla_decode_num_splits(200, 128, 2048, 132) == 1, "V3.2 width, 200 tokens: one split");
  EXPECT(mla_ext_sparse_mla_decode_num_splits(1LL << 62, 64, 1024, 132) == 1, "huge num_tokens: no overflow");
  EXPECT(mla_ext_sparse_mla_decode_num_splits(1LL << 61, 256, 1LL << 62, 132) == 1, "huge everything");
  /* the automatic split count always fits the workspace sized for automatic splits */
  {
    static const long long heads[] = {1, 8, 16, 24, 32, 40, 64, 65, 128, 200};
    static const int sms[] = {132, 2, 16};
    int ok = 1;
    for (int si = 0; si < 3 && ok; ++si)
      for (long long T = 1; T <= 300 && ok; T += (si == 0 || T < 8 ? 1 : 7))
        for (int hi = 0; hi < 10 && ok; ++hi) {
          const size_t auto_ws = mla_ext_sparse_mla_decode_workspace_size_for(T, heads[hi], 0, sms[si]);
          for (long long W = 1; W <= 20000 && ok; W += (W < 512 ? 1 : 61)) {
            const int s = mla_ext_sparse_mla_decode_num_splits(T, heads[hi], W, sms[si]);
            ok = s >= 1 && s <= 256 && mla_ext_sparse_mla_decode_workspace_size(T, heads[hi], s) <= auto_ws;
          }
        }
    EXPECT(ok, "automatic splits within the automatic workspace");
  }
  /* num_splits_for: the count the decode runs a call with, from the call's fields */
  {
    mla_ext_sparse_decode_params d;
    memset(&d, 0, sizeof d);
    d.kv_format = MLA_EXT_KV_BF16;
    d.d_qk = 512;
    d.num_tokens = 128;
    d.num_heads = 16;
    d.main.cache = aligned;
    d.main.width = 128;
    d.extra.cache = aligned;
    d.extra.width = 8192;
    EXPECT(mla_ext_sparse_mla_decode_num_splits(128, 16, 8320, 132) == 8, "C128 width, 128 tokens: 8 (V4 rows with lengths)");
    EXPECT(mla_ext_sparse_mla_decode_num_splits_for(&d, 132) == 2, "bf16 rows of that width: 2 (no balanced map)");
    d.kv_format = MLA_EXT_KV_FP8_DS_MLA_V4;
    EXPECT(mla_ext_sparse_mla_decode_num_splits_for(&d, 132) == 2, "V4 rows without lengths: 2");
    d.extra.lengths = (const int32_t*)aligned;
    EXPECT(mla_ext_sparse_mla_decode_num_splits_for(&d, 132) == 8, "V4 rows with lengths: the width query's 8");
    d.num_splits = 5;
    EXPECT(mla_ext_sparse_mla_decode_num_splits_for(&d, 132) == 5, "a given count comes back");
    EXPECT(mla_ext_sparse_mla_decode_num_splits_for(&d, 1 << 17) == 0, "a processor count no GPU has");
    d.num_splits = 257;
    EXPECT(mla_ext_sparse_mla_decode_num_splits_for(&d, 132) == 0, "num_splits above 256");
    d.num_splits = 0;
    d.kv_format = 9;
    EXPECT(mla_ext_sparse_mla_decode_num_splits_for(&d, 132) == 0, "an unknown kv_format");
    d.kv_format = MLA_EXT_KV_FP8_DS_MLA_V4;
    d.d_qk = 576;
    EXPECT(mla_ext_sparse_mla_decode_num_splits_for(&d, 132) == 0, "V4 rows with d_qk 576");
    d.d_qk = 512;
    d.head_tile = 65;
    EXPECT(mla_ext_sparse_mla_decode_num_splits_for(&d, 132) == 0, "head_tile above 64");
    d.head_tile = 0;
    d.extra.width = -4000;
    EXPECT(mla_ext_sparse_mla_decode_num_splits_for(&d, 132) == 0, "a negative width");
    d.extra.width = 8192;
    d.num_tokens = -1;
    EXPECT(mla_ext_sparse_mla_decode_num_splits_for(&d, 132) == 0, "negative num_tokens");
    EXPECT(mla_ext_sparse_mla_decode_num_splits_for(NULL, 132) == 0, "no params");
  }

  /* merge: an FP8 output without a scale fails even with nothing to merge */
  {
    mla_ext_merge_params m;
    memset(&m, 0, sizeof m);
    m.dtype = MLA_EXT_DTYPE_BFLOAT16;
    m.output_kind = MLA_EXT_MERGE_OUTPUT_FP8_E4M3FN;
    EXPECT(mla_ext_merge_attn_states(&m, 132, NULL) == MLA_EXT_STATUS_INVALID_ARGUMENT, "fp8 output, no scale");
    m.output_kind = MLA_EXT_MERGE_OUTPUT_SAME;
    m.has_prefill_tokens_with_context = 1;
    m.prefill_tokens_with_context = -1;
    EXPECT(mla_ext_merge_attn_states(&m, 132, NULL) == MLA_EXT_STATUS_INVALID_ARGUMENT, "negative prefill tokens");
    m.has_prefill_tokens_with_context = 0;
    EXPECT(mla_ext_merge_attn_states(&m, 132, NULL) == MLA_EXT_STATUS_SUCCESS, "empty merge");
    m.output_kind = MLA_EXT_MERGE_OUTPUT_FP8_E4M3FN;
    m.output_scale = (const float*)(aligned + 2);
    EXPECT(mla_ext_merge_attn_states(&m, 132, NULL) == MLA_EXT_STATUS_INVALID_ARGUMENT, "misaligned output_scale");
    /* a real merge without a prefix pointer: refused, unless no token has a prefix */
    m.output_kind = MLA_EXT_MERGE_OUTPUT_SAME;
    m.output_scale = NULL;
    m.num_tokens = 2;
    m.num_heads = 2;
    m.head_size = 8;
    m.output = aligned;
    m.output_stride_token = 16;
    m.output_stride_head = 8;
    m.suffix_output = aligned + 1024;
    m.suffix_stride_token = 16;
    m.suffix_stride_head = 8;
    m.suffix_lse = (const float*)(aligned + 2048);
    m.suffix_lse_stride_token = 2;
    m.suffix_lse_stride_head = 1;
    EXPECT(mla_ext_merge_attn_states(&m, 0, NULL) == MLA_EXT_STATUS_INVALID_ARGUMENT, "merge without a prefix");
    if (mla_ext_sparse_mla_decode_workspace_size_for(2, 16, 0, 0) == MLA_EXT_INVALID_SIZE) {
      /* no device: accepted calls fail at the launch (nothing can run here) */
      m.has_prefill_tokens_with_context = 1;
      m.prefill_tokens_with_context = 0;
      EXPECT(mla_ext_merge_attn_states(&m, 0, NULL) == MLA_EXT_STATUS_LAUNCH_FAILED,
             "no prefix needed when no token has one");
    }
    /* a complete merge, then one field broken at a time: refused before any launch */
    m.has_prefill_tokens_with_context = 0;
    m.prefill_tokens_with_context = 0;
    m.prefix_output = aligned + 4096;
    m.prefix_stride_token = 16;
    m.prefix_stride_head = 8;
    m.prefix_lse = (const float*)(aligned + 6144);
    m.prefix_lse_stride_token = 2;
    m.prefix_lse_stride_head = 1;
    m.output_lse = (float*)(aligned + 8192);
    m.output_lse_stride_token = 2;
    m.output_lse_stride_head = 1;
    {
      static const char* what[] = {"merge: misaligned prefix_lse", "merge: misaligned output_lse",
                                   "merge: odd bf16 output address", "merge: odd bf16 suffix address",
                                   "merge: output heads sharing rows (stride 0)",
                                   "merge: output heads overlapping (stride 4 < head_size 8)",
                                   "merge: output_lse heads sharing elements", "merge: misaligned fp32 output"};
      for (int i = 0; i < 8; ++i) {
        mla_ext_merge_params b = m;
        switch (i) {
          case 0: b.prefix_lse = (const float*)(aligned + 6146); break;
          case 1: b.output_lse = (float*)(aligned + 8193); break;
          case 2: b.output = aligned + 1; break;
          case 3: b.suffix_output = aligned + 1025; break;
          case 4: b.output_stride_head = 0; break;
          case 5: b.output_stride_head = 4; break;
          case 6: b.output_lse_stride_head = 0; break;
          default: b.dtype = MLA_EXT_DTYPE_FLOAT32; b.output = aligned + 2; break;
        }
        EXPECT(mla_ext_merge_attn_states(&b, 0, NULL) == MLA_EXT_STATUS_INVALID_ARGUMENT, what[i]);
      }
    }
    if (mla_ext_sparse_mla_decode_workspace_size_for(2, 16, 0, 0) == MLA_EXT_INVALID_SIZE) {
      mla_ext_merge_params b = m;
      EXPECT(mla_ext_merge_attn_states(&b, 0, NULL) == MLA_EXT_STATUS_LAUNCH_FAILED, "merge: complete call accepted");
      b.output = aligned + 1; /* FP8 output: 1-byte elements, any address */
      b.output_kind = MLA_EXT_MERGE_OUTPUT_FP8_E4M3FN;
      b.output_scale = (const float*)(aligned + 8448);
      EXPECT(mla_ext_merge_attn_states(&b, 0, NULL) == MLA_EXT_STATUS_LAUNCH_FAILED,
             "merge: FP8 output at an odd address accepted");
      b = m;
      b.output_stride_token = 8; /* [H, T, D] seen as [T, H, D] */
      b.output_stride_head = 16;
      EXPECT(mla_ext_merge_attn_states(&b, 0, NULL) == MLA_EXT_STATUS_LAUNCH_FAILED,
             "merge: head-major output accepted");
    }
  }

  /* merge of S states: the same checks */
  {
    mla_ext_merge_n_params n;
    memset(&n, 0, sizeof n);
    EXPECT(mla_ext_merge_n_params_size() == sizeof(mla_ext_merge_n_params), "merge_n params size");
    n.dtype = MLA_EXT_DTYPE_BFLOAT16;
    n.num_states = 3;
    n.num_tokens = 2;
    n.num_heads = 2;
    n.head_size = 8;
    n.output = aligned;
    n.output_stride_token = 16;
    n.output_stride_head = 8;
    n.values = aligned + 1024;
    n.values_stride_state = 32;
    n.values_stride_token = 16;
    n.values_stride_head = 8;
    n.lses = (const float*)(aligned + 4096);
    n.lses_stride_state = 4;
    n.lses_stride_token = 2;
    n.lses_stride_head = 1;
    {
      static const char* what[] = {"merge_n: misaligned lses", "merge_n: misaligned attn_sink",
                                   "merge_n: odd bf16 values address", "merge_n: output heads sharing rows",
                                   "merge_n: output_lse heads sharing elements", "merge_n: no states",
                                   "merge_n: negative head_size"};
      for (int i = 0; i < 7; ++i) {
        mla_ext_merge_n_params b = n;
        switch (i) {
          case 0: b.lses = (const float*)(aligned + 4098); break;
          case 1: b.attn_sink = (const float*)(aligned + 6145); break;
          case 2: b.values = aligned + 1025; break;
          case 3: b.output_stride_head = 0; break;
          case 4: b.output_lse = (float*)(aligned + 8192); b.output_lse_stride_token = 1; break;
          case 5: b.num_states = 0; break;
          default: b.head_size = -8; break;
        }
        EXPECT(mla_ext_merge_attn_states_n(&b, 0, NULL) == MLA_EXT_STATUS_INVALID_ARGUMENT, what[i]);
      }
    }
  }

  /* decode: a well-formed bf16 call, then one field broken at a time */
  {
    static int32_t idx[2 * 4] = {0, 1, 2, 3, 4, 5, 6, 7};
    mla_ext_sparse_decode_params p, bad;
    size_t ws = mla_ext_sparse_mla_decode_workspace_size(2, 16, 4);
    memset(&p, 0, sizeof p);
    p.kv_format = MLA_EXT_KV_BF16;
    p.d_qk = 512;
    p.num_tokens = 2;
    p.num_heads = 16;
    p.softmax_scale = 0.05f;
    p.q = (const uint16_t*)aligned;
    p.q_stride_token = 16 * 512;
    p.q_stride_head = 512;
    p.main.cache = aligned;
    p.main.page_size = 4;
    p.main.num_slots = 8;
    p.main.token_stride_bytes = 1024;
    p.main.page_stride_bytes = 4096;
    p.main.indices = idx;
    p.main.indices_stride_token = 4;
    p.main.width = 4;
    p.output = (uint16_t*)aligned;
    p.output_stride_token = 16 * 512;
    p.output_stride_head = 512;
    p.num_splits = 4;
    EXPECT(ws > 0 && ws != MLA_EXT_INVALID_SIZE, "decode workspace size");
    bad = p;
    EXPECT(mla_ext_sparse_mla_decode(&bad, aligned + 4, ws, 132, NULL) == MLA_EXT_STATUS_INVALID_ARGUMENT,
           "misaligned workspace");
    EXPECT(mla_ext_sparse_mla_decode(&bad, aligned, ws - 1, 132, NULL) == MLA_EXT_STATUS_WORKSPACE_TOO_SMALL,
           "workspace too small");
    bad = p;
    bad.main.page_stride_bytes = -16;
    EXPECT(mla_ext_sparse_mla_decode(&bad, aligned, ws, 132, NULL) == MLA_EXT_STATUS_INVALID_ARGUMENT,
           "negative page stride");
    bad = p;
    bad.main.indices_stride_token = -100;
    EXPECT(mla_ext_sparse_mla_decode(&bad, aligned, ws, 132, NULL) == MLA_EXT_STATUS_INVALID_ARGUMENT,
           "negative indices stride");
    if (mla_ext_sparse_mla_decode_workspace_size_for(2, 16, 0, 0) == MLA_EXT_INVALID_SIZE) {
      /* no device here to give a processor count: automatic splits are a device error */
      bad = p;
      bad.num_splits = 0;
      EXPECT(mla_ext_sparse_mla_decode(&bad, aligned, ws, 0, NULL) == MLA_EXT_STATUS_LAUNCH_FAILED,
             "automatic splits without a device");
    }
    bad = p;
    bad.num_splits = 257;
    EXPECT(mla_ext_sparse_mla_decode(&bad, aligned, ws, 132, NULL) == MLA_EXT_STATUS_INVALID_ARGUMENT,
           "num_splits > 256");
    bad = p;
    bad.kv_format = MLA_EXT_KV_FP8_DS_MLA_V4;
    bad.main.page_stride_bytes = 4 * 576; /* < page_size * 584 */
    EXPECT(mla_ext_sparse_mla_decode(&bad, aligned, ws, 132, NULL) == MLA_EXT_STATUS_INVALID_ARGUMENT,
           "V4 page stride below page_size * 584");
    bad = p;
    bad.head_tile = 65;
    EXPECT(mla_ext_sparse_mla_decode(&bad, aligned, ws, 132, NULL) == MLA_EXT_STATUS_INVALID_ARGUMENT,
           "head_tile > 64");
    bad = p;
    bad.head_tile = -1;
    EXPECT(mla_ext_sparse_mla_decode(&bad, aligned, ws, 132, NULL) == MLA_EXT_STATUS_INVALID_ARGUMENT,
           "negative head_tile");
    bad = p;
    bad.smem_limit = -1;
    EXPECT(mla_ext_sparse_mla_decode(&bad, aligned, ws, 132, NULL) == MLA_EXT_STATUS_INVALID_ARGUMENT,
           "negative smem_limit");
    /* the per-field ranges hold for empty calls too (the launcher returns early for them only after) */
    bad = p;
    bad.num_tokens = 0;
    EXPECT(mla_ext_sparse_mla_decode(&bad, aligned, ws, 132, NULL) == MLA_EXT_STATUS_SUCCESS, "empty decode");
    bad.head_tile = 65;
    EXPECT(mla_ext_sparse_mla_decode(&bad, aligned, ws, 132, NULL) == MLA_EXT_STATUS_INVALID_ARGUMENT,
           "head_tile > 64 on an empty call");
    bad.head_tile = 0;
    bad.smem_limit = -1;
    EXPECT(mla_ext_sparse_mla_decode(&bad, aligned, ws, 132, NULL) == MLA_EXT_STATUS_INVALID_ARGUMENT,
           "negative smem_limit on an empty call");
    bad = p;
    bad.q = (const uint16_t*)(aligned + 2);
    EXPECT(mla_ext_sparse_mla_decode(&bad, aligned, ws, 132, NULL) == MLA_EXT_STATUS_INVALID_ARGUMENT,
           "misaligned q");
    {
      /* preconditions the launcher leaves to its callers, checked by the C API */
      static const struct {
        int field;
        const char* what;
      } cases[] = {{0, "NaN softmax_scale"}, {1, "infinite softmax_scale"}, {2, "negative q stride"},
                   {3, "misaligned indices"}, {4, "misaligned lse"}, {5, "output heads sharing rows (stride 0)"},
                   {6, "output token and head strides colliding"}, {7, "output heads overlapping (stride 256)"},
                   {8, "lse heads sharing elements"}, {9, "negative output stride"}};
      for (unsigned i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
        bad = p;
        bad.lse = (float*)aligned;
        bad.lse_stride_token = 16;
        bad.lse_stride_head = 1;
        switch (cases[i].field) {
          case 0: bad.softmax_scale = NAN; break;
          case 1: bad.softmax_scale = INFINITY; break;
          case 2: bad.q_stride_token = -8; break;
          case 3: bad.main.indices = (const int32_t*)((const uint8_t*)idx + 2); break;
          case 4: bad.lse = (float*)(aligned + 2); break;
          case 5: bad.output_stride_head = 0; break;
          case 6: bad.output_stride_token = 512; bad.output_stride_head = 512; break;
          case 7: bad.output_stride_head = 256; break;
          case 8: bad.lse_stride_head = 0; break;
          default: bad.output_stride_token = -16 * 512; break;
        }
        EXPECT(mla_ext_sparse_mla_decode(&bad, aligned, ws, 132, NULL) == MLA_EXT_STATUS_INVALID_ARGUMENT,
               cases[i].what);
      }
    }
    if (mla_ext_sparse_mla_decode_workspace_size_for(2, 16, 0, 0) == MLA_EXT_INVALID_SIZE) {
      /* no device (so nothing can launch): layouts that must pass the checks get as far as the
         launch, which fails; a refused one would say INVALID_ARGUMENT */
      bad = p;
      bad.lse = (float*)aligned; /* a [H, T] buffer seen as [T, H] */
      bad.lse_stride_token = 1;
      bad.lse_stride_head = 2;
      EXPECT(mla_ext_sparse_mla_decode(&bad, aligned, ws, 132, NULL) == MLA_EXT_STATUS_LAUNCH_FAILED,
             "transposed lse accepted");
      bad = p;
      bad.output_stride_token = 512; /* heads outermost: [H, T, 512] seen as [T, H, 512] */
      bad.output_stride_head = 2 * 512;
      EXPECT(mla_ext_sparse_mla_decode(&bad, aligned, ws, 132, NULL) == MLA_EXT_STATUS_LAUNCH_FAILED,
             "head-major output accepted");
      bad = p;
      bad.num_splits = 0;
      EXPECT(mla_ext_sparse_mla_decode(&bad, aligned, ws, 1 << 20, NULL) == MLA_EXT_STATUS_LAUNCH_FAILED,
             "automatic splits with a processor count no GPU has");
    }
    /* refused before any launch, device or not */
    EXPECT(mla_ext_sparse_mla_decode(&p, aligned, ws, 1 << 20, NULL) == MLA_EXT_STATUS_LAUNCH_FAILED,
           "explicit splits with a processor count no GPU has");
    EXPECT(mla_ext_sparse_mla_decode_num_splits(1, 16, 640, 1 << 20) == 0, "num_splits: no GPU has 2^20 processors");
  }
  EXPECT(strstr(mla_ext_status_string(MLA_EXT_STATUS_UNSUPPORTED), "shared-memory") != NULL,
         "UNSUPPORTED's text names the shared-memory limit");
  printf("capi_host_check: %s\n", failures ? "FAILED" : "ok");
  return failures ? 1 : 0;
}
