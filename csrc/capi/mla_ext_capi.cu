// mla_ext C entry points (see mla_ext_capi.h): copy the C structs field by
// field into the C++ params of the header-only launchers and launch. The C
// structs mirror the C++ ones in order and type (the ctypes harness in
// tests/gpu_dev relies on it); the size and offset checks below catch a field
// added to a C++ params struct without its C mirror, except the C++-only test
// switches of SparseDecodeParams (force_mma_sync, two_token), which sit in the
// C struct's padding and keep their defaults (offsets checked around them).
#include "mla_ext_capi.h"

#include <cmath>

#include "mla_ext/merge_attn_states.cuh"
#include "mla_ext/sparse_mla_decode.cuh"

static_assert(sizeof(mla_ext_merge_params) == sizeof(mla_ext::MergeParams),
              "mla_ext_merge_params (mla_ext_capi.h) no longer mirrors mla_ext::MergeParams");
static_assert(sizeof(mla_ext_merge_n_params) == sizeof(mla_ext::MergeNParams),
              "mla_ext_merge_n_params (mla_ext_capi.h) no longer mirrors mla_ext::MergeNParams");
static_assert(int(mla_ext::MergeOutput::kFp8E4M3FNUZ) == MLA_EXT_MERGE_OUTPUT_FP8_E4M3FNUZ, "merge outputs drifted");
static_assert(sizeof(mla_ext_kv_set) == sizeof(mla_ext::KvSet),
              "mla_ext_kv_set (mla_ext_capi.h) no longer mirrors mla_ext::KvSet");
static_assert(sizeof(mla_ext_sparse_decode_params) == sizeof(mla_ext::SparseDecodeParams),
              "mla_ext_sparse_decode_params (mla_ext_capi.h) no longer mirrors mla_ext::SparseDecodeParams");
#define MLA_EXT_SAME_OFFSET(field)                                                                \
  static_assert(offsetof(mla_ext_sparse_decode_params, field) == offsetof(mla_ext::SparseDecodeParams, field), \
                "mla_ext_sparse_decode_params." #field " no longer at mla_ext::SparseDecodeParams' offset")
MLA_EXT_SAME_OFFSET(lse_stride_head);
MLA_EXT_SAME_OFFSET(num_splits);
MLA_EXT_SAME_OFFSET(force_portable);
MLA_EXT_SAME_OFFSET(head_tile);
MLA_EXT_SAME_OFFSET(smem_limit);
#undef MLA_EXT_SAME_OFFSET
static_assert(int(mla_ext::Status::kUnsupported) == MLA_EXT_STATUS_UNSUPPORTED, "status codes drifted");
static_assert(int(mla_ext::KvFormat::kFP8DsMlaV4) == MLA_EXT_KV_FP8_DS_MLA_V4, "kv formats drifted");
static_assert(int(mla_ext::KvFormat::kFP8DsMlaFnuz) == MLA_EXT_KV_FP8_DS_MLA_FNUZ, "kv formats drifted");
static_assert(int(mla_ext::KvFormat::kFP8DsMlaV4Fnuz) == MLA_EXT_KV_FP8_DS_MLA_V4_FNUZ, "kv formats drifted");
static_assert(int(mla_ext::DType::kBFloat16) == MLA_EXT_DTYPE_BFLOAT16, "dtypes drifted");

namespace {

// A processor count: the caller's (1..kMaxSms), the current device's for <= 0, 0 (none) for a
// count no GPU has (it would also bound host loops: decode_workspace_size_for).
constexpr int kMaxSms = 1 << 16;
int resolve_sms(int num_sms) {
  if (num_sms > kMaxSms) return 0;
  return num_sms > 0 ? num_sms : mla_ext::current_device_sm_count();
}

// Sizes the decode accepts: num_tokens x num_heads below 2^31 (launch_sparse_mla_decode),
// num_splits 0 (automatic) or 1..kMaxSplits.
bool workspace_args_ok(long long num_tokens, long long num_heads, int num_splits) {
  if (num_tokens < 0 || num_heads < 0 || num_splits < 0 || num_splits > mla_ext::kMaxSplits) return false;
  return double(num_tokens) * double(num_heads) < 2147483648.0;  // 2^31
}

// Rows of `width` elements at t * st + h * sh (t < T, h < H) that no two (t, h) share: with the
// strides sorted by magnitude, the smaller one's rows must not overlap each other and the larger
// one must step past all of them (sufficient, and what every dense or padded layout satisfies).
bool rows_disjoint(int64_t T, int64_t H, int64_t st, int64_t sh, int64_t width) {
  if (T <= 0 || H <= 0) return true;
  int64_t n1 = T, s1 = st < 0 ? -st : st, n2 = H, s2 = sh < 0 ? -sh : sh;
  if (n1 == 1) s1 = 0;
  if (n2 == 1) s2 = 0;
  if (s1 > s2 || (s1 == s2 && n1 > n2)) {
    const int64_t tn = n1, ts = s1;
    n1 = n2; s1 = s2; n2 = tn; s2 = ts;
  }
  if (n1 > 1 && s1 < width) return false;
  const double extent = n1 > 1 ? double(s1) * double(n1 - 1) + double(width) : double(width);
  return n2 <= 1 || double(s2) >= extent;
}

// Output rows (`width` elements) and, where present, LSE elements that no two (token, head)
// pairs share: the check every entry point makes before a launch.
bool outputs_disjoint(int64_t T, int64_t H, int64_t out_st, int64_t out_sh, int64_t width, const float* lse,
                      int64_t lse_st, int64_t lse_sh) {
  return rows_disjoint(T, H, out_st, out_sh, width) && (lse == nullptr || rows_disjoint(T, H, lse_st, lse_sh, 1));
}

bool aligned4(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 3u) == 0; }
bool aligned_to(const void* p, uintptr_t bytes) { return (reinterpret_cast<uintptr_t>(p) & (bytes - 1)) == 0; }

// Bytes per value of a merge dtype (checked in range by the caller).
uintptr_t merge_value_bytes(int32_t dtype) { return dtype == MLA_EXT_DTYPE_FLOAT32 ? 4u : 2u; }

mla_ext::KvSet to_cpp(const mla_ext_kv_set& c) {
  mla_ext::KvSet s;
  s.cache = c.cache;
  s.page_stride_bytes = c.page_stride_bytes;
  s.token_stride_bytes = c.token_stride_bytes;
  s.page_size = c.page_size;
  s.num_slots = c.num_slots;
  s.indices = c.indices;
  s.indices_stride_token = c.indices_stride_token;
  s.width = c.width;
  s.lengths = c.lengths;
  s.lengths_stride = c.lengths_stride;
  return s;
}

// The launcher's params from the C struct's; num_splits as given (0: automatic, resolved by the
// caller).
mla_ext::SparseDecodeParams to_cpp(const mla_ext_sparse_decode_params& c) {
  mla_ext::SparseDecodeParams p;
  p.kv_format = static_cast<mla_ext::KvFormat>(c.kv_format);
  p.d_qk = c.d_qk;
  p.num_tokens = c.num_tokens;
  p.num_heads = c.num_heads;
  p.softmax_scale = c.softmax_scale;
  p.q = c.q;
  p.q_stride_token = c.q_stride_token;
  p.q_stride_head = c.q_stride_head;
  p.main = to_cpp(c.main);
  p.extra = to_cpp(c.extra);
  p.attn_sink = c.attn_sink;
  p.attn_sink_stride = c.attn_sink_stride;
  p.output = c.output;
  p.output_stride_token = c.output_stride_token;
  p.output_stride_head = c.output_stride_head;
  p.lse = c.lse;
  p.lse_stride_token = c.lse_stride_token;
  p.lse_stride_head = c.lse_stride_head;
  p.force_portable = c.force_portable != 0;
  p.head_tile = c.head_tile;
  p.smem_limit = c.smem_limit;
  p.num_splits = c.num_splits;
  return p;
}

// The automatic split count of a call on `sms` processors of the current device, as the decode
// resolves num_splits == 0 (and mla_ext_sparse_mla_decode_num_splits_for reports it).
int auto_splits(const mla_ext::SparseDecodeParams& p, int sms) {
  return mla_ext::decode_auto_splits(
      p, sms, true, mla_ext::decode_wide16_rows(p, mla_ext::current_device_cc_major(), mla_ext::current_device_smem_optin()));
}

}  // namespace

extern "C" {

int mla_ext_merge_attn_states(const mla_ext_merge_params* c, int num_sms, void* stream) {
  if (c == nullptr) return MLA_EXT_STATUS_INVALID_ARGUMENT;
  if (c->dtype < MLA_EXT_DTYPE_FLOAT32 || c->dtype > MLA_EXT_DTYPE_BFLOAT16) return MLA_EXT_STATUS_INVALID_ARGUMENT;
  mla_ext::MergeParams p;
  p.dtype = static_cast<mla_ext::DType>(c->dtype);
  p.num_tokens = c->num_tokens;
  p.num_heads = c->num_heads;
  p.head_size = c->head_size;
  p.output = c->output;
  p.output_stride_token = c->output_stride_token;
  p.output_stride_head = c->output_stride_head;
  p.output_lse = c->output_lse;
  p.output_lse_stride_token = c->output_lse_stride_token;
  p.output_lse_stride_head = c->output_lse_stride_head;
  p.prefix_output = c->prefix_output;
  p.prefix_stride_token = c->prefix_stride_token;
  p.prefix_stride_head = c->prefix_stride_head;
  p.prefix_lse = c->prefix_lse;
  p.prefix_lse_stride_token = c->prefix_lse_stride_token;
  p.prefix_lse_stride_head = c->prefix_lse_stride_head;
  p.suffix_output = c->suffix_output;
  p.suffix_stride_token = c->suffix_stride_token;
  p.suffix_stride_head = c->suffix_stride_head;
  p.suffix_lse = c->suffix_lse;
  p.suffix_lse_stride_token = c->suffix_lse_stride_token;
  p.suffix_lse_stride_head = c->suffix_lse_stride_head;
  if (c->output_kind < MLA_EXT_MERGE_OUTPUT_SAME || c->output_kind > MLA_EXT_MERGE_OUTPUT_FP8_E4M3FNUZ)
    return MLA_EXT_STATUS_INVALID_ARGUMENT;
  p.output_kind = static_cast<mla_ext::MergeOutput>(c->output_kind);
  p.has_prefill_tokens_with_context = c->has_prefill_tokens_with_context != 0;
  p.prefill_tokens_with_context = c->prefill_tokens_with_context;
  p.output_scale = c->output_scale;
  // checked even for an empty problem, so a bad call fails the same way at every size
  if (p.num_tokens < 0 || p.num_heads < 0 || p.head_size < 0) return MLA_EXT_STATUS_INVALID_ARGUMENT;
  if (p.output_kind != mla_ext::MergeOutput::kSameAsInput && p.output_scale == nullptr) return MLA_EXT_STATUS_INVALID_ARGUMENT;
  if (p.has_prefill_tokens_with_context && p.prefill_tokens_with_context < 0) return MLA_EXT_STATUS_INVALID_ARGUMENT;
  if (p.output_scale != nullptr && !aligned4(p.output_scale)) return MLA_EXT_STATUS_INVALID_ARGUMENT;
  // Element alignment (a misaligned access would fault on the device) and outputs that no two
  // (token, head) pairs share (the torch op's overlap check), as the decode's entry point.
  const uintptr_t vb = merge_value_bytes(c->dtype);
  const uintptr_t ob = p.output_kind == mla_ext::MergeOutput::kSameAsInput ? vb : 1u;
  if (!aligned_to(p.output, ob) || !aligned_to(p.prefix_output, vb) || !aligned_to(p.suffix_output, vb) ||
      !aligned4(p.output_lse) || !aligned4(p.prefix_lse) || !aligned4(p.suffix_lse))
    return MLA_EXT_STATUS_INVALID_ARGUMENT;
  if (!outputs_disjoint(p.num_tokens, p.num_heads, p.output_stride_token, p.output_stride_head, p.head_size,
                        p.output_lse, p.output_lse_stride_token, p.output_lse_stride_head))
    return MLA_EXT_STATUS_INVALID_ARGUMENT;
  // the prefix is not read when no token has one (prefill_tokens_with_context == 0)
  const bool prefix_read = !(p.has_prefill_tokens_with_context && p.prefill_tokens_with_context == 0);
  if (p.num_tokens > 0 && p.num_heads > 0 && p.head_size > 0 &&
      (p.output == nullptr || p.suffix_output == nullptr || p.suffix_lse == nullptr ||
       (prefix_read && (p.prefix_output == nullptr || p.prefix_lse == nullptr))))
    return MLA_EXT_STATUS_INVALID_ARGUMENT;
  return int(mla_ext::launch_merge_attn_states(p, resolve_sms(num_sms), static_cast<mla_ext::gpuStream_t>(stream)));
}

int mla_ext_merge_attn_states_n(const mla_ext_merge_n_params* c, int num_sms, void* stream) {
  if (c == nullptr) return MLA_EXT_STATUS_INVALID_ARGUMENT;
  if (c->dtype < MLA_EXT_DTYPE_FLOAT32 || c->dtype > MLA_EXT_DTYPE_BFLOAT16) return MLA_EXT_STATUS_INVALID_ARGUMENT;
  mla_ext::MergeNParams p;
  p.dtype = static_cast<mla_ext::DType>(c->dtype);
  p.num_states = c->num_states;
  p.num_tokens = c->num_tokens;
  p.num_heads = c->num_heads;
  p.head_size = c->head_size;
  p.output = c->output;
  p.output_stride_token = c->output_stride_token;
  p.output_stride_head = c->output_stride_head;
  p.output_lse = c->output_lse;
  p.output_lse_stride_token = c->output_lse_stride_token;
  p.output_lse_stride_head = c->output_lse_stride_head;
  p.values = c->values;
  p.values_stride_state = c->values_stride_state;
  p.values_stride_token = c->values_stride_token;
  p.values_stride_head = c->values_stride_head;
  p.lses = c->lses;
  p.lses_stride_state = c->lses_stride_state;
  p.lses_stride_token = c->lses_stride_token;
  p.lses_stride_head = c->lses_stride_head;
  p.attn_sink = c->attn_sink;
  p.attn_sink_stride = c->attn_sink_stride;
  if (p.num_tokens < 0 || p.num_heads < 0 || p.head_size < 0) return MLA_EXT_STATUS_INVALID_ARGUMENT;
  const uintptr_t vb = merge_value_bytes(c->dtype);
  if (!aligned_to(p.output, vb) || !aligned_to(p.values, vb) || !aligned4(p.output_lse) || !aligned4(p.lses) ||
      !aligned4(p.attn_sink))
    return MLA_EXT_STATUS_INVALID_ARGUMENT;
  if (!outputs_disjoint(p.num_tokens, p.num_heads, p.output_stride_token, p.output_stride_head, p.head_size,
                        p.output_lse, p.output_lse_stride_token, p.output_lse_stride_head))
    return MLA_EXT_STATUS_INVALID_ARGUMENT;
  if (p.num_tokens > 0 && p.num_heads > 0 && p.head_size > 0 &&
      (p.output == nullptr || p.values == nullptr || p.lses == nullptr))
    return MLA_EXT_STATUS_INVALID_ARGUMENT;
  return int(mla_ext::launch_merge_attn_states_n(p, resolve_sms(num_sms), static_cast<mla_ext::gpuStream_t>(stream)));
}

int mla_ext_sparse_mla_decode(const mla_ext_sparse_decode_params* c, void* workspace, size_t workspace_bytes,
                              int num_sms, void* stream) {
  if (c == nullptr) return MLA_EXT_STATUS_INVALID_ARGUMENT;
  if (c->kv_format < MLA_EXT_KV_BF16 || c->kv_format > MLA_EXT_KV_FP8_DS_MLA_V4_FNUZ)
    return MLA_EXT_STATUS_INVALID_ARGUMENT;
  if (c->num_splits < 0) return MLA_EXT_STATUS_INVALID_ARGUMENT;
  // Preconditions the launcher leaves to its callers (the torch op checks them on tensors): a
  // finite scale, 4-byte aligned int32 / fp32 arrays, non-negative strides of q, output and
  // lse, and output / lse rows that no two (token, head) share.
  if (!std::isfinite(c->softmax_scale)) return MLA_EXT_STATUS_INVALID_ARGUMENT;
  if (!aligned4(c->main.indices) || !aligned4(c->main.lengths) || !aligned4(c->extra.indices) ||
      !aligned4(c->extra.lengths) || !aligned4(c->attn_sink) || !aligned4(c->lse))
    return MLA_EXT_STATUS_INVALID_ARGUMENT;
  if (c->q_stride_token < 0 || c->q_stride_head < 0 || c->output_stride_token < 0 || c->output_stride_head < 0 ||
      c->lse_stride_token < 0 || c->lse_stride_head < 0)
    return MLA_EXT_STATUS_INVALID_ARGUMENT;
  if (!outputs_disjoint(c->num_tokens, c->num_heads, c->output_stride_token, c->output_stride_head, 512, c->lse,
                        c->lse_stride_token, c->lse_stride_head))
    return MLA_EXT_STATUS_INVALID_ARGUMENT;
  mla_ext::SparseDecodeParams p = to_cpp(*c);
  // A processor count no GPU has (refused at every num_splits, as documented).
  if (num_sms > kMaxSms) return MLA_EXT_STATUS_LAUNCH_FAILED;
  const int sms = resolve_sms(num_sms);
  // No processor count (num_sms <= 0 and no current device to ask): the automatic split count
  // has nothing to go by, and a launch could not run anyway.
  if (sms <= 0 && c->num_splits == 0) return MLA_EXT_STATUS_LAUNCH_FAILED;
  if (p.num_splits == 0) p.num_splits = auto_splits(p, sms);
  return int(mla_ext::launch_sparse_mla_decode(p, workspace, workspace_bytes, sms,
                                               static_cast<mla_ext::gpuStream_t>(stream), c->num_splits == 0));
}

size_t mla_ext_sparse_mla_decode_workspace_size(long long num_tokens, long long num_heads, int num_splits) {
  if (!workspace_args_ok(num_tokens, num_heads, num_splits)) return MLA_EXT_INVALID_SIZE;
  // 0 = automatic, as everywhere else: enough for the automatic count on the current device
  if (num_splits == 0) return mla_ext_sparse_mla_decode_workspace_size_for(num_tokens, num_heads, 0, 0);
  return mla_ext::decode_workspace_size(num_tokens, num_heads, num_splits);
}

size_t mla_ext_sparse_mla_decode_workspace_size_for(long long num_tokens, long long num_heads, int num_splits,
                                                    int num_sms) {
  const int sms = resolve_sms(num_sms);
  if (!workspace_args_ok(num_tokens, num_heads, num_splits) || sms <= 0) return MLA_EXT_INVALID_SIZE;
  return mla_ext::decode_workspace_size_for(num_tokens, num_heads, num_splits, sms);
}

int mla_ext_sparse_mla_decode_num_splits(long long num_tokens, long long num_heads, long long total_width,
                                         int num_sms) {
  const int sms = resolve_sms(num_sms);
  if (num_tokens < 0 || num_heads < 0 || total_width < 0 || sms <= 0) return 0;
  // balanced_map as the op decides it for a V4 FP8 call with lengths (decode_balanced_shape): with
  // `true` at every width, tile rounding under the floor's cap gave 2 where the op takes 1 (e.g.
  // 16 heads x 200 tokens x 640 entries).
  return mla_ext::decode_num_splits(num_tokens, num_heads, total_width, sms,
                                    mla_ext::decode_balanced_width(num_tokens, total_width));
}

int mla_ext_sparse_mla_decode_num_splits_for(const mla_ext_sparse_decode_params* c, int num_sms) {
  if (c == nullptr || num_sms > kMaxSms) return 0;
  if (!workspace_args_ok(c->num_tokens, c->num_heads, c->num_splits)) return 0;
  // The other fields the count reads, refused as the launcher refuses them (an unknown format too).
  if (!mla_ext::kv_format_d_qk_ok(static_cast<mla_ext::KvFormat>(c->kv_format), c->d_qk)) return 0;
  if (!mla_ext::decode_overrides_ok(c->head_tile, c->smem_limit)) return 0;
  if ((c->main.cache != nullptr && c->main.width < 0) || (c->extra.cache != nullptr && c->extra.width < 0)) return 0;
  if (c->num_splits > 0) return c->num_splits;
  const int sms = resolve_sms(num_sms);
  if (sms <= 0) return 0;
  return auto_splits(to_cpp(*c), sms);
}

size_t mla_ext_sparse_decode_params_size(void) { return sizeof(mla_ext_sparse_decode_params); }

size_t mla_ext_merge_params_size(void) { return sizeof(mla_ext_merge_params); }

size_t mla_ext_merge_n_params_size(void) { return sizeof(mla_ext_merge_n_params); }

const char* mla_ext_status_string(int status) {
  return mla_ext::status_string(static_cast<mla_ext::Status>(status));
}

int mla_ext_capi_version(void) { return MLA_EXT_CAPI_VERSION; }

const char* mla_ext_gpu_runtime(void) {
#if defined(MLA_EXT_HIP)
  return "hip";
#else
  return "cuda";
#endif
}

}  // extern "C"
