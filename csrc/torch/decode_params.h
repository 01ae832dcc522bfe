// Argument validation of sparse_mla_decode (shared by the CPU and CUDA bindings).
//
// make_decode_params checks EVERY argument before anything is launched or
// written and fills mla_ext::SparseDecodeParams; every violation throws a
// "sparse_mla_decode: expected <arg> ..., got ..." message (RuntimeError in
// Python). The split count is resolved here: 0 = automatic
// (decode_auto_splits: decode_num_splits(T, H, W_main + W_extra, processor count), the
// one-split rule for GPU calls only), else 1..256.
#pragma once

#include <cmath>

#include <atomic>
#include <functional>
#include <optional>
#include <string>

#include "common.h"
#include "mla_ext/sparse_mla_decode.h"

namespace mla_ext_torch {

// Process-global switch: the CUDA path uses the portable (no tensor-core)
// kernel while set (torch.ops.mla_ext._set_force_portable; used by tests).
inline std::atomic<bool>& force_portable_flag() {
  static std::atomic<bool> flag{false};
  return flag;
}

// Process-global switch: on Hopper the 64-head blocks use mma.sync instead of
// warpgroup MMAs while set (torch.ops.mla_ext._set_force_mma_sync; used by tests
// and A/B runs).
inline std::atomic<bool>& force_mma_sync_flag() {
  static std::atomic<bool> flag{false};
  return flag;
}

// Process-global GPU shared-memory limit per block (SparseDecodeParams::smem_limit):
// 0 = the device's; a smaller value makes the launcher fall back as on a GPU with
// less (torch.ops.mla_ext._set_smem_limit; used by tests).
inline std::atomic<int64_t>& smem_limit_setting() {
  static std::atomic<int64_t> bytes{0};
  return bytes;
}

// Process-global GPU head tile (SparseDecodeParams::head_tile): 0 = automatic,
// 1..64 forces one (torch.ops.mla_ext._set_head_tile; used by tests and sweeps).
inline std::atomic<int>& head_tile_setting() {
  static std::atomic<int> tile{0};
  return tile;
}

// Process-global two-token mode of the V4 64-head kernel on Hopper
// (SparseDecodeParams::two_token): 0 = automatic, 1 = never, 2 = wherever allowed
// (torch.ops.mla_ext._set_two_token; used by tests and A/B runs).
inline std::atomic<int>& two_token_setting() {
  static std::atomic<int> mode{0};
  return mode;
}

namespace decode_detail {

constexpr const char* kOp = "sparse_mla_decode";

// Error-path text for a cache of the other FP8 flavour's type: the format that
// takes it (" (float8_e4m3fnuz bytes are kv_format "fp8_ds_mla_v4_fnuz")"), else "".
inline std::string fp8_flavour_hint(ScalarType dt, mla_ext::KvFormat fmt, const std::string& fmt_name) {
  const bool fnuz = mla_ext::kv_is_fnuz(fmt);
  if (dt != (fnuz ? ScalarType::Float8_e4m3fn : ScalarType::Float8_e4m3fnuz)) return std::string();
  const std::string other = fnuz ? fmt_name.substr(0, fmt_name.size() - 5) : fmt_name + "_fnuz";
  return std::string(" (") + dtype_name(dt) + " bytes are kv_format \"" + other + "\")";
}

// The dtypes an FP8 cache tensor may have: raw bytes, or the torch float8 type
// of the format's own flavour (a float8_e4m3fn tensor declared as a fnuz cache,
// or the reverse, is a mix-up the caller should hear about).
inline bool is_byte_dtype(ScalarType t, mla_ext::KvFormat fmt) {
  if (t == ScalarType::Byte || t == ScalarType::Char) return true;
  return t == (mla_ext::kv_is_fnuz(fmt) ? ScalarType::Float8_e4m3fnuz : ScalarType::Float8_e4m3fn);
}

// A never-dereferenced, 16-byte aligned stand-in for the data pointer of an
// empty cache (0 pages: every slot is invalid), so the main set is never "absent".
inline const uint8_t* empty_cache_ptr() {
  alignas(16) static const uint8_t dummy[16] = {};
  return dummy;
}

// Validates one paged cache and fills the cache geometry of `set`.
inline void fill_cache(const Tensor& q, const Tensor& c, const char* name, mla_ext::KvFormat fmt,
                       const std::string& fmt_name, int d_qk, mla_ext::KvSet& set) {
  check_same_device(kOp, q, "q", c, name);
  MLA_CHECK(c.dim() == 3 || (c.dim() == 4 && c.size(2) == 1), kOp, "expected ", name,
            " to be [num_pages, page_size, row] or [num_pages, page_size, 1, row], got shape ",
            shape_str(c));
  const int64_t row_dim = c.dim() - 1;
  const int64_t row = c.size(row_dim);
  const ScalarType dt = c.scalar_type();
  const mla_ext::KvFormat layout = mla_ext::kv_layout(fmt);
  int64_t want_row = 0;
  if (fmt == mla_ext::KvFormat::kBF16) {
    MLA_CHECK(dt == ScalarType::BFloat16, kOp, "expected ", name,
              " to be bfloat16 for kv_format \"bf16\", got ", dtype_name(dt));
    want_row = d_qk;
    MLA_CHECK(row == want_row, kOp, "expected ", name, " rows of d_qk = ", d_qk,
              " bf16 elements (q's last dim) for kv_format \"bf16\", got shape ", shape_str(c));
  } else {
    MLA_CHECK(is_byte_dtype(dt, fmt), kOp, "expected ", name, " to be uint8 (or int8 / ",
              mla_ext::kv_is_fnuz(fmt) ? "float8_e4m3fnuz" : "float8_e4m3fn",
              " viewing the same bytes) for kv_format \"", fmt_name, "\", got ", dtype_name(dt),
              fp8_flavour_hint(dt, fmt, fmt_name));
    want_row = layout == mla_ext::KvFormat::kFP8DsMla ? mla_ext::kFP8DsMlaRowBytes : mla_ext::kFP8DsMlaV4RowBytes;
    MLA_CHECK(row == want_row, kOp, "expected ", name, " rows of ", want_row, " bytes for kv_format \"",
              fmt_name, "\", got shape ", shape_str(c));
  }
  MLA_CHECK(c.stride(row_dim) == 1, kOp, "expected ", name,
            " to be contiguous in its last (row) dim, got stride ", c.stride(row_dim));
  const int64_t num_pages = c.size(0), page_size = c.size(1);
  MLA_CHECK(page_size >= 1, kOp, "expected ", name, " to have page_size >= 1, got shape ", shape_str(c));
  const int64_t esize = int64_t(c.element_size());
  if (layout == mla_ext::KvFormat::kFP8DsMlaV4) {
    // A page is one block of page_size * 584 bytes (data rows at a 576-byte
    // pitch, then the scale rows): the kernels never read by stride(1), so a
    // view whose rows are not packed would be read past its own bytes.
    MLA_CHECK(page_size <= 1 || c.stride(1) == mla_ext::kFP8DsMlaV4RowBytes, kOp, "expected ", name,
              " token stride (stride(1)) == 584 for kv_format \"", fmt_name,
              "\" (a page is one block of page_size * 584 bytes: data rows, then scale rows), got ",
              c.stride(1));
    const int64_t need = page_size * mla_ext::kFP8DsMlaV4RowBytes;
    MLA_CHECK(num_pages <= 1 || c.stride(0) >= need, kOp, "expected ", name,
              " page stride (stride(0), bytes) >= page_size*584 = ", need,
              " for kv_format \"", fmt_name, "\", got ", c.stride(0));
    // One page: its stride is never used; keep a 16-byte multiple for the GPU checks.
    set.page_stride_bytes = num_pages > 1 ? c.stride(0) : ((need + 575) / 576) * 576;
    set.token_stride_bytes = mla_ext::kFP8DsMlaV4RowBytes;
  } else {
    MLA_CHECK(page_size <= 1 || c.stride(1) >= row, kOp, "expected ", name,
              " token stride (stride(1)) >= the row width ", row, " (rows must not overlap), got ",
              c.stride(1));
    set.page_stride_bytes = num_pages > 1 ? c.stride(0) * esize : page_size * c.stride(1) * esize;
    set.token_stride_bytes = page_size > 1 ? c.stride(1) * esize : row * esize;
  }
  set.page_size = page_size;
  set.num_slots = num_pages * page_size;
  const void* ptr = c.data_ptr();
  set.cache = (ptr != nullptr && set.num_slots > 0) ? static_cast<const uint8_t*>(ptr) : empty_cache_ptr();
  if (set.num_slots == 0) set.cache = empty_cache_ptr();
}

inline void fill_indices(const Tensor& q, const Tensor& idx, const char* name, int64_t T, mla_ext::KvSet& set) {
  check_same_device(kOp, q, "q", idx, name);
  MLA_CHECK(idx.scalar_type() == ScalarType::Int, kOp, "expected ", name, " to be int32, got ",
            dtype_name(idx.scalar_type()));
  MLA_CHECK(idx.dim() == 2 && idx.size(0) == T, kOp, "expected ", name, " of shape [num_tokens, width] with ",
            "num_tokens = q.size(0) = ", T, ", got ", name, " ", shape_str(idx), " (q ", shape_str(q), ")");
  MLA_CHECK(idx.size(1) <= 1 || idx.stride(1) == 1, kOp, "expected ", name,
            " to be contiguous along its width (stride(1) == 1), got stride ", idx.stride(1));
  set.width = idx.size(1);
  set.indices = set.width > 0 && T > 0 ? static_cast<const int32_t*>(idx.data_ptr()) : nullptr;
  set.indices_stride_token = idx.stride(0);
  if (set.indices == nullptr) set.width = 0;
}

inline void fill_lengths(const Tensor& q, const std::optional<Tensor>& len, const char* name, int64_t T,
                         mla_ext::KvSet& set) {
  if (!len.has_value()) return;
  const Tensor& l = *len;
  check_same_device(kOp, q, "q", l, name);
  MLA_CHECK(l.scalar_type() == ScalarType::Int, kOp, "expected ", name, " to be int32, got ",
            dtype_name(l.scalar_type()));
  MLA_CHECK(l.dim() == 1 && l.size(0) == T, kOp, "expected ", name, " of shape [num_tokens] = [", T,
            "], got ", shape_str(l));
  set.lengths = T > 0 ? static_cast<const int32_t*>(l.data_ptr()) : nullptr;
  set.lengths_stride = l.stride(0);
}

}  // namespace decode_detail

inline mla_ext::KvFormat parse_kv_format(const std::string& s) {
  if (s == "bf16") return mla_ext::KvFormat::kBF16;
  if (s == "fp8_ds_mla") return mla_ext::KvFormat::kFP8DsMla;
  if (s == "fp8_ds_mla_v4") return mla_ext::KvFormat::kFP8DsMlaV4;
  if (s == "fp8_ds_mla_fnuz") return mla_ext::KvFormat::kFP8DsMlaFnuz;
  if (s == "fp8_ds_mla_v4_fnuz") return mla_ext::KvFormat::kFP8DsMlaV4Fnuz;
  MLA_CHECK(false, "sparse_mla_decode",
            "expected kv_format to be one of \"bf16\", \"fp8_ds_mla\" (DeepSeek V3.2), "
            "\"fp8_ds_mla_v4\" (DeepSeek V4), \"fp8_ds_mla_fnuz\", \"fp8_ds_mla_v4_fnuz\" "
            "(the same layouts with e4m3fnuz bytes, gfx942 engines), got \"", s, "\"");
  return mla_ext::KvFormat::kBF16;
}

// Validates every argument and returns the params with num_splits resolved.
// `processor_count` is called (after the device checks) only for num_splits == 0.
inline mla_ext::SparseDecodeParams make_decode_params(
    const Tensor& q, const Tensor& kv_cache, const Tensor& indices, const std::string& kv_format,
    double softmax_scale, const Tensor& output, const Tensor& workspace,
    const std::optional<Tensor>& lengths, const std::optional<Tensor>& extra_kv_cache,
    const std::optional<Tensor>& extra_indices, const std::optional<Tensor>& extra_lengths,
    const std::optional<Tensor>& attn_sink, const std::optional<Tensor>& lse, int64_t num_splits,
    const std::function<int()>& processor_count,
    const std::function<bool(const mla_ext::SparseDecodeParams&)>& wide16 = nullptr) {
  using namespace decode_detail;
  mla_ext::SparseDecodeParams p;
  // Every tensor argument defined first (None for a required one reaches the op as an undefined tensor).
  check_all_defined(kOp, "q", q, "kv_cache", kv_cache, "indices", indices, "output", output, "workspace", workspace,
                    "lengths", lengths, "extra_kv_cache", extra_kv_cache, "extra_indices", extra_indices,
                    "extra_lengths", extra_lengths, "attn_sink", attn_sink, "lse", lse);

  // q
  MLA_CHECK(q.scalar_type() == ScalarType::BFloat16, kOp, "expected q to be bfloat16, got ",
            dtype_name(q.scalar_type()));
  MLA_CHECK(q.dim() == 3, kOp, "expected q of shape [num_tokens, num_heads, d_qk], got ", shape_str(q));
  const int64_t T = q.size(0), H = q.size(1), d_qk = q.size(2);
  const mla_ext::KvFormat fmt = parse_kv_format(kv_format);
  MLA_CHECK(d_qk == 576 || d_qk == 512, kOp,
            "expected q's last dim d_qk to be 576 (DeepSeek V3.2) or 512 (DeepSeek V4), got shape ",
            shape_str(q));
  MLA_CHECK(mla_ext::kv_layout(fmt) != mla_ext::KvFormat::kFP8DsMla || d_qk == 576, kOp,
            "expected q's d_qk to be 576 for kv_format \"", kv_format, "\", got shape ", shape_str(q));
  MLA_CHECK(mla_ext::kv_layout(fmt) != mla_ext::KvFormat::kFP8DsMlaV4 || d_qk == 512, kOp,
            "expected q's d_qk to be 512 for kv_format \"", kv_format, "\", got shape ", shape_str(q));
  MLA_CHECK(q.stride(2) == 1, kOp, "expected q to be contiguous in its last (d_qk) dim, got stride ",
            q.stride(2));

  p.kv_format = fmt;
  p.d_qk = int(d_qk);
  p.num_tokens = T;
  p.num_heads = H;

  // main set
  fill_cache(q, kv_cache, "kv_cache", fmt, kv_format, int(d_qk), p.main);
  fill_indices(q, indices, "indices", T, p.main);
  fill_lengths(q, lengths, "lengths", T, p.main);

  // extra set: complete or absent
  MLA_CHECK(extra_kv_cache.has_value() == extra_indices.has_value(), kOp, "expected extra_kv_cache and ",
            "extra_indices to be given together, got ",
            extra_kv_cache.has_value() ? "extra_kv_cache without extra_indices"
                                       : "extra_indices without extra_kv_cache");
  MLA_CHECK(!extra_lengths.has_value() || extra_indices.has_value(), kOp,
            "expected extra_lengths only together with extra_indices and extra_kv_cache, got "
            "extra_lengths without extra_indices");
  if (extra_kv_cache.has_value()) {
    fill_cache(q, *extra_kv_cache, "extra_kv_cache", fmt, kv_format, int(d_qk), p.extra);
    fill_indices(q, *extra_indices, "extra_indices", T, p.extra);
    fill_lengths(q, extra_lengths, "extra_lengths", T, p.extra);
  }

  // sink
  if (attn_sink.has_value()) {
    const Tensor& s = *attn_sink;
    check_same_device(kOp, q, "q", s, "attn_sink");
    MLA_CHECK(s.scalar_type() == ScalarType::Float, kOp, "expected attn_sink to be float32, got ",
              dtype_name(s.scalar_type()));
    MLA_CHECK(s.dim() == 1 && s.size(0) == H, kOp, "expected attn_sink of shape [num_heads] = [", H,
              "] (num_heads = q.size(1)), got ", shape_str(s), " (q ", shape_str(q), ")");
    p.attn_sink = H > 0 ? static_cast<const float*>(s.data_ptr()) : nullptr;
    p.attn_sink_stride = s.stride(0);
  }

  // output
  check_same_device(kOp, q, "q", output, "output");
  MLA_CHECK(output.scalar_type() == ScalarType::BFloat16, kOp, "expected output to be bfloat16, got ",
            dtype_name(output.scalar_type()));
  MLA_CHECK(output.dim() == 3 && output.size(0) == T && output.size(1) == H && output.size(2) == mla_ext::kDV,
            kOp, "expected output of shape [num_tokens, num_heads, 512] = [", T, ", ", H,
            ", 512] (num_tokens, num_heads = q.size(0), q.size(1)), got ", shape_str(output), " (q ", shape_str(q),
            ")");
  MLA_CHECK(output.stride(2) == 1, kOp, "expected output to be contiguous in its last dim, got stride ",
            output.stride(2));
  check_no_repeats(kOp, output, "output");

  // lse
  if (lse.has_value()) {
    const Tensor& l = *lse;
    check_same_device(kOp, q, "q", l, "lse");
    MLA_CHECK(l.scalar_type() == ScalarType::Float, kOp, "expected lse to be float32, got ",
              dtype_name(l.scalar_type()));
    MLA_CHECK(l.dim() == 2 && l.size(0) == T && l.size(1) == H, kOp,
              "expected lse of shape [num_tokens, num_heads] = [", T, ", ", H,
              "] (any strides; num_tokens, num_heads = q.size(0), q.size(1)), got ", shape_str(l), " (q ",
              shape_str(q), ")");
    check_no_repeats(kOp, l, "lse");
  }

  // workspace (tensor properties and alignment; size below, once the split count is known)
  check_same_device(kOp, q, "q", workspace, "workspace");
  MLA_CHECK(workspace.scalar_type() == ScalarType::Byte && workspace.dim() == 1, kOp,
            "expected workspace to be a 1-D uint8 tensor, got ", dtype_name(workspace.scalar_type()),
            " of shape ", shape_str(workspace));
  MLA_CHECK(workspace.numel() <= 1 || workspace.stride(0) == 1, kOp,
            "expected workspace to be contiguous, got stride ", workspace.stride(0));
  // Aligned whenever it has bytes, whatever the split count: one that only a GPU's larger
  // count would use must fail on the CPU too.
  MLA_CHECK(workspace.numel() == 0 || (reinterpret_cast<uintptr_t>(workspace.data_ptr()) & 15u) == 0, kOp,
            "expected workspace's data pointer to be 16-byte aligned, got address offset ",
            int(reinterpret_cast<uintptr_t>(workspace.data_ptr()) & 15u));

  // scalars
  // Finite as the float32 the kernels use (1e39 is a finite double but +inf as a float).
  MLA_CHECK(std::isfinite(softmax_scale) && std::isfinite(float(softmax_scale)), kOp,
            "expected softmax_scale to be finite as a float32 (|softmax_scale| <= 3.4e38), got ", softmax_scale);
  MLA_CHECK(num_splits >= 0 && num_splits <= mla_ext::kMaxSplits, kOp,
            "expected num_splits to be 0 (automatic) or 1..", mla_ext::kMaxSplits, ", got ", num_splits);

  // The test switches first: whether the wide V3.2 16-head tile can run depends on them.
  p.force_portable = force_portable_flag().load();
  p.force_mma_sync = force_mma_sync_flag().load();
  p.smem_limit = smem_limit_setting().load();
  int S = int(num_splits);
  if (S == 0) S = mla_ext::decode_auto_splits(p, processor_count(), !q.is_cpu(), !q.is_cpu() && wide16 && wide16(p));
  if (S < 1) S = 1;
  const size_t need = mla_ext::decode_workspace_size(T, H, S);
  MLA_CHECK(size_t(workspace.numel()) >= need, kOp, "expected workspace of at least ", need,
            " bytes for num_tokens=", T, ", num_heads=", H, ", num_splits=", S,
            " (size it with mla_ext.sparse_mla_decode_workspace_size(num_tokens, num_heads, num_splits=",
            num_splits, ", device=...)), got ", workspace.numel(), " bytes");

  // The buffers the op writes (output, lse, workspace) share memory with no other argument:
  // the split kernels read q, the caches, indices, lengths and the sink while other blocks
  // write the output and the workspace, and the reduce reads the workspace while it writes
  // the output and lse.
  {
    struct Named {
      Span v;
      const char* name;
    };
    Named written[3];
    int nw = 0;
    written[nw++] = {span_of(output), "output"};
    written[nw++] = {span_of(workspace), "workspace"};
    if (lse.has_value()) written[nw++] = {span_of(*lse), "lse"};
    Named read[8];
    int nr = 0;
    read[nr++] = {span_of(q), "q"};
    read[nr++] = {span_of(kv_cache), "kv_cache"};
    read[nr++] = {span_of(indices), "indices"};
    if (lengths.has_value()) read[nr++] = {span_of(*lengths), "lengths"};
    if (extra_kv_cache.has_value()) read[nr++] = {span_of(*extra_kv_cache), "extra_kv_cache"};
    if (extra_indices.has_value()) read[nr++] = {span_of(*extra_indices), "extra_indices"};
    if (extra_lengths.has_value()) read[nr++] = {span_of(*extra_lengths), "extra_lengths"};
    if (attn_sink.has_value()) read[nr++] = {span_of(*attn_sink), "attn_sink"};
    for (int i = 0; i < nw; ++i) {
      for (int j = i + 1; j < nw; ++j) check_disjoint(kOp, written[i].v, written[i].name, written[j].v, written[j].name);
      for (int j = 0; j < nr; ++j) check_disjoint(kOp, written[i].v, written[i].name, read[j].v, read[j].name);
    }
  }

  // fill
  p.softmax_scale = float(softmax_scale);
  p.q = static_cast<const uint16_t*>(q.data_ptr());
  p.q_stride_token = q.stride(0);
  p.q_stride_head = q.stride(1);
  p.output = static_cast<uint16_t*>(output.data_ptr());
  p.output_stride_token = output.stride(0);
  p.output_stride_head = output.stride(1);
  if (lse.has_value()) {
    p.lse = static_cast<float*>(lse->data_ptr());
    p.lse_stride_token = lse->stride(0);
    p.lse_stride_head = lse->stride(1);
  }
  p.num_splits = S;
  p.head_tile = head_tile_setting().load();
  p.two_token = two_token_setting().load();
  return p;
}

}  // namespace mla_ext_torch
