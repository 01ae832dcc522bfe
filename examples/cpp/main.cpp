// mla_ext from a C++ engine, through the C API of the installed package
// (find_package(mla_ext) -> mla_ext::mla_ext). Builds small random inputs on the
// host, runs merge_attn_states and sparse_mla_decode on the GPU on strided
// views, copies the results back and compares them with a float64 host
// computation of DESIGN.md §3/§4. Prints the max errors; exits 1 on a mismatch,
// 2 when no GPU is usable.
#include <mla_ext_capi.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#if defined(MLA_EXT_EXAMPLE_HIP)
#include <hip/hip_runtime_api.h>
#define gpuMalloc hipMalloc
#define gpuFree hipFree
#define gpuMemcpy hipMemcpy
#define gpuMemset hipMemset
#define gpuH2D hipMemcpyHostToDevice
#define gpuD2H hipMemcpyDeviceToHost
#define gpuStream_t hipStream_t
#define gpuStreamCreate hipStreamCreate
#define gpuStreamSynchronize hipStreamSynchronize
#define gpuStreamDestroy hipStreamDestroy
#define gpuGetDeviceCount hipGetDeviceCount
#define gpuGetErrorString hipGetErrorString
#define gpuSuccess hipSuccess
#define gpuDeviceGetAttribute hipDeviceGetAttribute
#define gpuAttrSMs hipDeviceAttributeMultiprocessorCount
#else
#include <cuda_runtime_api.h>
#define gpuMalloc cudaMalloc
#define gpuFree cudaFree
#define gpuMemcpy cudaMemcpy
#define gpuMemset cudaMemset
#define gpuH2D cudaMemcpyHostToDevice
#define gpuD2H cudaMemcpyDeviceToHost
#define gpuStream_t cudaStream_t
#define gpuStreamCreate cudaStreamCreate
#define gpuStreamSynchronize cudaStreamSynchronize
#define gpuStreamDestroy cudaStreamDestroy
#define gpuGetDeviceCount cudaGetDeviceCount
#define gpuGetErrorString cudaGetErrorString
#define gpuSuccess cudaSuccess
#define gpuDeviceGetAttribute cudaDeviceGetAttribute
#define gpuAttrSMs cudaDevAttrMultiProcessorCount
#endif

#define GPU_CHECK(x)                                                                  \
  do {                                                                                \
    auto e_ = (x);                                                                    \
    if (e_ != gpuSuccess) {                                                           \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, gpuGetErrorString(e_)); \
      std::exit(2);                                                                   \
    }                                                                                 \
  } while (0)

#define MLA_CHECK(x)                                                                           \
  do {                                                                                         \
    int s_ = (x);                                                                              \
    if (s_ != MLA_EXT_STATUS_SUCCESS) {                                                        \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, mla_ext_status_string(s_)); \
      std::exit(1);                                                                            \
    }                                                                                          \
  } while (0)

namespace {

const double kInf = std::numeric_limits<double>::infinity();

// ---------------------------------------------------------------- numbers
uint16_t to_bf16(float f) {  // round to nearest even
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
double from_bf16(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// OCP e4m3fn: bias 7, no infinities, 0x7f/0xff NaN.
double from_e4m3(uint8_t b) {
  const int e = (b >> 3) & 15, m = b & 7;
  if (e == 15 && m == 7) return std::nan("");
  const double v = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return (b & 0x80) ? -v : v;
}
uint8_t to_e4m3(double x) {  // nearest finite code, saturating at +-448
  static std::vector<double> table = [] {
    std::vector<double> t(127);
    for (int b = 0; b < 127; ++b) t[b] = from_e4m3(uint8_t(b));
    return t;
  }();
  const double a = std::fabs(x);
  int best = 0;
  for (int b = 1; b < 127; ++b)
    if (std::fabs(table[b] - a) < std::fabs(table[best] - a)) best = b;
  return uint8_t(best | (x < 0 && best != 0 ? 0x80 : 0));
}

// ---------------------------------------------------------------- device buffers
struct DevBuf {
  void* ptr = nullptr;
  size_t bytes = 0;
  explicit DevBuf(size_t n) : bytes(n) {
    GPU_CHECK(gpuMalloc(&ptr, n ? n : 1));
    GPU_CHECK(gpuMemset(ptr, 0xff, n ? n : 1));  // garbage (NaN patterns) where nothing is written
  }
  template <typename T>
  explicit DevBuf(const std::vector<T>& host) : DevBuf(host.size() * sizeof(T)) {
    GPU_CHECK(gpuMemcpy(ptr, host.data(), bytes, gpuH2D));
  }
  ~DevBuf() { (void)gpuFree(ptr); }  // (void): hipError_t is [[nodiscard]]
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  template <typename T>
  std::vector<T> download() const {
    std::vector<T> h(bytes / sizeof(T));
    GPU_CHECK(gpuMemcpy(h.data(), ptr, bytes, gpuD2H));
    return h;
  }
  template <typename T>
  T* as() const { return static_cast<T*>(ptr); }
};

// |got - ref| <= atol + rtol * |ref| for finite references; infinities and NaN
// (empty rows, selected sides) must match exactly.
struct Check {
  std::string name;
  double atol = 0, rtol = 0;
  double max_err = 0, worst = 0;  // worst: max |err| / (atol + rtol * |ref|), must stay <= 1
  bool special_ok = true;
  void add(double got, double ref) {
    if (std::isinf(ref) || std::isnan(ref)) {
      if (!(got == ref || (std::isnan(ref) && std::isnan(got)))) special_ok = false;
      return;
    }
    const double e = std::isfinite(got) ? std::fabs(got - ref) : kInf;
    max_err = std::max(max_err, e);
    worst = std::max(worst, e / (atol + rtol * std::fabs(ref)));
  }
  bool report() const {
    const bool ok = special_ok && worst <= 1.0;
    std::printf("  %-52s max|err| %.3e (atol %.0e, rtol %.0e)%s  %s\n", name.c_str(), max_err, atol, rtol,
                special_ok ? "" : "  [inf/NaN/empty rows wrong]", ok ? "ok" : "MISMATCH");
    return ok;
  }
};

// ---------------------------------------------------------------- merge_attn_states
// prefix values live in a wider [T, H+1, D] buffer (a head slice), suffix is
// contiguous, output has a padded token stride; prefix and output LSEs are
// [H, T] buffers seen as [T, H] (.T views). Rows cover both-sides, one side
// empty (+inf or -inf LSE) and both empty.
bool run_merge(int dtype, gpuStream_t stream, int num_sms, std::mt19937& rng) {
  const int64_t T = 37, H = 6, D = 128;
  const int esize = dtype == MLA_EXT_DTYPE_FLOAT32 ? 4 : 2;
  const int64_t p_st = (H + 1) * D, p_sh = D;
  const int64_t s_st = H * D, s_sh = D;
  const int64_t o_st = H * D + 64, o_sh = D;
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_real_distribution<float> ud(-4.f, 4.f);

  auto make_values = [&](int64_t n, std::vector<double>& ref) {
    std::vector<uint8_t> bytes(size_t(n) * esize);
    ref.resize(size_t(n));
    for (int64_t i = 0; i < n; ++i) {
      const float v = nd(rng);
      if (esize == 4) {
        std::memcpy(&bytes[size_t(i) * 4], &v, 4);
        ref[size_t(i)] = v;
      } else {
        const uint16_t b = to_bf16(v);
        std::memcpy(&bytes[size_t(i) * 2], &b, 2);
        ref[size_t(i)] = from_bf16(b);
      }
    }
    return bytes;
  };
  std::vector<double> pv, sv;
  auto p_bytes = make_values(T * p_st, pv);
  auto s_bytes = make_values(T * s_st, sv);
  std::vector<float> plse(size_t(H * T)), slse(size_t(T * H));  // prefix [H, T], suffix [T, H]
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) {
      float a = ud(rng), b = ud(rng);
      if (t == 1) a = float(kInf);                  // prefix empty (+inf convention)
      if (t == 2) b = -float(kInf);                 // suffix empty
      if (t == 3) a = b = -float(kInf);             // both empty
      plse[size_t(h * T + t)] = a;
      slse[size_t(t * H + h)] = b;
    }

  DevBuf d_p(p_bytes), d_s(s_bytes), d_plse(plse), d_slse(slse);
  DevBuf d_out(size_t(T * o_st) * esize), d_olse(size_t(H * T) * sizeof(float));

  mla_ext_merge_params mp;
  std::memset(&mp, 0, sizeof(mp));
  mp.dtype = dtype;
  mp.num_tokens = T;
  mp.num_heads = H;
  mp.head_size = D;
  mp.output = d_out.ptr;
  mp.output_stride_token = o_st;
  mp.output_stride_head = o_sh;
  mp.output_lse = d_olse.as<float>();
  mp.output_lse_stride_token = 1;
  mp.output_lse_stride_head = T;
  mp.prefix_output = d_p.ptr;
  mp.prefix_stride_token = p_st;
  mp.prefix_stride_head = p_sh;
  mp.prefix_lse = d_plse.as<float>();
  mp.prefix_lse_stride_token = 1;
  mp.prefix_lse_stride_head = T;
  mp.suffix_output = d_s.ptr;
  mp.suffix_stride_token = s_st;
  mp.suffix_stride_head = s_sh;
  mp.suffix_lse = d_slse.as<float>();
  mp.suffix_lse_stride_token = H;
  mp.suffix_lse_stride_head = 1;
  MLA_CHECK(mla_ext_merge_attn_states(&mp, num_sms, stream));
  GPU_CHECK(gpuStreamSynchronize(stream));

  auto out = d_out.download<uint8_t>();
  auto olse = d_olse.download<float>();
  Check cv{std::string("merge_attn_states ") + (esize == 4 ? "fp32" : "bf16") + " output",
           esize == 4 ? 1e-5 : 1e-2, esize == 4 ? 1e-5 : 1e-2};
  Check cl{std::string("merge_attn_states ") + (esize == 4 ? "fp32" : "bf16") + " output_lse", 1e-5, 1e-6};
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) {
      double a = plse[size_t(h * T + t)], b = slse[size_t(t * H + h)];
      if (a == kInf) a = -kInf;
      if (b == kInf) b = -kInf;
      double wa = 0, wb = 0, lse;
      if (a == -kInf && b == -kInf) {
        lse = -kInf;
      } else {
        const double m = std::max(a, b);
        wa = std::exp(a - m);
        wb = std::exp(b - m);
        lse = m + std::log(wa + wb);
        const double s = wa + wb;
        wa /= s;
        wb /= s;
      }
      cl.add(olse[size_t(h * T + t)], lse);
      for (int64_t d = 0; d < D; ++d) {
        const double ref = wa * pv[size_t(t * p_st + h * p_sh + d)] + wb * sv[size_t(t * s_st + h * s_sh + d)];
        const size_t o = size_t(t * o_st + h * o_sh + d);
        double got;
        if (esize == 4) {
          float f;
          std::memcpy(&f, &out[o * 4], 4);
          got = f;
        } else {
          uint16_t b16;
          std::memcpy(&b16, &out[o * 2], 2);
          got = from_bf16(b16);
        }
        cv.add(got, ref);
      }
    }
  const bool ok1 = cv.report();
  const bool ok2 = cl.report();
  return ok1 && ok2;
}

// ---------------------------------------------------------------- sparse_mla_decode
// A paged cache in one of the three formats, with its dequantised rows (K, the
// reference's view) per slot.
struct HostCache {
  int format = MLA_EXT_KV_BF16;
  int d_qk = 576;
  int64_t page_size = 0, num_pages = 0, page_stride = 0, token_stride = 0;
  std::vector<uint8_t> bytes;
  std::vector<double> k;  // [num_slots, d_qk]
  int64_t num_slots() const { return page_size * num_pages; }
};

HostCache make_cache(int format, int64_t page_size, int64_t num_pages, std::mt19937& rng) {
  HostCache c;
  c.format = format;
  c.d_qk = format == MLA_EXT_KV_FP8_DS_MLA_V4 ? 512 : 576;
  c.page_size = page_size;
  c.num_pages = num_pages;
  std::normal_distribution<float> nd(0.f, 1.f);
  const int64_t slots = c.num_slots();
  c.k.assign(size_t(slots * c.d_qk), 0.0);
  if (format == MLA_EXT_KV_BF16) {  // [num_pages, page_size, 576] bf16
    c.token_stride = 2 * c.d_qk;
    c.page_stride = page_size * c.token_stride;
  } else if (format == MLA_EXT_KV_FP8_DS_MLA) {  // V3.2: 656 B per token, inline
    c.token_stride = 656;
    c.page_stride = page_size * 656;
  } else {  // V4: data rows (576 B) then scale rows (8 B); page stride padded to 576 B, plus one more row
    c.token_stride = 0;
    c.page_stride = (page_size * 584 + 575) / 576 * 576 + 576;
  }
  c.bytes.assign(size_t(num_pages * c.page_stride), 0xff);
  for (int64_t slot = 0; slot < slots; ++slot) {
    const int64_t page = slot / page_size, p = slot % page_size;
    uint8_t* base = c.bytes.data() + page * c.page_stride;
    double* k = &c.k[size_t(slot * c.d_qk)];
    std::vector<float> x(size_t(c.d_qk));
    for (auto& v : x) v = nd(rng);
    auto put_bf16 = [&](uint8_t* dst, int i0, int n) {
      for (int i = 0; i < n; ++i) {
        const uint16_t b = to_bf16(x[size_t(i0 + i)]);
        std::memcpy(dst + 2 * i, &b, 2);
        k[i0 + i] = from_bf16(b);
      }
    };
    if (format == MLA_EXT_KV_BF16) {
      put_bf16(base + p * c.token_stride, 0, c.d_qk);
    } else if (format == MLA_EXT_KV_FP8_DS_MLA) {
      uint8_t* row = base + p * c.token_stride;
      for (int j = 0; j < 4; ++j) {  // fp32 scale per 128 latent elements: amax / 448
        double amax = 1e-4;
        for (int i = 0; i < 128; ++i) amax = std::max(amax, double(std::fabs(x[size_t(128 * j + i)])));
        const float scale = float(amax / 448.0);
        std::memcpy(row + 512 + 4 * j, &scale, 4);
        for (int i = 0; i < 128; ++i) {
          const int e = 128 * j + i;
          row[e] = to_e4m3(x[size_t(e)] / scale);
          k[e] = from_e4m3(row[e]) * double(scale);
        }
      }
      put_bf16(row + 528, 512, 64);
    } else {
      uint8_t* row = base + p * 576;
      uint8_t* sc = base + page_size * 576 + p * 8;
      for (int j = 0; j < 7; ++j) {  // UE8M0 per 64 elements: e = ceil(log2(amax / 448))
        double amax = 1e-4;
        for (int i = 0; i < 64; ++i) amax = std::max(amax, double(std::fabs(x[size_t(64 * j + i)])));
        const int e = int(std::ceil(std::log2(amax / 448.0)));
        sc[j] = uint8_t(std::min(255, std::max(0, e + 127)));
        for (int i = 0; i < 64; ++i) {
          const int el = 64 * j + i;
          row[el] = to_e4m3(std::ldexp(double(x[size_t(el)]), -e));
          k[el] = std::ldexp(from_e4m3(row[el]), int(sc[j]) - 127);
        }
      }
      sc[7] = 0;
      put_bf16(row + 448, 448, 64);
    }
  }
  return c;
}

struct HostSet {
  int64_t width = 0;
  std::vector<int32_t> indices;  // [T, width]
  std::vector<int32_t> lengths;  // [T] (empty: none)
};

// Distinct random slots per token, with invalid ones (-1, >= num_slots) sprinkled in.
HostSet make_set(int64_t T, int64_t width, int64_t num_slots, const std::vector<int32_t>& lengths,
                 std::mt19937& rng) {
  HostSet s;
  s.width = width;
  s.lengths = lengths;
  s.indices.resize(size_t(T * width));
  std::vector<int32_t> perm(static_cast<size_t>(num_slots));
  for (int64_t t = 0; t < T; ++t) {
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int64_t j = 0; j < width; ++j) {
      int32_t v = perm[size_t(j % num_slots)];
      if (j % 13 == 5) v = -1;
      if (j % 29 == 7) v = int32_t(num_slots + j);
      s.indices[size_t(t * width + j)] = v;
    }
  }
  return s;
}

struct DecodeCase {
  std::string name;
  int format;
  int64_t T, H;
  float scale;
  int num_splits;  // 0 = automatic
  bool sink;
  bool extra;
};

bool run_decode(const DecodeCase& dc, gpuStream_t stream, int num_sms, void* ws, size_t ws_bytes,
                std::mt19937& rng) {
  const int64_t T = dc.T, H = dc.H, DV = 512;
  const bool v4 = dc.format == MLA_EXT_KV_FP8_DS_MLA_V4;
  HostCache main_c = make_cache(dc.format, v4 ? 256 : 64, v4 ? 2 : 6, rng);
  const int d = main_c.d_qk;
  std::vector<int32_t> main_len(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) main_len[size_t(t)] = int32_t(t == 1 ? 17 : (t == 2 ? 0 : 300 - 7 * t));
  HostSet main_s = make_set(T, v4 ? 128 : 300, main_c.num_slots(), main_len, rng);
  if (v4) main_s.lengths.clear();  // sliding window: full width, no lengths
  HostCache extra_c;
  HostSet extra_s;
  if (dc.extra) {
    extra_c = make_cache(dc.format, 64, 8, rng);
    std::vector<int32_t> extra_len(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) extra_len[size_t(t)] = int32_t(t == 2 ? 0 : 200 - 11 * t);
    extra_s = make_set(T, 200, extra_c.num_slots(), extra_len, rng);
  }
  if (v4 && !dc.extra) main_s.lengths = main_len;  // keep an empty row in the main-only V4 case

  std::normal_distribution<float> nd(0.f, 1.f);
  const int64_t q_st = H * d + 64, q_sh = d;  // q rows 16-byte aligned: strides multiples of 8
  std::vector<uint16_t> q(size_t(T * q_st));
  for (auto& v : q) v = to_bf16(nd(rng));
  std::vector<float> sink(static_cast<size_t>(H));
  std::uniform_real_distribution<float> ud(-2.f, 2.f);
  for (int64_t h = 0; h < H; ++h) sink[size_t(h)] = h == 0 ? -float(kInf) : ud(rng);
  const int64_t o_st = H * DV + 8, o_sh = DV;

  DevBuf d_q(q), d_main(main_c.bytes), d_mi(main_s.indices), d_ml(main_s.lengths.empty() ? std::vector<int32_t>(1) : main_s.lengths);
  DevBuf d_extra(dc.extra ? extra_c.bytes : std::vector<uint8_t>(16));
  DevBuf d_ei(dc.extra ? extra_s.indices : std::vector<int32_t>(1));
  DevBuf d_el(dc.extra ? extra_s.lengths : std::vector<int32_t>(1));
  DevBuf d_sink(sink), d_out(size_t(T * o_st) * 2), d_lse(size_t(H * T) * sizeof(float));

  auto fill_set = [](mla_ext_kv_set& s, const HostCache& c, const HostSet& hs, const DevBuf& cache,
                     const DevBuf& idx, const DevBuf& len) {
    s.cache = cache.as<const uint8_t>();
    s.page_stride_bytes = c.page_stride;
    s.token_stride_bytes = c.token_stride;
    s.page_size = c.page_size;
    s.num_slots = c.num_slots();
    s.indices = idx.as<const int32_t>();
    s.indices_stride_token = hs.width;
    s.width = hs.width;
    s.lengths = hs.lengths.empty() ? nullptr : len.as<const int32_t>();
    s.lengths_stride = 1;
  };
  mla_ext_sparse_decode_params p;
  std::memset(&p, 0, sizeof(p));
  p.kv_format = dc.format;
  p.d_qk = d;
  p.num_tokens = T;
  p.num_heads = H;
  p.softmax_scale = dc.scale;
  p.q = d_q.as<const uint16_t>();
  p.q_stride_token = q_st;
  p.q_stride_head = q_sh;
  fill_set(p.main, main_c, main_s, d_main, d_mi, d_ml);
  if (dc.extra) fill_set(p.extra, extra_c, extra_s, d_extra, d_ei, d_el);
  p.attn_sink = dc.sink ? d_sink.as<const float>() : nullptr;
  p.attn_sink_stride = 1;
  p.output = d_out.as<uint16_t>();
  p.output_stride_token = o_st;
  p.output_stride_head = o_sh;
  p.lse = d_lse.as<float>();
  p.lse_stride_token = 1;  // [H, T] buffer seen as [T, H]
  p.lse_stride_head = T;
  p.num_splits = dc.num_splits;
  // num_splits = 0: the decode picks the count (mla_ext_sparse_mla_decode_num_splits_for says which: it
  // reads the format and lengths, which the width-only mla_ext_sparse_mla_decode_num_splits cannot), and
  // the automatic workspace size covers whatever it picks. The query gives 0 for params the decode refuses.
  const int runs = mla_ext_sparse_mla_decode_num_splits_for(&p, num_sms);
  if (runs == 0) {
    std::fprintf(stderr, "num_splits_for: the decode refuses these params\n");
    return false;
  }
  const std::string splits = dc.num_splits > 0 ? std::to_string(dc.num_splits) + " splits"
                                               : "automatic splits: " + std::to_string(runs);
  const size_t need = mla_ext_sparse_mla_decode_workspace_size_for(T, H, dc.num_splits, num_sms);
  if (need > ws_bytes) {
    std::fprintf(stderr, "workspace: %zu bytes needed, %zu allocated\n", need, ws_bytes);
    return false;
  }
  MLA_CHECK(mla_ext_sparse_mla_decode(&p, ws, ws_bytes, num_sms, stream));
  GPU_CHECK(gpuStreamSynchronize(stream));
  auto out = d_out.download<uint16_t>();
  auto lse = d_lse.download<float>();

  Check cv{dc.name + " output (" + splits + ")", 1e-2, 2e-2};
  Check cl{dc.name + " lse", 5e-3, 1e-3};
  std::vector<double> s_ref, acc(static_cast<size_t>(DV));
  std::vector<const double*> rows;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) {
      rows.clear();
      auto gather = [&](const HostCache& c, const HostSet& hs) {
        for (int64_t j = 0; j < hs.width; ++j) {
          if (!hs.lengths.empty() && j >= hs.lengths[size_t(t)]) continue;
          const int64_t slot = hs.indices[size_t(t * hs.width + j)];
          if (slot < 0 || slot >= c.num_slots()) continue;
          rows.push_back(&c.k[size_t(slot * d)]);
        }
      };
      gather(main_c, main_s);
      if (dc.extra) gather(extra_c, extra_s);
      const uint16_t* qrow = &q[size_t(t * q_st + h * q_sh)];
      s_ref.assign(rows.size(), 0.0);
      double m = -kInf;
      for (size_t i = 0; i < rows.size(); ++i) {
        double dot = 0;
        for (int e = 0; e < d; ++e) dot += from_bf16(qrow[e]) * rows[i][e];
        s_ref[i] = double(dc.scale) * dot;
        m = std::max(m, s_ref[i]);
      }
      std::fill(acc.begin(), acc.end(), 0.0);
      double l = 0, lse_ref = -kInf;
      if (!rows.empty()) {
        for (size_t i = 0; i < rows.size(); ++i) {
          const double w = std::exp(s_ref[i] - m);
          l += w;
          for (int e = 0; e < DV; ++e) acc[size_t(e)] += w * rows[i][e];
        }
        double denom = l;
        if (dc.sink) denom += std::exp(double(sink[size_t(h)]) - m);
        for (auto& a : acc) a /= denom;
        lse_ref = m + std::log(l);
      }
      cl.add(lse[size_t(h * T + t)], lse_ref);
      for (int e = 0; e < DV; ++e) cv.add(from_bf16(out[size_t(t * o_st + h * o_sh + e)]), acc[size_t(e)]);
    }
  const bool ok1 = cv.report();
  const bool ok2 = cl.report();
  return ok1 && ok2;
}

}  // namespace

int main() {
  int n = 0;
  if (gpuGetDeviceCount(&n) != gpuSuccess || n == 0) {
    std::fprintf(stderr, "mla_ext_example: no GPU\n");
    return 2;
  }
  if (mla_ext_capi_version() != MLA_EXT_CAPI_VERSION) {
    std::fprintf(stderr, "mla_ext_example: library C API %d, header %d\n", mla_ext_capi_version(),
                 MLA_EXT_CAPI_VERSION);
    return 1;
  }
  int num_sms = 0;
  GPU_CHECK(gpuDeviceGetAttribute(&num_sms, gpuAttrSMs, 0));
  gpuStream_t stream;
  GPU_CHECK(gpuStreamCreate(&stream));
  std::printf("mla_ext C API v%d (%s), %d multiprocessors\n", mla_ext_capi_version(), mla_ext_gpu_runtime(),
              num_sms);

  std::mt19937 rng(1234);
  bool ok = true;
  ok &= run_merge(MLA_EXT_DTYPE_BFLOAT16, stream, num_sms, rng);
  ok &= run_merge(MLA_EXT_DTYPE_FLOAT32, stream, num_sms, rng);

  // One workspace for every decode call below (at most 4 tokens x 64 heads),
  // allocated once as an engine would, any contents.
  const size_t ws_bytes = mla_ext_sparse_mla_decode_workspace_size_for(4, 64, 0, num_sms);
  DevBuf ws(ws_bytes);
  const DecodeCase cases[] = {
      {"decode bf16 d576 H16", MLA_EXT_KV_BF16, 4, 16, 0.1f, 0, false, false},
      {"decode bf16 d576 H16 1 split", MLA_EXT_KV_BF16, 4, 16, 0.1f, 1, false, false},
      {"decode bf16 d576 H64", MLA_EXT_KV_BF16, 2, 64, 0.05f, 0, false, false},
      {"decode fp8_ds_mla (V3.2) H32", MLA_EXT_KV_FP8_DS_MLA, 3, 32, 0.07f, 0, false, false},
      {"decode fp8_ds_mla_v4 H8 sink+extra", MLA_EXT_KV_FP8_DS_MLA_V4, 3, 8, 0.044194173f, 0, true, true},
      {"decode fp8_ds_mla_v4 H64 sink", MLA_EXT_KV_FP8_DS_MLA_V4, 3, 64, 0.044194173f, 0, true, false},
  };
  for (const auto& dc : cases) ok &= run_decode(dc, stream, num_sms, ws.ptr, ws.bytes, rng);

  GPU_CHECK(gpuStreamDestroy(stream));
  std::printf("%s\n", ok ? "mla_ext_example: all results match" : "mla_ext_example: MISMATCH");
  return ok ? 0 : 1;
}
