/* mla_ext C API: a stable, torch-free C ABI over the header-only launchers
 * (csrc/include/mla_ext, the .cuh files), for C and C++ engines linking the shared
 * library mla_ext::mla_ext (CMake: find_package(mla_ext)) and for ctypes.
 *
 * Plain C (C99 or later) and C++: no C++ types, no GPU runtime types. Streams
 * are passed as void* (a cudaStream_t or hipStream_t; NULL = the legacy default
 * stream). Every call is asynchronous on that stream: no allocation, no host
 * synchronisation, CUDA-graph capturable. Every pointer is a device pointer
 * unless stated otherwise. Strides are in elements of the tensor they belong to.
 * The functions that launch or check return an mla_ext_status value (0 = success); bad
 * input is rejected before anything is launched, except what the library cannot see from
 * the params (e.g. an output_lse whose elements overlap an input LSE: the caller's to avoid).
 * The size, split-count, version and string functions return their value. Thread safety:
 * calls may come from several host threads at once (one per device, or several per device on
 * different streams); the library keeps only per-device caches of device attributes, which
 * every thread fills with the same values. Device: the calling thread's current device must be
 * the one the stream and the pointers belong to (its attributes pick kernels and grids). On
 * NVIDIA sm_90+ the kernels are launched programmatically (PDL: each waits for the previous
 * kernel on the stream before its first memory access; the environment variable
 * MLA_EXT_PDL=0 turns it off).
 *
 * Semantics: DESIGN.md §3 (merge_attn_states) and §4 (sparse_mla_decode). */
#ifndef MLA_EXT_CAPI_H_
#define MLA_EXT_CAPI_H_

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#define MLA_EXT_CAPI_EXPORT __declspec(dllexport)
#else
#define MLA_EXT_CAPI_EXPORT __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped when a struct below or a signature changes or an enum gains values; it is also the
 * shared library's soname (libmla_ext.so.<version>, CMakeLists.txt): the structs carry no size
 * field, so the library reads the whole struct of its own version, and a program built against
 * another version's header must be rebuilt (the loader refuses the other soname instead of the
 * library reading past a shorter struct). Programs that dlopen the library check
 * mla_ext_capi_version() and the *_params_size() functions below. 2: MLA_EXT_KV_FP8_DS_MLA_FNUZ
 * and MLA_EXT_KV_FP8_DS_MLA_V4_FNUZ; merge output type, output_scale and
 * prefill_tokens_with_context appended to mla_ext_merge_params; mla_ext_merge_attn_states_n.
 * (Version 1 libraries were named libmla_ext.so.0.1.) */
#define MLA_EXT_CAPI_VERSION 2

/* Status codes (the values of mla_ext::Status). */
enum mla_ext_status {
  MLA_EXT_STATUS_SUCCESS = 0,
  MLA_EXT_STATUS_INVALID_ARGUMENT = 1,     /* a params field is out of its documented range */
  MLA_EXT_STATUS_WORKSPACE_TOO_SMALL = 2,  /* workspace_bytes < what the call needs */
  MLA_EXT_STATUS_LAUNCH_FAILED = 3,        /* the GPU runtime rejected the launch; its error stays
                                              pending (cudaGetLastError reads it). A runtime error
                                              pending before the call is not blamed on the launch
                                              (judged by the launch call's own return code), nor
                                              cleared (builds with CUDA 11.3+ headers: a kernel's
                                              shared-memory opt-in goes through the driver, since the
                                              runtime's cudaFuncSetAttribute clears it). */
  MLA_EXT_STATUS_UNSUPPORTED = 4           /* no kernel fits: every head tile's kernel needs more shared
                                              memory per block than smem_limit (decode) allows */
};

/* Element types of merge_attn_states values (mla_ext::DType). */
enum mla_ext_dtype { MLA_EXT_DTYPE_FLOAT32 = 0, MLA_EXT_DTYPE_FLOAT16 = 1, MLA_EXT_DTYPE_BFLOAT16 = 2 };

/* Output element type of merge_attn_states (mla_ext::MergeOutput). */
enum mla_ext_merge_output {
  MLA_EXT_MERGE_OUTPUT_SAME = 0,          /* the values' dtype */
  MLA_EXT_MERGE_OUTPUT_FP8_E4M3FN = 1,    /* OCP e4m3fn, saturated to +-448, needs output_scale */
  MLA_EXT_MERGE_OUTPUT_FP8_E4M3FNUZ = 2   /* e4m3fnuz (gfx942), saturated to +-240, needs output_scale */
};

/* KV cache formats of sparse_mla_decode (mla_ext::KvFormat, DESIGN.md §4). The FP8 value
 * bytes are OCP e4m3fn (what NVIDIA and gfx950 engines write) unless the name says FNUZ:
 * e4m3fnuz (bias 8, 0x80 = NaN, 0x7f/0xff = +-240), which gfx942 (MI300) engines may write.
 * A FNUZ format has exactly the byte layout of its e4m3fn twin. */
enum mla_ext_kv_format {
  MLA_EXT_KV_BF16 = 0,               /* [num_pages, page_size, d_qk] bf16 */
  MLA_EXT_KV_FP8_DS_MLA = 1,         /* DeepSeek V3.2: 656 B/token inline, d_qk 576 */
  MLA_EXT_KV_FP8_DS_MLA_V4 = 2,      /* DeepSeek V4: 584 B/token, data rows then scale rows per page, d_qk 512 */
  MLA_EXT_KV_FP8_DS_MLA_FNUZ = 3,    /* MLA_EXT_KV_FP8_DS_MLA with e4m3fnuz latent bytes (fp32 scales) */
  MLA_EXT_KV_FP8_DS_MLA_V4_FNUZ = 4  /* MLA_EXT_KV_FP8_DS_MLA_V4 with e4m3fnuz value bytes (UE8M0 scales) */
};

/* ------------------------------------------------------------------------ */
/* merge_attn_states (DESIGN.md §3)                                          */
/* ------------------------------------------------------------------------ */

/* Values [num_tokens, num_heads, head_size] of `dtype` with any token and head
 * strides (last dim contiguous), head_size below 2^31 (MLA_EXT_STATUS_INVALID_ARGUMENT
 * otherwise); LSEs [num_tokens, num_heads] fp32 (natural
 * log, +inf or -inf = empty) with any strides. `output` may alias prefix_output or
 * suffix_output; `output_lse` may be NULL. Zero-initialise, then fill. */
typedef struct mla_ext_merge_params {
  int32_t dtype; /* enum mla_ext_dtype */
  int64_t num_tokens;
  int64_t num_heads;
  int64_t head_size;

  void* output; /* `dtype` elements, or 1-byte FP8 elements when output_kind is FP8 */
  int64_t output_stride_token, output_stride_head; /* all strides in elements of their tensor */
  float* output_lse; /* optional; must share no element with prefix_lse / suffix_lse */
  int64_t output_lse_stride_token, output_lse_stride_head;

  const void* prefix_output;
  int64_t prefix_stride_token, prefix_stride_head;
  const float* prefix_lse;
  int64_t prefix_lse_stride_token, prefix_lse_stride_head;

  const void* suffix_output;
  int64_t suffix_stride_token, suffix_stride_head;
  const float* suffix_lse;
  int64_t suffix_lse_stride_token, suffix_lse_stride_head;

  /* Version 2 (zero: the version-1 behaviour, a plain merge in the values' dtype). */
  int32_t output_kind; /* enum mla_ext_merge_output; FP8: output = saturate(merged * (1 / *output_scale)) */
  int32_t has_prefill_tokens_with_context; /* nonzero: tokens >= prefill_tokens_with_context copy the suffix */
  int64_t prefill_tokens_with_context;     /* >= 0; the suffix (values and LSE) is copied, the prefix not read
                                              (0: prefix_output / prefix_lse may be NULL) */
  const float* output_scale;               /* FP8 outputs: one fp32 in device memory */
} mla_ext_merge_params;

/* out = merge(prefix, suffix). num_sms: kept for interface stability and unused (the grid
 * covers the whole call); pass 0.
 * Refused with MLA_EXT_STATUS_INVALID_ARGUMENT before any launch, at every size (empty calls
 * too), besides the per-field ranges above: a value pointer not aligned to its element (4 bytes
 * for fp32, 2 for fp16 / bf16, 1 for FP8 outputs); an fp32 pointer (LSEs, output_scale) not
 * 4-byte aligned; output rows (head_size elements at t * output_stride_token + h *
 * output_stride_head) or output_lse elements that two (token, head) pairs share (the decode's
 * test, below). Not checked: output_lse overlapping an input LSE. */
MLA_EXT_CAPI_EXPORT int mla_ext_merge_attn_states(const mla_ext_merge_params* p, int num_sms, void* stream);

/* S partial states at once (version 2): values [num_states, num_tokens, num_heads,
 * head_size] of `dtype`, any state/token/head strides, last dim contiguous; lses
 * [num_states, num_tokens, num_heads] fp32, any strides (+-inf = empty). Output
 * [num_tokens, num_heads, head_size] of `dtype`; output_lse optional. All empty:
 * 0 and -inf; one non-empty: copied exactly; any NaN LSE: NaN. Field order and
 * types mirror mla_ext::MergeNParams. */
typedef struct mla_ext_merge_n_params {
  int32_t dtype; /* enum mla_ext_dtype */
  int64_t num_states; /* >= 1 */
  int64_t num_tokens;
  int64_t num_heads;
  int64_t head_size;

  void* output;
  int64_t output_stride_token, output_stride_head;
  float* output_lse; /* optional; must share no element with lses */
  int64_t output_lse_stride_token, output_lse_stride_head;

  const void* values;
  int64_t values_stride_state, values_stride_token, values_stride_head;
  const float* lses;
  int64_t lses_stride_state, lses_stride_token, lses_stride_head;

  const float* attn_sink; /* optional [num_heads] fp32 sink logits (DeepSeek V4): the denominator
                             gains exp(attn_sink[h] - m), output_lse excludes it; NULL = none */
  int64_t attn_sink_stride;
} mla_ext_merge_n_params;

/* S-way merge. Refused like mla_ext_merge_attn_states (element and fp32 alignment of output,
 * values, output_lse, lses and attn_sink; output rows or output_lse elements shared by two
 * (token, head) pairs), and for num_states < 1 or negative sizes. num_sms sizes the grid
 * (<= 0: the current device's count, or a default of 132 without one). */
MLA_EXT_CAPI_EXPORT int mla_ext_merge_attn_states_n(const mla_ext_merge_n_params* p, int num_sms, void* stream);

/* ------------------------------------------------------------------------ */
/* sparse_mla_decode (DESIGN.md §4)                                          */
/* ------------------------------------------------------------------------ */

/* One index set (main or extra) over one paged cache. Field order and types
 * mirror mla_ext::KvSet (the C++ struct of sparse_mla_decode.h).
 * Byte layouts (slot = page * page_size + offset):
 *  - BF16: token rows of d_qk bf16 values, token_stride_bytes apart.
 *  - FP8_DS_MLA[_FNUZ] (V3.2): 656-byte token rows, token_stride_bytes apart: 512 e4m3 latent
 *    bytes, 4 little-endian fp32 scales (scale j covers latent [128j, 128j + 128)), 64 bf16 RoPE.
 *  - FP8_DS_MLA_V4[_FNUZ] (V4): per page, page_size data rows of 576 bytes (448 e4m3 values,
 *    64 bf16 RoPE) from the page start, then at byte page_size * 576 one 8-byte scale row per
 *    token (7 UE8M0 bytes, byte j = 2^(b - 127) for values [64j, 64j + 64), then 1 pad byte);
 *    page_stride_bytes >= page_size * 584 (engines pad it; token_stride_bytes is unused). */
typedef struct mla_ext_kv_set {
  const uint8_t* cache;         /* base of the cache (bytes), 16-byte aligned; NULL = set absent */
  int64_t page_stride_bytes;    /* bytes between pages (tensor stride(0) * element size), multiple of 16 */
  int64_t token_stride_bytes;   /* bytes between tokens inside a page (bf16 / fp8_ds_mla), multiple of 16 */
  int64_t page_size;            /* tokens per page */
  int64_t num_slots;            /* num_pages * page_size; slots >= this are skipped */
  const int32_t* indices;       /* [num_tokens, width] slot ids (page * page_size + offset), < 0 = skipped */
  int64_t indices_stride_token; /* elements */
  int64_t width;
  const int32_t* lengths;       /* optional [num_tokens]; positions >= lengths[t] are skipped */
  int64_t lengths_stride;       /* elements */
} mla_ext_kv_set;

/* Field order and types mirror mla_ext::SparseDecodeParams (whose test-only switches
 * force_mma_sync and two_token, not exposed here, sit in this struct's padding). */
typedef struct mla_ext_sparse_decode_params {
  int32_t kv_format; /* enum mla_ext_kv_format */
  int32_t d_qk;      /* 576 (V3.2) or 512 (V4); V = the first 512 dims */
  int64_t num_tokens;
  int64_t num_heads;
  float softmax_scale;

  const uint16_t* q; /* bf16 bits [num_tokens, num_heads, d_qk], 16-byte aligned rows */
  int64_t q_stride_token, q_stride_head;

  mla_ext_kv_set main;  /* required */
  mla_ext_kv_set extra; /* optional (extra.cache == NULL when absent); shares main's softmax */

  const float* attn_sink; /* optional [num_heads] fp32 logits */
  int64_t attn_sink_stride;

  uint16_t* output; /* bf16 bits [num_tokens, num_heads, 512], written in place */
  int64_t output_stride_token, output_stride_head;
  float* lse; /* optional [num_tokens, num_heads] fp32, natural log, sink excluded */
  int64_t lse_stride_token, lse_stride_head;

  int32_t num_splits;     /* 1..256, or 0 = automatic (mla_ext_sparse_mla_decode_num_splits; on the
                             balanced map with 4096+ entries at 1-16 heads x 0.54 x num_sms to 512
                             tokens, a grid of slots, of which the
                             kernels use as many as the rows' lengths ask for:
                             mla_ext::decode_active_splits_table) */
  uint8_t force_portable; /* nonzero: the portable (no tensor-core) GPU path */
  int32_t head_tile;      /* GPU heads per block: 0 = automatic (use this), 1..64 forces one */
  int64_t smem_limit;     /* GPU shared memory one block may use, bytes: 0 = the device's limit (use
                             this); larger head tiles whose kernels need more are not launched;
                             a value above the device's limit counts as the device's limit */
} mla_ext_sparse_decode_params;

/* Decode into p->output (and p->lse). With num_splits > 1 (after resolving 0),
 * `workspace` needs mla_ext_sparse_mla_decode_workspace_size(T, H, num_splits)
 * bytes of device memory, 16-byte aligned (any contents; the caller owns and
 * reuses it; a misaligned one gives MLA_EXT_STATUS_INVALID_ARGUMENT).
 * num_sms: the device's multiprocessor count (used by num_splits == 0); <= 0
 * queries the current device (none to query: MLA_EXT_STATUS_LAUNCH_FAILED); above 65536:
 * MLA_EXT_STATUS_LAUNCH_FAILED too.
 * Refused with MLA_EXT_STATUS_INVALID_ARGUMENT before any launch, besides the per-field ranges
 * above: num_tokens x num_heads >= 2^31; a softmax_scale that is not finite; negative q, output
 * or lse strides; indices, lengths, attn_sink or lse not 4-byte aligned; output rows (512
 * elements at t * output_stride_token + h * output_stride_head) or lse elements that two
 * (token, head) pairs share (checked with the strides sorted by size: the smaller one at least
 * the row, the larger one past all rows of the smaller). Not checked (the caller's to avoid,
 * as in the torch op's contract, where it is checked): output, lse and workspace overlapping
 * each other or any input (q included, whose V4 rows have the output's shape). */
MLA_EXT_CAPI_EXPORT int mla_ext_sparse_mla_decode(const mla_ext_sparse_decode_params* p, void* workspace,
                                                  size_t workspace_bytes, int num_sms, void* stream);

/* Returned by the workspace-size functions for arguments the decode would reject (negative
 * sizes, num_splits outside 0..256, num_tokens x num_heads >= 2^31) or when
 * num_sms <= 0 and no current device can be queried: an allocation of it fails. */
#define MLA_EXT_INVALID_SIZE ((size_t)-1)

/* Workspace bytes for (num_tokens, num_heads, num_splits): 0 when num_splits == 1; for
 * num_splits == 0 (automatic) what the automatic count needs on the current device
 * (= mla_ext_sparse_mla_decode_workspace_size_for(T, H, 0, 0); MLA_EXT_INVALID_SIZE without
 * a device); MLA_EXT_INVALID_SIZE for invalid arguments (negative sizes, num_splits above 256,
 * num_tokens x num_heads >= 2^31). */
MLA_EXT_CAPI_EXPORT size_t mla_ext_sparse_mla_decode_workspace_size(long long num_tokens, long long num_heads,
                                                                    int num_splits);

/* Workspace bytes that serve every call with at most num_tokens tokens and
 * num_heads heads at this split setting (0 = automatic), for one allocation
 * reused across layers and steps. num_sms <= 0 queries the current device.
 * MLA_EXT_INVALID_SIZE for invalid arguments or no device to query. */
MLA_EXT_CAPI_EXPORT size_t mla_ext_sparse_mla_decode_workspace_size_for(long long num_tokens,
                                                                        long long num_heads, int num_splits,
                                                                        int num_sms);

/* The automatic split count: shapes and processor count only (never tensor
 * contents), so a captured graph replays with new indices. total_width = main
 * width + extra width. This is the count of a call that can take the balanced
 * split map (a V4 FP8 format with a lengths array): at 2..256 tokens and
 * total_width >= 4096 it keeps at least two splits, where other calls get what
 * the policy gives without that floor (possibly one). Index sets of at most two
 * 64-entry tiles (at most four at <= 16 heads) take one split once the call has
 * blocks enough (mla_ext::decode_one_split_pays); calls of 0.3 x num_sms to 512
 * tokens with sets of 257..4095 entries may take 1..8 splits from a model of the
 * busiest processor's time (mla_ext::decode_balance_splits; above 16 heads: at most
 * 256 tokens, sets of 2048+ entries, 1..4 splits). Calls of 1-16 heads x 0.54 x num_sms to
 * 256 tokens with sets of 4096+ entries (V4 C128 layers) get a grid of
 * min(8, 1024 / num_tokens) slots per token, and at 257-512 tokens with
 * 2 x num_sms < num_tokens <= 3 x num_sms a grid of min(8, 1536 / num_tokens), of which the decode
 * (num_splits == 0 only) uses as many as the rows' lengths ask for
 * (mla_ext::decode_active_splits_table). V3.2 calls (fp8_ds_mla) of 1-16 heads on Hopper,
 * whose wide splits run one block per processor, may get another count in the decode from a
 * model of their own (mla_ext::decode_wide16_splits; within the same workspace bound), and calls
 * that cannot take the balanced map (bf16 and V3.2 caches, V4 rows without lengths) get the
 * policy's count without the two-split floor and the active splits' grid, often far fewer (at
 * 128 tokens x 16 heads x 8320 entries: 2, where this query says 8): this query, which has no
 * format argument, gives the count of a V4 FP8 call with lengths.
 * mla_ext_sparse_mla_decode_num_splits_for gives any call's count.
 * num_sms <= 0 queries the current device. 0 for negative arguments, num_sms above 65536 or
 * no device to query. */
MLA_EXT_CAPI_EXPORT int mla_ext_sparse_mla_decode_num_splits(long long num_tokens, long long num_heads,
                                                             long long total_width, int num_sms);

/* The split count mla_ext_sparse_mla_decode runs *p with on num_sms processors (<= 0: the current
 * device's count): p->num_splits where it is 1..256, else (0, automatic) the count the decode
 * resolves from p's kv_format and d_qk, num_tokens, num_heads, both sets' widths, whether
 * lengths are given (the balanced map), smem_limit and force_portable, and the current device
 * (the V3.2 model above). Reads the struct's fields, never the arrays they point to; size a
 * workspace for it with mla_ext_sparse_mla_decode_workspace_size(T, H, count). 0 for fields
 * the decode refuses: p NULL, an unknown kv_format, a d_qk the format does not have, negative
 * sizes or widths, num_splits above 256, num_tokens x num_heads >= 2^31, head_tile outside
 * 0..64, a negative smem_limit; and for num_sms above 65536, or when the count is automatic and
 * num_sms <= 0 finds no device. A count above 0 does not mean the decode accepts the call: it
 * also checks the pointers, strides, alignment and the sets' page fields.
 * (Added within C API version 2: libraries built before it do not export it.) */
MLA_EXT_CAPI_EXPORT int mla_ext_sparse_mla_decode_num_splits_for(const mla_ext_sparse_decode_params* p,
                                                                 int num_sms);

/* ------------------------------------------------------------------------ */
/* Misc                                                                      */
/* ------------------------------------------------------------------------ */

/* sizeof(mla_ext_sparse_decode_params) / (mla_ext_merge_params) / (mla_ext_merge_n_params), so
 * bindings (ctypes, other languages) can check their mirrors. */
MLA_EXT_CAPI_EXPORT size_t mla_ext_sparse_decode_params_size(void);
MLA_EXT_CAPI_EXPORT size_t mla_ext_merge_params_size(void);
MLA_EXT_CAPI_EXPORT size_t mla_ext_merge_n_params_size(void);

/* Human-readable text for a status value (a static string). */
MLA_EXT_CAPI_EXPORT const char* mla_ext_status_string(int status);

/* MLA_EXT_CAPI_VERSION of the library (compare with the header's). */
MLA_EXT_CAPI_EXPORT int mla_ext_capi_version(void);

/* "cuda" or "hip": the GPU runtime this library was built for. */
MLA_EXT_CAPI_EXPORT const char* mla_ext_gpu_runtime(void);

#ifdef __cplusplus
}
#endif

#endif /* MLA_EXT_CAPI_H_ */
