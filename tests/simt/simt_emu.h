// A GPU-less HIP runtime for tests: runs the library's portable kernels on the CPU, one block
// at a time, each GPU thread as a fiber (ucontext), with 64-lane wavefronts as on CDNA (or
// 32-lane warps: MLA_EXT_SIMT_WARP=32). It exists so that CI, which has no GPU, executes the
// code an AMD GPU would run (compat.h's HIP branch: 64-bit lane masks, __shfl_xor / __ballot
// without masks, warp counts from a 64-lane warp size) and checks it against the float64
// reference; only compile checks reached that code before.
//
// What it checks beyond the results:
// - a warp collective (shuffle, ballot) must be reached by every lane of the warp, at the same
//   place in the source, the same number of times (no divergent or partial-warp collectives, no
//   exited lanes);
// - a block barrier must be reached by every thread of the block (none may have exited: CUDA
//   leaves a barrier in divergent code undefined), and no lane may wait at a shuffle while
//   another lane of its warp waits at a barrier;
// - between two barriers the warps of a block run one after another, each to the barrier, in a
//   chosen order (forward, reversed, or shuffled by a seed), and the lanes of a warp between its
//   collectives likewise: a kernel whose result depends on the order reads shared or global
//   memory that another thread writes without a barrier in between (a race), which a test sees
//   as outputs that differ bit for bit between orders;
// - shared memory (dynamic, and the static arrays declared through compat.h's MLA_EXT_SHARED) is
//   filled with 0xff bytes (NaN as bf16 / fp32) before each block, so a read of a byte the block
//   did not write shows up in the results; the dynamic shared memory ends at a PROT_NONE page,
//   so a read or write past it faults.
// Violations abort the launch: hipLaunchKernel-style failure (the launcher returns
// kLaunchFailed) and mla_ext_simt_last_error() says what happened.
//
// Not modelled: timing, memory ordering between blocks (blocks run one after another, in the
// grid's order or reversed), hardware arithmetic (exp2f, fmaf are the host's), atomics.
//
// Include path: -I tests/simt (this folder holds hip/hip_runtime.h, which includes this file),
// with -D__HIP_PLATFORM_AMD__ -DMLA_EXT_SIMT_EMU, compiled by a host C++17 compiler.
#pragma once

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cxxabi.h>
#include <dlfcn.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

// AddressSanitizer builds (-fsanitize=address, tests/test_simt_emu.py's memcheck): the fiber
// switches are announced to it, so that it tracks which stack is live.
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define MLA_EXT_SIMT_ASAN 1
#endif

#ifndef MLA_EXT_SIMT_WARP
#define MLA_EXT_SIMT_WARP 64
#endif
static_assert(MLA_EXT_SIMT_WARP == 32 || MLA_EXT_SIMT_WARP == 64, "MLA_EXT_SIMT_WARP: 32 or 64");

// ---- CUDA / HIP keywords as host C++ ----
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
// A __shared__ variable is one object for every thread of the block: a function-local static
// (blocks run one at a time). Declared through compat.h's MLA_EXT_SHARED it is also registered
// (register_shared) and poisoned before each block. Dynamic shared memory comes from
// mla_ext_simt::dynamic_smem().
#define __shared__ static

// ---- vector types (HIP's names and alignment) ----
struct alignas(8) uint2 { uint32_t x, y; };
struct alignas(16) uint4 { uint32_t x, y, z, w; };
struct alignas(8) int2 { int32_t x, y; };
struct alignas(16) int4 { int32_t x, y, z, w; };
struct alignas(8) float2 { float x, y; };
struct alignas(16) float4 { float x, y, z, w; };
inline uint2 make_uint2(uint32_t x, uint32_t y) { return {x, y}; }
inline uint4 make_uint4(uint32_t x, uint32_t y, uint32_t z, uint32_t w) { return {x, y, z, w}; }
inline int2 make_int2(int32_t x, int32_t y) { return {x, y}; }
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }

struct dim3 {
  uint32_t x, y, z;
  constexpr dim3(uint32_t x_ = 1, uint32_t y_ = 1, uint32_t z_ = 1) : x(x_), y(y_), z(z_) {}
};

// ---- device math the kernels call outside their NVIDIA-only branches ----
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __uint_as_float(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
inline uint32_t __float_as_uint(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

// ---- runtime API subset compat.h uses ----
typedef struct ihipStream_t* hipStream_t;
typedef enum hipError_t { hipSuccess = 0, hipErrorInvalidValue = 1, hipErrorLaunchFailure = 719 } hipError_t;
typedef enum hipDeviceAttribute_t {
  hipDeviceAttributeMultiprocessorCount,
  hipDeviceAttributeComputeCapabilityMajor,
  hipDeviceAttributeSharedMemPerBlockOptin
} hipDeviceAttribute_t;
typedef enum hipFuncAttribute { hipFuncAttributeMaxDynamicSharedMemorySize } hipFuncAttribute;

namespace mla_ext_simt {

constexpr int kWarp = MLA_EXT_SIMT_WARP;
constexpr size_t kStackBytes = size_t(256) << 10;
constexpr size_t kMaxDynamicSmem = size_t(64) << 10;  // what a CDNA3 work-group may use (LDS)

enum class Wait : uint8_t { kRun, kBlock, kWarp, kDone };

struct Fiber {
  ucontext_t ctx;
  dim3 tid;
  int linear = 0;
  Wait wait = Wait::kRun;
  uint32_t warp_ops = 0;  // warp collectives this thread has reached
  const char* site_file = nullptr;  // the source line of the collective it waits at
  int site_line = 0;
};

// Process-wide emulator state (tests are single-threaded; one launch at a time).
struct State {
  // settings (mla_ext_simt_configure)
  int order = 0;  // 0 forward, 1 reverse, 2 shuffled by `seed`
  uint32_t seed = 1;
  int num_cus = 8;
  // the block being run
  std::vector<Fiber> fibers;
  std::vector<char*> stacks;
  std::vector<int> warp_sequence, lane_sequence;  // the order warps, and lanes in a warp, run in
  ucontext_t scheduler;
  int current = -1;
  dim3 block_dim, grid_dim, block_idx;
  std::vector<uint64_t> slots[2];  // warp exchange buffers, one 64-bit value per thread
  unsigned char* dyn_smem = nullptr;  // the block's dynamic shared memory, a guard page after it
  size_t dyn_smem_bytes = 0;
  const std::function<void()>* body = nullptr;
  const void* scheduler_stack = nullptr;  // (AddressSanitizer) the launching thread's stack
  size_t scheduler_stack_bytes = 0;
  // bookkeeping
  hipError_t last_error = hipSuccess;
  std::string error;  // why the last failed launch failed
  uint64_t launches = 0, blocks = 0, switches = 0, warp_collectives = 0, barriers = 0;
  std::map<std::string, uint64_t> kernels;  // launches per kernel (its signature, template arguments included)
};

inline State& state() {
  static State s;
  return s;
}
inline Fiber& self() { return state().fibers[state().current]; }

// Fiber -> scheduler. `finished`: the fiber never runs again.
inline void switch_to_scheduler(Fiber& f, bool finished) {
  State& s = state();
  ++s.switches;
#if defined(MLA_EXT_SIMT_ASAN)
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(finished ? nullptr : &fake, s.scheduler_stack, s.scheduler_stack_bytes);
  swapcontext(&f.ctx, &s.scheduler);
  __sanitizer_finish_switch_fiber(fake, &s.scheduler_stack, &s.scheduler_stack_bytes);
#else
  (void)finished;
  swapcontext(&f.ctx, &s.scheduler);
#endif
}

// Scheduler -> fiber i.
inline void switch_to_fiber(int i) {
  State& s = state();
  s.current = i;
#if defined(MLA_EXT_SIMT_ASAN)
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(&fake, s.stacks[size_t(i)], kStackBytes);
  swapcontext(&s.scheduler, &s.fibers[size_t(i)].ctx);
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#else
  swapcontext(&s.scheduler, &s.fibers[size_t(i)].ctx);
#endif
}

inline void yield_to_scheduler() {
  State& s = state();
  switch_to_scheduler(s.fibers[s.current], false);
}

inline void fiber_entry() {
  State& s = state();
#if defined(MLA_EXT_SIMT_ASAN)
  __sanitizer_finish_switch_fiber(nullptr, &s.scheduler_stack, &s.scheduler_stack_bytes);
#endif
  (*s.body)();
  s.fibers[s.current].wait = Wait::kDone;
  switch_to_scheduler(s.fibers[s.current], true);
  abort();  // a finished fiber is never resumed
}

// Exchange one 64-bit value per lane across the warp: every lane of the warp must arrive.
// Returns the value lane `src` (in the warp) contributed.
// `file` / `line`: the collective's place in the source (every lane must wait at the same one).
template <typename SrcOf>
inline uint64_t warp_exchange(uint64_t mine, SrcOf&& src_of, const char* file, int line) {
  State& s = state();
  Fiber& f = s.fibers[s.current];
  const uint32_t parity = f.warp_ops & 1u;
  ++f.warp_ops;
  f.site_file = file;
  f.site_line = line;
  s.slots[parity][size_t(f.linear)] = mine;
  f.wait = Wait::kWarp;
  yield_to_scheduler();
  const int lane = f.linear % kWarp, base = f.linear - lane;
  const int src = src_of(lane);
  return s.slots[parity][size_t(base + src)];
}

}  // namespace mla_ext_simt

// ---- thread geometry ----
#define threadIdx (::mla_ext_simt::self().tid)
#define blockIdx (::mla_ext_simt::state().block_idx)
#define blockDim (::mla_ext_simt::state().block_dim)
#define gridDim (::mla_ext_simt::state().grid_dim)

inline void __syncthreads() {
  ::mla_ext_simt::State& s = ::mla_ext_simt::state();
  s.fibers[s.current].wait = ::mla_ext_simt::Wait::kBlock;
  ::mla_ext_simt::yield_to_scheduler();
}

namespace mla_ext_simt {
template <typename T>
inline uint64_t to_bits(T v) {
  static_assert(sizeof(T) <= 8, "warp exchange of values up to 8 bytes");
  uint64_t u = 0;
  memcpy(&u, &v, sizeof(T));
  return u;
}
template <typename T>
inline T from_bits(uint64_t u) {
  T v;
  memcpy(&v, &u, sizeof(T));
  return v;
}
}  // namespace mla_ext_simt

// HIP's semantics: the source lane is taken modulo the width (the whole warp here);
// __shfl_xor returns the caller's own value when lane ^ mask falls outside the warp. Macros, so
// that each call carries its place in the source (the lanes of a warp must meet at one).
namespace mla_ext_simt {
template <typename T>
inline T shfl_at(T v, int src_lane, const char* file, int line) {
  return from_bits<T>(
      warp_exchange(to_bits(v), [&](int) { return ((src_lane % kWarp) + kWarp) % kWarp; }, file, line));
}
template <typename T>
inline T shfl_xor_at(T v, int lane_mask, const char* file, int line) {
  return from_bits<T>(warp_exchange(
      to_bits(v),
      [&](int lane) {
        const int other = lane ^ lane_mask;
        return other >= 0 && other < kWarp ? other : lane;
      },
      file, line));
}
// Bit l of the result is lane l's predicate.
inline uint64_t ballot_at(int pred, const char* file, int line) {
  State& s = state();
  const int lane = self().linear % kWarp, base = self().linear - lane;
  const uint32_t parity = self().warp_ops & 1u;
  (void)warp_exchange(pred != 0 ? 1u : 0u, [](int l) { return l; }, file, line);
  uint64_t mask = 0;
  for (int l = 0; l < kWarp; ++l)
    if (s.slots[parity][size_t(base + l)] != 0) mask |= uint64_t(1) << l;
  return mask;
}
}  // namespace mla_ext_simt
#define __shfl(v, src_lane) ::mla_ext_simt::shfl_at((v), (src_lane), __FILE__, __LINE__)
#define __shfl_xor(v, lane_mask) ::mla_ext_simt::shfl_xor_at((v), (lane_mask), __FILE__, __LINE__)
#define __ballot(pred) ::mla_ext_simt::ballot_at((pred), __FILE__, __LINE__)

namespace mla_ext_simt {

inline void fail(hipError_t code, const std::string& why) {
  State& s = state();
  s.last_error = code;
  s.error = why;
}

// Releases warp w's lanes from the collective they all wait at; false (with the reason) when
// they do not all wait at the same one.
inline bool release_warp(int w, int lo, int hi, int at_warp, int barrier, int finished) {
  State& s = state();
  char why[400];
  if (hi - lo != kWarp) {
    snprintf(why, sizeof why, "block %u: a warp collective in a partial warp (%d threads)", s.block_idx.x, hi - lo);
    fail(hipErrorLaunchFailure, why);
    return false;
  }
  if (at_warp != hi - lo) {
    snprintf(why, sizeof why,
             "block %u warp %d: %d lanes at a shuffle/ballot, %d at a barrier, %d exited (divergent collective)",
             s.block_idx.x, w, at_warp, barrier, finished);
    fail(hipErrorLaunchFailure, why);
    return false;
  }
  const Fiber& f0 = s.fibers[size_t(lo)];
  for (int i = lo; i < hi; ++i) {
    const Fiber& f = s.fibers[size_t(i)];
    if (f.warp_ops != f0.warp_ops || f.site_line != f0.site_line || strcmp(f.site_file, f0.site_file) != 0) {
      snprintf(why, sizeof why,
               "block %u warp %d: lanes at different warp collectives (lane %d: #%u at %s:%d, lane 0: #%u at "
               "%s:%d; divergent collective)",
               s.block_idx.x, w, i - lo, f.warp_ops, f.site_file, f.site_line, f0.warp_ops, f0.site_file,
               f0.site_line);
      fail(hipErrorLaunchFailure, why);
      return false;
    }
  }
  for (int i = lo; i < hi; ++i) s.fibers[size_t(i)].wait = Wait::kRun;
  ++s.warp_collectives;
  return true;
}

// Runs the fibers of the current block to completion; false (with the reason in state().error)
// on a synchronisation error. Between two block barriers the warps run one after another in
// warp_sequence (each to its next barrier or its end, its collectives resolved as its lanes
// reach them), the lanes of a warp in lane_sequence between collectives: so reversing or
// shuffling the sequences reorders every pair of writes and reads that no barrier (or, inside a
// warp, no collective) separates.
inline bool run_block() {
  State& s = state();
  const int n = int(s.fibers.size());
  for (int i = 0; i < n; ++i) {
    Fiber& f = s.fibers[size_t(i)];
    f.wait = Wait::kRun;
    f.warp_ops = 0;
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = s.stacks[size_t(i)];
    f.ctx.uc_stack.ss_size = kStackBytes;
    f.ctx.uc_link = nullptr;
#if defined(MLA_EXT_SIMT_ASAN)
    ASAN_UNPOISON_MEMORY_REGION(s.stacks[size_t(i)], kStackBytes);  // left poisoned by an aborted block
#endif
    makecontext(&f.ctx, fiber_entry, 0);
  }
  for (;;) {
    for (int w : s.warp_sequence) {
      const int lo = w * kWarp, hi = std::min(n, lo + kWarp);
      for (;;) {
        for (int l : s.lane_sequence) {
          const int i = lo + l;
          if (i < hi && s.fibers[size_t(i)].wait == Wait::kRun) switch_to_fiber(i);
        }
        s.current = -1;
        int at_warp = 0, finished = 0, barrier = 0;
        for (int i = lo; i < hi; ++i) {
          const Wait x = s.fibers[size_t(i)].wait;
          at_warp += x == Wait::kWarp;
          finished += x == Wait::kDone;
          barrier += x == Wait::kBlock;
        }
        if (at_warp == 0) break;  // the warp is at the barrier or done
        if (!release_warp(w, lo, hi, at_warp, barrier, finished)) return false;
      }
    }
    int done = 0, at_block = 0;
    for (const Fiber& f : s.fibers) {
      done += f.wait == Wait::kDone;
      at_block += f.wait == Wait::kBlock;
    }
    if (done == n) return true;
    if (done > 0) {  // CUDA: a barrier in code that not every thread reaches is undefined
      fail(hipErrorLaunchFailure, "block " + std::to_string(s.block_idx.x) + ": " + std::to_string(at_block) +
                                      " threads wait at a barrier that " + std::to_string(done) +
                                      " exited threads never reached (divergent barrier)");
      return false;
    }
    for (auto& f : s.fibers) f.wait = Wait::kRun;
    ++s.barriers;
  }
}

// Places the launch's `bytes` of dynamic shared memory (rounded up to 16) so that they end where
// a PROT_NONE page begins: a kernel that reads or writes past them faults (SIGSEGV) instead of
// reading whatever follows.
inline bool reserve_dynamic_smem(size_t bytes) {
  State& s = state();
  static unsigned char* region = nullptr;
  constexpr size_t kPage = 4096, kRegion = kMaxDynamicSmem + kPage;
  if (region == nullptr) {
    void* p = mmap(nullptr, kRegion + kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return false;
    region = static_cast<unsigned char*>(p);
    mprotect(region + kRegion, kPage, PROT_NONE);
  }
  s.dyn_smem_bytes = (bytes + 15) & ~size_t(15);
  s.dyn_smem = region + kRegion - s.dyn_smem_bytes;
  return true;
}


// The library's static __shared__ variables (compat.h's MLA_EXT_SHARED registers each where it
// is declared, filled with 0xff bytes the first time), filled with 0xff bytes before each block
// as dynamic shared memory is: a block reads what it wrote, never a previous block's values.
inline std::map<void*, size_t>& shared_registry() {
  static std::map<void*, size_t> r;
  return r;
}
inline void register_shared(void* p, size_t bytes) {
  if (shared_registry().emplace(p, bytes).second) memset(p, 0xff, bytes);
}
inline void poison_static_smem() {
  for (const auto& v : shared_registry()) memset(v.first, 0xff, v.second);
}

// Runs `body` as a grid of `grid` blocks of `block` threads with `smem` bytes of dynamic
// shared memory.
inline hipError_t launch(dim3 grid, dim3 block, size_t smem, const std::function<void()>& body) {
  State& s = state();
  const int64_t n = int64_t(block.x) * block.y * block.z;
  if (n <= 0 || n > 1024 || smem > kMaxDynamicSmem || grid.x == 0 || grid.y == 0 || grid.z == 0) {
    fail(hipErrorInvalidValue, "launch: " + std::to_string(n) + " threads per block, " + std::to_string(smem) +
                                   " bytes of dynamic shared memory (at most 1024 and " +
                                   std::to_string(kMaxDynamicSmem) + ")");
    return hipErrorInvalidValue;
  }
  while (s.stacks.size() < size_t(n)) {
    void* p = mmap(nullptr, kStackBytes + 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) abort();
    mprotect(p, 4096, PROT_NONE);  // guard page below the stack
    s.stacks.push_back(static_cast<char*>(p) + 4096);
  }
  s.fibers.assign(size_t(n), Fiber());
  for (int64_t i = 0; i < n; ++i) {
    Fiber& f = s.fibers[size_t(i)];
    f.linear = int(i);
    f.tid = dim3(uint32_t(i % block.x), uint32_t((i / block.x) % block.y), uint32_t(i / (int64_t(block.x) * block.y)));
  }
  const int warps = int((n + kWarp - 1) / kWarp);
  s.warp_sequence.resize(size_t(warps));
  s.lane_sequence.resize(size_t(kWarp));
  for (int w = 0; w < warps; ++w) s.warp_sequence[size_t(w)] = s.order == 1 ? warps - 1 - w : w;
  for (int l = 0; l < kWarp; ++l) s.lane_sequence[size_t(l)] = s.order == 1 ? kWarp - 1 - l : l;
  std::mt19937 rng(s.seed);
  s.slots[0].assign(size_t(n), 0);
  s.slots[1].assign(size_t(n), 0);
  s.block_dim = block;
  s.grid_dim = grid;
  s.body = &body;
  if (!reserve_dynamic_smem(smem)) {
    fail(hipErrorInvalidValue, "launch: no memory for the dynamic shared memory");
    return hipErrorInvalidValue;
  }
  const uint64_t total = uint64_t(grid.x) * grid.y * grid.z;
  for (uint64_t k = 0; k < total; ++k) {
    const uint64_t b = s.order == 1 ? total - 1 - k : k;
    s.block_idx = dim3(uint32_t(b % grid.x), uint32_t((b / grid.x) % grid.y), uint32_t(b / (uint64_t(grid.x) * grid.y)));
    if (s.order == 2) {
      std::shuffle(s.warp_sequence.begin(), s.warp_sequence.end(), rng);
      std::shuffle(s.lane_sequence.begin(), s.lane_sequence.end(), rng);
    }
    memset(s.dyn_smem, 0xff, s.dyn_smem_bytes);
    poison_static_smem();
    ++s.blocks;
    if (!run_block()) return s.last_error;
  }
  ++s.launches;
  return hipSuccess;
}

// The block's dynamic shared memory (16-byte aligned).
inline unsigned char* dynamic_smem() { return state().dyn_smem; }

// A kernel's demangled name (from the shared library's symbol table), or its address.
inline std::string kernel_name(const void* fn) {
  Dl_info info;
  if (dladdr(fn, &info) != 0 && info.dli_sname != nullptr) {
    int st = 0;
    char* d = abi::__cxa_demangle(info.dli_sname, nullptr, nullptr, &st);
    std::string name = st == 0 && d != nullptr ? d : info.dli_sname;
    free(d);
    return name;
  }
  // (a symbol the dynamic table lacks: its offset in the library, for nm)
  char buf[48];
  snprintf(buf, sizeof buf, "+0x%lx", static_cast<unsigned long>(reinterpret_cast<uintptr_t>(fn) -
                                                              reinterpret_cast<uintptr_t>(info.dli_fbase)));
  return buf;
}

// compat.h's launch_kernel_ex in this runtime: the kernel called with its parameters.
template <typename... KArgs>
inline hipError_t launch_kernel(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem,
                                std::tuple<KArgs...>& params) {
  const std::function<void()> body = [&]() { std::apply(kernel, params); };
  const hipError_t e = launch(grid, block, smem, body);
  if (e == hipSuccess) ++state().kernels[kernel_name(reinterpret_cast<const void*>(kernel))];
  return e;
}

}  // namespace mla_ext_simt

inline hipError_t hipGetLastError() {
  const hipError_t e = ::mla_ext_simt::state().last_error;
  ::mla_ext_simt::state().last_error = hipSuccess;
  return e;
}
inline const char* hipGetErrorString(hipError_t e) {
  return e == hipSuccess ? "no error" : ::mla_ext_simt::state().error.c_str();
}
inline hipError_t hipGetDevice(int* dev) {
  *dev = 0;
  return hipSuccess;
}
inline hipError_t hipDeviceGetAttribute(int* v, hipDeviceAttribute_t attr, int) {
  switch (attr) {
    case hipDeviceAttributeMultiprocessorCount: *v = ::mla_ext_simt::state().num_cus; break;
    // gfx942 reports 9 (gfx9); the 32-lane emulation reports 7 so that no tensor-core kernel is picked
    case hipDeviceAttributeComputeCapabilityMajor: *v = MLA_EXT_SIMT_WARP == 64 ? 9 : 7; break;
    case hipDeviceAttributeSharedMemPerBlockOptin: *v = int(::mla_ext_simt::kMaxDynamicSmem); break;
  }
  return hipSuccess;
}
inline hipError_t hipFuncSetAttribute(const void*, hipFuncAttribute, int bytes) {
  return size_t(bytes) <= ::mla_ext_simt::kMaxDynamicSmem ? hipSuccess : hipErrorInvalidValue;
}

// Settings and counters, for the tests (ctypes).
extern "C" {
// order: 0 threads and blocks in index order, 1 reversed, 2 threads shuffled by `seed`;
// num_cus: the processor count the launchers see (> 0).
__attribute__((used, visibility("default"))) inline void mla_ext_simt_configure(int order, unsigned seed, int num_cus) {
  ::mla_ext_simt::State& s = ::mla_ext_simt::state();
  s.order = order;
  s.seed = seed;
  if (num_cus > 0) s.num_cus = num_cus;
}
__attribute__((used, visibility("default"))) inline const char* mla_ext_simt_last_error() {
  return ::mla_ext_simt::state().error.c_str();
}
__attribute__((used, visibility("default"))) inline int mla_ext_simt_warp_size() { return MLA_EXT_SIMT_WARP; }
// The kernels launched so far, one "count signature" line each, into buf (NUL-terminated,
// truncated to n bytes); returns the bytes the whole list needs.
__attribute__((used, visibility("default"))) inline size_t mla_ext_simt_kernels(char* buf, size_t n) {
  std::string all;
  for (const auto& k : ::mla_ext_simt::state().kernels) all += std::to_string(k.second) + " " + k.first + "\n";
  if (n > 0) {
    const size_t m = std::min(n - 1, all.size());
    memcpy(buf, all.data(), m);
    buf[m] = 0;
  }
  return all.size() + 1;
}
// counters[0..4]: launches, blocks, fiber switches, warp collectives, block barriers.
__attribute__((used, visibility("default"))) inline void mla_ext_simt_counters(unsigned long long* c) {
  const ::mla_ext_simt::State& s = ::mla_ext_simt::state();
  c[0] = s.launches;
  c[1] = s.blocks;
  c[2] = s.switches;
  c[3] = s.warp_collectives;
  c[4] = s.barriers;
}
}
