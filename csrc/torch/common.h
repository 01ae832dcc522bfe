// Shared helpers for the torch binding layer (LibTorch stable ABI only).
#pragma once

#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>
#include <torch/headeronly/util/Exception.h>

#include <cstdint>
#include <initializer_list>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <cstdio>
#include <type_traits>
#include <algorithm>
#include <string>
#include <vector>

#include "mla_ext/merge_attn_states.h"

namespace mla_ext_torch {

using torch::stable::Tensor;
using torch::headeronly::ScalarType;

inline const char* dtype_name(ScalarType t) {
  switch (t) {
    case ScalarType::Float: return "float32";
    case ScalarType::Half: return "float16";
    case ScalarType::BFloat16: return "bfloat16";
    case ScalarType::Double: return "float64";
    case ScalarType::Int: return "int32";
    case ScalarType::Long: return "int64";
    case ScalarType::Byte: return "uint8";
    case ScalarType::Char: return "int8";
    case ScalarType::Bool: return "bool";
    case ScalarType::Float8_e4m3fn: return "float8_e4m3fn";
    case ScalarType::Float8_e4m3fnuz: return "float8_e4m3fnuz";
    case ScalarType::Float8_e5m2: return "float8_e5m2";
    case ScalarType::Float8_e5m2fnuz: return "float8_e5m2fnuz";
    case ScalarType::Short: return "int16";
    case ScalarType::ComplexFloat: return "complex64";
    case ScalarType::ComplexDouble: return "complex128";
    case ScalarType::ComplexHalf: return "complex32";
    case ScalarType::UInt16: return "uint16";
    case ScalarType::UInt32: return "uint32";
    case ScalarType::UInt64: return "uint64";
    case ScalarType::Float8_e8m0fnu: return "float8_e8m0fnu";
    default: return "an unsupported dtype";
  }
}

// Message text. No iostreams: inserting an integer into a std::ostringstream
// from this library crashed the process under torch 2.11 (gcc 13 build) on
// the GPU machine, while plain strings went through; std::to_string and
// snprintf are used instead.
inline void append_text(std::string& s, const char* x) { s += x; }
inline void append_text(std::string& s, const std::string& x) { s += x; }
inline void append_text(std::string& s, char x) { s += x; }
inline void append_text(std::string& s, bool x) { s += x ? "true" : "false"; }
inline void append_text(std::string& s, double x) {
  char buf[32];
  snprintf(buf, sizeof(buf), "%g", x);
  s += buf;
}
template <typename T, typename std::enable_if<std::is_integral<T>::value, int>::type = 0>
inline void append_text(std::string& s, T x) {
  s += std::to_string(x);
}

template <typename... Args>
inline std::string cat(const Args&... args) {
  std::string s;
  (append_text(s, args), ...);
  return s;
}

inline std::string shape_str(const Tensor& t) {
  std::string s = "[";
  for (int64_t i = 0; i < t.dim(); ++i) s += cat(i ? ", " : "", t.size(i));
  return s + "]";
}

inline std::string strides_str(const Tensor& t) {
  std::string s = "[";
  for (int64_t i = 0; i < t.dim(); ++i) s += cat(i ? ", " : "", t.stride(i));
  return s + "]";
}

inline std::string device_str(const Tensor& t) {
  if (t.is_cpu()) return "cpu";
  return cat(t.is_cuda() ? "cuda:" : "device:", int(t.get_device_index()));
}

// Error helper: every message starts with the op name and names the argument.
// Thrown as std::runtime_error; torch surfaces it as a Python RuntimeError.
template <typename... Args>
[[noreturn]] inline void fail(const Args&... args) {
  throw std::runtime_error(cat(args...));
}
#define MLA_CHECK(cond, op, ...)                     \
  do {                                               \
    if (!(cond)) ::mla_ext_torch::fail(op, ": ", __VA_ARGS__); \
  } while (0)

// torch hands None for a (non-optional) Tensor argument to the op as an
// undefined tensor, and any query on one is undefined behaviour in the stable
// shim (torch 2.11 on the GPU crashed in the first one); checked before
// anything else, naming the argument.
inline void check_defined(const char* op, const Tensor& t, const char* name) {
  MLA_CHECK(t.defined(), op, "expected ", name, " to be a tensor, got None (an undefined tensor)");
}
inline void check_defined(const char* op, const std::optional<Tensor>& t, const char* name) {
  MLA_CHECK(!t.has_value() || t->defined(), op, "expected ", name,
            " to be a tensor or None, got an undefined tensor inside a value");
}
// check_defined over (name, tensor) pairs: check_all_defined(op, "a", a, "b", b, ...).
inline void check_all_defined(const char*) {}
template <typename T, typename... Rest>
inline void check_all_defined(const char* op, const char* name, const T& t, const Rest&... rest) {
  check_defined(op, t, name);
  check_all_defined(op, rest...);
}

// Rows the exact overlap tests below enumerate at most (host time only on their path).
constexpr int64_t kMaxOverlapRows = int64_t(1) << 16;

// The merges return at once when there is nothing to merge; with head_size 0 but tokens and
// heads, an output_lse would be left unwritten, so such a call is refused instead.
inline void check_lse_needs_values(const char* op, int64_t T, int64_t H, int64_t D) {
  MLA_CHECK(D > 0 || T == 0 || H == 0, op, "got head_size 0 with ", T, " tokens and ", H,
            " heads: output_lse would not be written; pass output_lse=None or head_size >= 1");
}

// Bytes per element of the dtypes the ops accept (0: not one of them; the overlap test
// below then treats every byte of the range as used).
inline int64_t element_bytes(ScalarType t) {
  switch (t) {
    case ScalarType::Double: case ScalarType::Long: return 8;
    case ScalarType::Float: case ScalarType::Int: return 4;
    case ScalarType::Half: case ScalarType::BFloat16: case ScalarType::Short: return 2;
    case ScalarType::Byte: case ScalarType::Char: case ScalarType::Bool:
    case ScalarType::Float8_e4m3fn: case ScalarType::Float8_e4m3fnuz: return 1;
    default: return 0;
  }
}

// A strided byte span for the overlap test below: first element's address, element size and
// up to 4 (size, stride in elements) dims. Built from values the validation already holds, so
// the test costs no further tensor queries (the merge's host time is a goal).
struct Span {
  uintptr_t ptr;
  int64_t esize;  // bytes per element; 0: unknown, every byte of the range counts as used
  int dims;
  int64_t size[4];
  int64_t stride[4];
};

inline Span span_of(const void* ptr, int64_t esize, std::initializer_list<int64_t> sizes,
                    std::initializer_list<int64_t> strides) {
  Span v{reinterpret_cast<uintptr_t>(ptr), esize, int(sizes.size()), {0, 0, 0, 0}, {0, 0, 0, 0}};
  int i = 0;
  for (int64_t x : sizes) v.size[i++] = x;
  i = 0;
  for (int64_t x : strides) v.stride[i++] = x;
  return v;
}

// A tensor's span (at most 4 dims; more are folded into an unknown-element span over its range).
inline Span span_of(const Tensor& t) {
  Span v{reinterpret_cast<uintptr_t>(t.data_ptr()), element_bytes(t.scalar_type()), 0, {0, 0, 0, 0}, {0, 0, 0, 0}};
  const int64_t nd = t.dim();
  if (t.numel() == 0) {
    v.dims = 1;  // size 0: empty
    return v;
  }
  if (nd <= 4 && v.esize > 0) {
    v.dims = int(nd);
    for (int64_t d = 0; d < nd; ++d) {
      v.size[d] = t.size(d);
      v.stride[d] = t.stride(d);
    }
    return v;
  }
  // More than 4 dims, or a dtype element_bytes does not know (taken as 8 bytes, the widest):
  // the whole byte range as one row.
  int64_t lo = 0, hi = 0;
  for (int64_t d = 0; d < nd; ++d) {
    const int64_t span = (t.size(d) - 1) * t.stride(d);
    if (span < 0) lo += span; else hi += span;
  }
  const int64_t es = v.esize > 0 ? v.esize : 8;
  v.ptr = uintptr_t(int64_t(v.ptr) + lo * es);
  v.esize = 0;
  v.dims = 1;
  v.size[0] = (hi - lo + 1) * es;  // bytes
  v.stride[0] = 1;
  return v;
}

// Sorted start addresses (bytes) of a span's rows (as_rows: its last dim is the row) or
// elements: every combination of the other dims' offsets. False (nothing filled) when there
// are more than kMaxOverlapRows of them.
inline bool span_row_starts(const Span& t, bool as_rows, std::vector<int64_t>& out) {
  const int64_t es = t.esize > 0 ? t.esize : 1;
  const int nd = as_rows ? t.dims - 1 : t.dims;
  int64_t n = 1;
  for (int d = 0; d < nd; ++d) {
    n *= t.size[d];
    if (n > kMaxOverlapRows) return false;
  }
  out.assign(size_t(n), int64_t(t.ptr));
  int64_t filled = 1;
  for (int d = 0; d < nd; ++d) {
    for (int64_t k = 1; k < t.size[d]; ++k)
      for (int64_t r = 0; r < filled; ++r) out[size_t(k * filled + r)] = out[size_t(r)] + k * t.stride[d] * es;
    filled *= t.size[d];
  }
  std::sort(out.begin(), out.end());
  return true;
}

// An output must hold each element once: written by many threads at once, elements that share
// memory would get one of their writes each, in no fixed order. Refused: a dim of size > 1 with
// stride 0 (an expand()ed view, as torch's in-place ops refuse) and every layout whose elements
// share memory (e.g. heads 256 elements apart with head_size 512). First a test that proves
// every ordinary layout (contiguous, sliced, padded, transposed) disjoint at no cost: with the
// dims of size > 1 in order of stride, each stride exceeds the span the smaller-stride dims
// cover (sum of (size - 1) * stride). Layouts it cannot prove disjoint (interleavings such as
// sizes [3, 3, 2], strides [60, 40, 1]) are decided exactly by enumeration: the rows of the
// stride-1 dim (or single elements) sorted by offset, each ending before the next starts, up to
// kMaxOverlapRows rows; larger interleavings are refused, naming their strides.
inline void check_no_repeats(const char* op, const Tensor& t, const char* name) {
  constexpr int kMaxDims = 4;  // a Span's (the ops' outputs have at most 3 dims)
  const int64_t nd = t.dim();
  int64_t size[kMaxDims], stride[kMaxDims];
  int n = 0;
  for (int64_t d = 0; d < nd; ++d) {
    if (t.size(d) <= 1) continue;
    MLA_CHECK(t.stride(d) != 0, op, "expected ", name, " to hold each element once, got stride 0 in dim ", d,
              " of size ", t.size(d), " (an expand()ed view); pass a tensor with its own storage");
    if (n == kMaxDims) return;
    int i = n++;  // insertion by stride
    while (i > 0 && stride[i - 1] > t.stride(d)) {
      size[i] = size[i - 1], stride[i] = stride[i - 1];
      --i;
    }
    size[i] = t.size(d), stride[i] = t.stride(d);
  }
  int64_t span = 0;  // elements the smaller-stride dims cover, less one
  bool proven = true;
  for (int i = 0; i < n && proven; ++i) {
    proven = stride[i] > span;
    span += (size[i] - 1) * stride[i];
  }
  if (proven) return;
  // Exact test: the rows of the stride-1 dim (length len; single elements without such a dim) as
  // element offsets (a Span at address 0 of 1-byte elements, that dim last), sorted by start.
  const bool as_rows = stride[0] == 1;
  const int64_t len = as_rows ? size[0] : 1;
  Span v{0, 1, n, {0, 0, 0, 0}, {0, 0, 0, 0}};
  for (int i = 0; i < n; ++i) v.size[i] = size[n - 1 - i], v.stride[i] = stride[n - 1 - i];
  std::vector<int64_t> start;
  const bool decided = span_row_starts(v, as_rows, start);
  bool disjoint = decided;
  for (size_t r = 1; r < start.size() && disjoint; ++r) disjoint = start[r] - start[r - 1] >= len;
  MLA_CHECK(disjoint, op, "expected ", name, " to hold each element once, got sizes ", shape_str(t), " with strides ",
            strides_str(t), (decided ? ", whose elements share memory" :
                             ", an interleaving of more than 65536 rows this check does not decide"),
            "; pass a tensor whose elements do not overlap");
}

// Whether two spans may share a byte of memory (O(dims)). A span is taken as rows of its last
// dim when that dim has stride 1 (a row of size elements is one contiguous extent), else as
// single elements. False when the address ranges are apart, or when the gap between the first
// rows, modulo the gcd g of the byte strides of every other dim that moves, leaves no row of
// one inside a row of the other (so e.g. the fields of one interleaved [T, H, 2, D] buffer
// pass as disjoint). What that test cannot clear (e.g. the fields of a [T, F, H, D] buffer,
// whose gap is a multiple of the gcd) is decided exactly by enumeration: both spans' rows
// sorted by address, no row of one meeting a row of the other, up to kMaxOverlapRows rows each
// (host time only on this path), after peeling a leading dim both share (below: the fields of
// one buffer at any token count); larger ambiguous pairs count as sharing.
inline bool may_share_bytes(const Span& a, const Span& b) {
  // Rows: the last dim when it has stride 1 (or the span's element size is unknown).
  auto rows = [](const Span& t) {
    return t.esize == 0 || (t.dims > 0 && t.size[t.dims - 1] > 1 && t.stride[t.dims - 1] == 1);
  };
  // lo, hi: the byte range; ext: the bytes of one row (or element) from each start address.
  auto range = [&rows](const Span& t, int64_t* lo, int64_t* hi, int64_t* ext) {
    const int64_t es = t.esize > 0 ? t.esize : 1;
    *lo = *hi = int64_t(t.ptr);
    for (int d = 0; d < t.dims; ++d)
      if (t.size[d] == 0) return false;
    const bool r = rows(t);
    *ext = r && t.dims > 0 ? t.size[t.dims - 1] * es : es;
    for (int d = 0; d < (r ? t.dims - 1 : t.dims); ++d) {
      const int64_t span = (t.size[d] - 1) * t.stride[d] * es;
      if (span < 0) *lo += span; else *hi += span;
    }
    *hi += *ext;
    return true;
  };
  int64_t alo, ahi, xa, blo, bhi, xb;
  if (!range(a, &alo, &ahi, &xa) || !range(b, &blo, &bhi, &xb)) return false;  // empty
  if (ahi <= blo || bhi <= alo) return false;  // the common case: apart
  int64_t g = 0;
  for (const Span* t : {&a, &b}) {
    const int64_t es = t->esize > 0 ? t->esize : 1;
    for (int d = 0; d < (rows(*t) ? t->dims - 1 : t->dims); ++d)
      if (t->size[d] > 1) g = std::gcd(g, t->stride[d] < 0 ? -t->stride[d] * es : t->stride[d] * es);
  }
  const int64_t gap = int64_t(a.ptr) - int64_t(b.ptr);
  // Rows [x, x + xa) of a and [y, y + xb) of b meet iff -xa < x - y < xb, and x - y = gap (mod g).
  if (g == 0) return gap > -xa && gap < xb;  // one row each
  if (g >= (xa > xb ? xa : xb)) {            // rows shorter than the period: the residues decide
    const int64_t r = ((gap % g) + g) % g;   // x - y is r or r - g (mod g)
    if (!(r < xb || r > g - xa)) return false;
  }
  // A leading dim both spans share (same size, same byte stride S > 0; e.g. the tokens of the
  // fields of one [T, F, H, D] buffer) whose slabs (the other dims) are each at most S bytes
  // long: slab k of a can meet slab k' of b only for the one to three k - k' that bring their
  // ranges together, and every such pair of slabs has the same relative placement, so the
  // question becomes that of the slabs, shifted by (k - k') S: decided in O(dims) recursions
  // instead of enumerating T x H rows.
  if (a.dims >= 2 && b.dims >= 2 && a.esize > 0 && b.esize > 0 && a.size[0] == b.size[0] &&
      a.stride[0] * a.esize == b.stride[0] * b.esize && a.stride[0] > 0) {
    const int64_t S = a.stride[0] * a.esize, N = a.size[0];
    auto slab = [](const Span& t) {
      Span v{t.ptr, t.esize, t.dims - 1, {0, 0, 0, 0}, {0, 0, 0, 0}};
      for (int d = 1; d < t.dims; ++d) v.size[d - 1] = t.size[d], v.stride[d - 1] = t.stride[d];
      return v;
    };
    const Span sa = slab(a), sb = slab(b);
    int64_t slo_a, shi_a, sx_a, slo_b, shi_b, sx_b;
    if (range(sa, &slo_a, &shi_a, &sx_a) && range(sb, &slo_b, &shi_b, &sx_b) && shi_a - slo_a <= S &&
        shi_b - slo_b <= S) {
      // Slab k of a, [slo_a + k S, shi_a + k S), meets slab k' of b iff d = k - k' has
      // slo_b - shi_a < d S < shi_b - slo_a (and |d| < N).
      auto floor_div = [](int64_t x, int64_t y) { return x / y - ((x % y != 0) && ((x < 0) != (y < 0))); };
      int64_t d_lo = floor_div(slo_b - shi_a, S) + 1, d_hi = -floor_div(slo_a - shi_b, S) - 1;
      if (d_lo < -(N - 1)) d_lo = -(N - 1);
      if (d_hi > N - 1) d_hi = N - 1;
      for (int64_t d = d_lo; d <= d_hi; ++d) {
        Span shifted = sa;
        shifted.ptr = uintptr_t(int64_t(sa.ptr) + d * S);
        if (may_share_bytes(shifted, sb)) return true;
      }
      return false;
    }
  }
  // Exact: the two sorted row lists, no pair meeting (each list's rows have one length, so a
  // row ending before the other list's current row starts can be passed by).
  std::vector<int64_t> ra, rb;
  if (!span_row_starts(a, rows(a), ra) || !span_row_starts(b, rows(b), rb)) return true;
  size_t i = 0, j = 0;
  while (i < ra.size() && j < rb.size()) {
    if (ra[i] + xa <= rb[j]) {
      ++i;
    } else if (rb[j] + xb <= ra[i]) {
      ++j;
    } else {
      return true;
    }
  }
  return false;
}

// Whether two spans are the very same view: pointer, element size, sizes and strides.
inline bool same_view(const Span& a, const Span& b) {
  if (a.ptr != b.ptr || a.esize != b.esize || a.dims != b.dims) return false;
  for (int d = 0; d < a.dims; ++d)
    if (a.size[d] != b.size[d] || (a.size[d] > 1 && a.stride[d] != b.stride[d])) return false;
  return true;
}

// A buffer the op writes must not share memory with another argument (the kernels read the
// inputs while other threads and blocks write the outputs, and the CPU twin would read what it
// has already overwritten).
inline void check_disjoint(const char* op, const Span& out, const char* out_name, const Span& other,
                           const char* other_name) {
  MLA_CHECK(!may_share_bytes(out, other), op, "expected ", out_name, " not to share memory with ", other_name,
            " (", out_name, " is written while ", other_name, " is still read or written); pass separate buffers");
}

inline void check_same_device(const char* op, const Tensor& ref, const char* ref_name,
                              const Tensor& t, const char* name) {
  bool same = ref.is_cpu() == t.is_cpu() && ref.is_cuda() == t.is_cuda() &&
              (ref.is_cpu() || ref.get_device_index() == t.get_device_index());
  MLA_CHECK(same, op, "expected ", name, " on the same device as ", ref_name, " (",
            device_str(ref), "), got ", device_str(t));
}

inline mla_ext::DType to_value_dtype(const char* op, const Tensor& t, const char* name) {
  switch (t.scalar_type()) {
    case ScalarType::Float: return mla_ext::DType::kFloat32;
    case ScalarType::Half: return mla_ext::DType::kFloat16;
    case ScalarType::BFloat16: return mla_ext::DType::kBFloat16;
    default: break;
  }
  MLA_CHECK(false, op, "expected ", name, " to be float32, float16 or bfloat16, got ",
            dtype_name(t.scalar_type()));
  return mla_ext::DType::kFloat32;
}

// Validates every argument of merge_attn_states and fills the params; throws
// (before anything is launched or written) on the first violation.
inline mla_ext::MergeParams make_merge_params(const Tensor& output,
                                              const std::optional<Tensor>& output_lse,
                                              const Tensor& prefix_output,
                                              const Tensor& prefix_lse,
                                              const Tensor& suffix_output,
                                              const Tensor& suffix_lse,
                                              std::optional<int64_t> prefill_tokens_with_context = std::nullopt,
                                              const std::optional<Tensor>& output_scale = std::nullopt) {
  const char* op = "merge_attn_states";
  check_all_defined(op, "output", output, "output_lse", output_lse, "prefix_output", prefix_output, "prefix_lse",
                    prefix_lse, "suffix_output", suffix_output, "suffix_lse", suffix_lse, "output_scale",
                    output_scale);
  MLA_CHECK(output.dim() == 3, op,
            "expected output to be 3-D [num_tokens, num_heads, head_size], got shape ",
            shape_str(output));
  const int64_t T = output.size(0), H = output.size(1), D = output.size(2);
  MLA_CHECK(D < (int64_t(1) << 31), op, "expected head_size below 2^31 elements, got ", D);
  mla_ext::MergeParams p;
  // Output dtype: the inputs' dtype, or FP8 e4m3 with a per-tensor scale.
  const ScalarType out_type = output.scalar_type();
  const bool fp8_out = out_type == ScalarType::Float8_e4m3fn || out_type == ScalarType::Float8_e4m3fnuz;
  if (fp8_out) {
    p.output_kind = out_type == ScalarType::Float8_e4m3fn ? mla_ext::MergeOutput::kFp8E4M3FN
                                                          : mla_ext::MergeOutput::kFp8E4M3FNUZ;
    MLA_CHECK(output_scale.has_value(), op, "expected output_scale (a float32 tensor of one element) with a ",
              dtype_name(out_type), " output, got None");
  } else {
    MLA_CHECK(out_type == ScalarType::Float || out_type == ScalarType::Half || out_type == ScalarType::BFloat16,
              op, "expected output to be float32, float16 or bfloat16 (or float8_e4m3fn / float8_e4m3fnuz with "
              "output_scale), got ", dtype_name(out_type));
    MLA_CHECK(!output_scale.has_value(), op,
              "expected output_scale to be None: it applies to float8_e4m3fn / float8_e4m3fnuz outputs only, "
              "and output is ", dtype_name(out_type));
  }
  // The inputs' dtype: output's, or prefix_output's for an FP8 output.
  const ScalarType in_type = fp8_out ? prefix_output.scalar_type() : out_type;
  const char* in_ref = fp8_out ? "prefix_output" : "output";
  p.dtype = to_value_dtype(op, fp8_out ? prefix_output : output, in_ref);

  auto check_shape = [&](const Tensor& t, const char* name) {
    MLA_CHECK(t.dim() == 3 && t.size(0) == T && t.size(1) == H && t.size(2) == D, op,
              "expected output and ", name, " to have the same shape [num_tokens, num_heads, head_size], got "
              "output ", shape_str(output), " and ", name, " ", shape_str(t));
    MLA_CHECK(D <= 1 || t.stride(2) == 1, op, "expected ", name,
              " to be contiguous in its last (head_size) dim, got stride ", t.stride(2));
    check_same_device(op, output, "output", t, name);
  };
  auto check_value = [&](const Tensor& t, const char* name) {
    check_shape(t, name);
    MLA_CHECK(t.scalar_type() == in_type, op, "expected ", name, " to have ", in_ref, "'s dtype ",
              dtype_name(in_type), ", got ", dtype_name(t.scalar_type()));
  };
  auto check_lse = [&](const Tensor& t, const char* name) {
    MLA_CHECK(t.scalar_type() == ScalarType::Float, op, "expected ", name,
              " to be float32, got ", dtype_name(t.scalar_type()));
    MLA_CHECK(t.dim() == 2 && t.size(0) == T && t.size(1) == H, op, "expected ", name,
              " of shape [num_tokens, num_heads] = [", T, ", ", H, "] (any strides), got ",
              shape_str(t));
    check_same_device(op, output, "output", t, name);
  };
  check_shape(output, "output");
  check_no_repeats(op, output, "output");
  check_value(prefix_output, "prefix_output");
  check_value(suffix_output, "suffix_output");
  check_lse(prefix_lse, "prefix_lse");
  check_lse(suffix_lse, "suffix_lse");
  if (output_lse.has_value()) {
    check_lse(*output_lse, "output_lse");
    check_no_repeats(op, *output_lse, "output_lse");
    check_lse_needs_values(op, T, H, D);
  }
  if (output_scale.has_value()) {
    const Tensor& sc = *output_scale;
    MLA_CHECK(sc.scalar_type() == ScalarType::Float, op, "expected output_scale to be float32, got ",
              dtype_name(sc.scalar_type()));
    MLA_CHECK(sc.numel() == 1, op, "expected output_scale to have exactly one element (a per-tensor scale), got shape ",
              shape_str(sc));
    check_same_device(op, output, "output", sc, "output_scale");
    p.output_scale = static_cast<const float*>(sc.data_ptr());
  }
  if (prefill_tokens_with_context.has_value()) {
    MLA_CHECK(*prefill_tokens_with_context >= 0, op,
              "expected prefill_tokens_with_context >= 0 (tokens at and after it copy the suffix), got ",
              *prefill_tokens_with_context);
    p.has_prefill_tokens_with_context = 1;
    p.prefill_tokens_with_context = *prefill_tokens_with_context;
  }

  p.num_tokens = T;
  p.num_heads = H;
  p.head_size = D;
  p.output = output.data_ptr();
  p.output_stride_token = output.stride(0);
  p.output_stride_head = output.stride(1);
  if (output_lse.has_value()) {
    p.output_lse = static_cast<float*>(output_lse->data_ptr());
    p.output_lse_stride_token = output_lse->stride(0);
    p.output_lse_stride_head = output_lse->stride(1);
  }
  p.prefix_output = prefix_output.data_ptr();
  p.prefix_stride_token = prefix_output.stride(0);
  p.prefix_stride_head = prefix_output.stride(1);
  p.prefix_lse = static_cast<const float*>(prefix_lse.data_ptr());
  p.prefix_lse_stride_token = prefix_lse.stride(0);
  p.prefix_lse_stride_head = prefix_lse.stride(1);
  p.suffix_output = suffix_output.data_ptr();
  p.suffix_stride_token = suffix_output.stride(0);
  p.suffix_stride_head = suffix_output.stride(1);
  p.suffix_lse = static_cast<const float*>(suffix_lse.data_ptr());
  p.suffix_lse_stride_token = suffix_lse.stride(0);
  p.suffix_lse_stride_head = suffix_lse.stride(1);
  // In place means the very same view (each chunk is read before the same thread writes it);
  // any other overlap would read elements already merged.
  {
    const int64_t ein = mla_ext::dtype_size(p.dtype), eout = mla_ext::merge_output_size(p.dtype, p.output_kind);
    const Span out = span_of(p.output, eout, {T, H, D}, {p.output_stride_token, p.output_stride_head, 1});
    const Span pre = span_of(p.prefix_output, ein, {T, H, D}, {p.prefix_stride_token, p.prefix_stride_head, 1});
    const Span suf = span_of(p.suffix_output, ein, {T, H, D}, {p.suffix_stride_token, p.suffix_stride_head, 1});
    MLA_CHECK(same_view(out, pre) || !may_share_bytes(out, pre), op,
              "expected output to be either the very same view as prefix_output (in place: same data pointer, "
              "shape and strides) or not to share memory with it");
    MLA_CHECK(same_view(out, suf) || !may_share_bytes(out, suf), op,
              "expected output to be either the very same view as suffix_output (in place: same data pointer, "
              "shape and strides) or not to share memory with it");
    check_disjoint(op, out, "output", span_of(p.prefix_lse, 4, {T, H}, {p.prefix_lse_stride_token,
                                                                        p.prefix_lse_stride_head}), "prefix_lse");
    check_disjoint(op, out, "output", span_of(p.suffix_lse, 4, {T, H}, {p.suffix_lse_stride_token,
                                                                        p.suffix_lse_stride_head}), "suffix_lse");
    const Span scale = span_of(p.output_scale, 4, {1}, {1});
    if (p.output_lse != nullptr) {
      const Span ol = span_of(p.output_lse, 4, {T, H}, {p.output_lse_stride_token, p.output_lse_stride_head});
      // The GPU kernels read a row's input LSEs from several threads (and blocks) while one
      // thread writes its output LSE.
      check_disjoint(op, ol, "output_lse", span_of(p.prefix_lse, 4, {T, H}, {p.prefix_lse_stride_token,
                                                                              p.prefix_lse_stride_head}), "prefix_lse");
      check_disjoint(op, ol, "output_lse", span_of(p.suffix_lse, 4, {T, H}, {p.suffix_lse_stride_token,
                                                                              p.suffix_lse_stride_head}), "suffix_lse");
      check_disjoint(op, out, "output", ol, "output_lse");
      check_disjoint(op, ol, "output_lse", pre, "prefix_output");
      check_disjoint(op, ol, "output_lse", suf, "suffix_output");
      if (p.output_scale != nullptr) check_disjoint(op, ol, "output_lse", scale, "output_scale");
    }
    if (p.output_scale != nullptr) check_disjoint(op, out, "output", scale, "output_scale");
  }
  return p;
}

// Validates every argument of merge_attn_states_n and fills the params.
inline mla_ext::MergeNParams make_merge_n_params(const Tensor& output, const std::optional<Tensor>& output_lse,
                                                 const Tensor& values, const Tensor& lses,
                                                 const std::optional<Tensor>& attn_sink = std::nullopt) {
  const char* op = "merge_attn_states_n";
  check_all_defined(op, "output", output, "output_lse", output_lse, "values", values, "lses", lses, "attn_sink",
                    attn_sink);
  MLA_CHECK(output.dim() == 3, op,
            "expected output to be 3-D [num_tokens, num_heads, head_size], got shape ", shape_str(output));
  const int64_t T = output.size(0), H = output.size(1), D = output.size(2);
  // As merge_attn_states (the GPU kernels index a row's chunks in 32 bits): one limit on every device.
  MLA_CHECK(D < (int64_t(1) << 31), op, "expected head_size below 2^31 elements, got ", D);
  mla_ext::MergeNParams p;
  p.dtype = to_value_dtype(op, output, "output");
  MLA_CHECK(D <= 1 || output.stride(2) == 1, op,
            "expected output to be contiguous in its last (head_size) dim, got stride ", output.stride(2));
  MLA_CHECK(values.dim() == 4 && values.size(1) == T && values.size(2) == H && values.size(3) == D, op,
            "expected values of shape [num_states, ", T, ", ", H, ", ", D,
            "] (num_states, then the shape of output), got ", shape_str(values));
  const int64_t S = values.size(0);
  MLA_CHECK(S >= 1, op, "expected at least one state (values.size(0) >= 1), got ", S);
  MLA_CHECK(values.scalar_type() == output.scalar_type(), op, "expected values to have output's dtype ",
            dtype_name(output.scalar_type()), ", got ", dtype_name(values.scalar_type()));
  MLA_CHECK(D <= 1 || values.stride(3) == 1, op,
            "expected values to be contiguous in its last (head_size) dim, got stride ", values.stride(3));
  check_same_device(op, output, "output", values, "values");
  check_no_repeats(op, output, "output");
  MLA_CHECK(lses.scalar_type() == ScalarType::Float, op, "expected lses to be float32, got ",
            dtype_name(lses.scalar_type()));
  MLA_CHECK(lses.dim() == 3 && lses.size(0) == S && lses.size(1) == T && lses.size(2) == H, op,
            "expected lses of shape [num_states, num_tokens, num_heads] = [", S, ", ", T, ", ", H,
            "] (any strides), got ", shape_str(lses));
  check_same_device(op, output, "output", lses, "lses");
  if (output_lse.has_value()) {
    const Tensor& ol = *output_lse;
    MLA_CHECK(ol.scalar_type() == ScalarType::Float, op, "expected output_lse to be float32, got ",
              dtype_name(ol.scalar_type()));
    MLA_CHECK(ol.dim() == 2 && ol.size(0) == T && ol.size(1) == H, op,
              "expected output_lse of shape [num_tokens, num_heads] = [", T, ", ", H, "] (any strides), got ",
              shape_str(ol));
    check_same_device(op, output, "output", ol, "output_lse");
    check_no_repeats(op, ol, "output_lse");
    check_lse_needs_values(op, T, H, D);
    p.output_lse = static_cast<float*>(ol.data_ptr());
    p.output_lse_stride_token = ol.stride(0);
    p.output_lse_stride_head = ol.stride(1);
  }
  if (attn_sink.has_value()) {
    const Tensor& sk = *attn_sink;
    MLA_CHECK(sk.scalar_type() == ScalarType::Float, op, "expected attn_sink to be float32, got ",
              dtype_name(sk.scalar_type()));
    MLA_CHECK(sk.dim() == 1 && sk.size(0) == H, op, "expected attn_sink of shape [num_heads] = [", H,
              "] (any stride), got ", shape_str(sk));
    check_same_device(op, output, "output", sk, "attn_sink");
    p.attn_sink = static_cast<const float*>(sk.data_ptr());
    p.attn_sink_stride = sk.stride(0);
  }
  p.num_states = S;
  p.num_tokens = T;
  p.num_heads = H;
  p.head_size = D;
  p.output = output.data_ptr();
  p.output_stride_token = output.stride(0);
  p.output_stride_head = output.stride(1);
  p.values = values.data_ptr();
  p.values_stride_state = values.stride(0);
  p.values_stride_token = values.stride(1);
  p.values_stride_head = values.stride(2);
  p.lses = static_cast<const float*>(lses.data_ptr());
  p.lses_stride_state = lses.stride(0);
  p.lses_stride_token = lses.stride(1);
  p.lses_stride_head = lses.stride(2);
  // In place means the very same view as one state values[s]: each chunk of every state is read
  // before the same thread writes the output chunk.
  {
    const int64_t es = mla_ext::dtype_size(p.dtype);
    const Span out = span_of(p.output, es, {T, H, D}, {p.output_stride_token, p.output_stride_head, 1});
    // The only state output can be the same view of: the one whose start is output's.
    const int64_t gap = int64_t(reinterpret_cast<uintptr_t>(p.output)) - int64_t(reinterpret_cast<uintptr_t>(p.values));
    const int64_t step = p.values_stride_state * es;
    const int64_t s = (step == 0 || S == 1) ? (gap == 0 ? 0 : -1) : (gap % step == 0 ? gap / step : -1);
    const bool output_is_a_state =
        s >= 0 && s < S &&
        same_view(out, span_of(static_cast<const uint8_t*>(p.values) + s * step, es, {T, H, D},
                               {p.values_stride_token, p.values_stride_head, 1}));
    const Span vals = span_of(p.values, es, {S, T, H, D},
                              {p.values_stride_state, p.values_stride_token, p.values_stride_head, 1});
    MLA_CHECK(output_is_a_state || !may_share_bytes(out, vals), op,
              "expected output to be either the very same view as one state values[s] (in place: same data "
              "pointer, shape and strides) or not to share memory with values");
    if (output_is_a_state) {  // and then no memory with the other states
      const Span before = span_of(p.values, es, {s, T, H, D},
                                  {p.values_stride_state, p.values_stride_token, p.values_stride_head, 1});
      const Span after = span_of(static_cast<const uint8_t*>(p.values) + (s + 1) * step, es, {S - 1 - s, T, H, D},
                                 {p.values_stride_state, p.values_stride_token, p.values_stride_head, 1});
      MLA_CHECK(!may_share_bytes(out, before) && !may_share_bytes(out, after), op,
                "expected output, the same view as values[", s, "], not to share memory with the other states");
    }
    const Span lse_in = span_of(p.lses, 4, {S, T, H}, {p.lses_stride_state, p.lses_stride_token, p.lses_stride_head});
    check_disjoint(op, out, "output", lse_in, "lses");
    const Span sink = span_of(p.attn_sink, 4, {H}, {p.attn_sink_stride});
    if (p.output_lse != nullptr) {
      const Span ol = span_of(p.output_lse, 4, {T, H}, {p.output_lse_stride_token, p.output_lse_stride_head});
      check_disjoint(op, ol, "output_lse", lse_in, "lses");
      check_disjoint(op, out, "output", ol, "output_lse");
      check_disjoint(op, ol, "output_lse", vals, "values");
      if (p.attn_sink != nullptr) check_disjoint(op, ol, "output_lse", sink, "attn_sink");
    }
    if (p.attn_sink != nullptr) check_disjoint(op, out, "output", sink, "attn_sink");
  }
  return p;
}

}  // namespace mla_ext_torch
