// Bit-level number conversions shared by the GPU kernels and the CPU twins.
//
// Plain C++17 when compiled by a host compiler; __host__ __device__ under nvcc
// or hipcc. No platform types (no __nv_bfloat16 / __hip_bfloat16): bf16 and
// fp16 travel as uint16_t bits, so the CPU code and every GPU toolchain (Debian's
// hipcc 5.2 included) compile the same functions and round the same way.
#pragma once

#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__HIPCC__)
#include <hip/hip_runtime.h>  // __forceinline__, __uint_as_float under hipcc
#endif

#if defined(__CUDACC__) || defined(__HIPCC__)
#define MLA_EXT_HD __host__ __device__ __forceinline__
#else
#define MLA_EXT_HD inline
#endif
// Loop hint in code shared with the CPU twins: device passes only (a host compiler warns about an
// unknown pragma under -Wall).
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
#define MLA_EXT_UNROLL4 _Pragma("unroll 4")
#else
#define MLA_EXT_UNROLL4
#endif

namespace mla_ext {

MLA_EXT_HD float bits_to_float(uint32_t u) {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
  return __uint_as_float(u);
#else
  float f;
  memcpy(&f, &u, 4);
  return f;
#endif
}

MLA_EXT_HD uint32_t float_to_bits(float f) {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
  return __float_as_uint(f);
#else
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
#endif
}

MLA_EXT_HD float neg_inf() { return bits_to_float(0xff800000u); }
MLA_EXT_HD float pos_inf() { return bits_to_float(0x7f800000u); }
MLA_EXT_HD float quiet_nan() { return bits_to_float(0x7fc00000u); }
MLA_EXT_HD bool is_nan(float x) { return x != x; }

// ---- bf16 (bits) ----
MLA_EXT_HD float bf16_to_float(uint16_t h) { return bits_to_float(uint32_t(h) << 16); }

// Round to nearest even; NaN stays a quiet NaN. One instruction on sm_80+.
MLA_EXT_HD uint16_t float_to_bf16(float f) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 800)
  uint16_t h;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
#endif
  uint32_t u = float_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

// Two floats rounded to bf16 (nearest even) in one 32-bit word, lo in the low
// half. One instruction on sm_80+.
MLA_EXT_HD uint32_t pack_bf16x2(float lo, float hi) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 800)
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
#else
  return uint32_t(float_to_bf16(lo)) | (uint32_t(float_to_bf16(hi)) << 16);
#endif
}

// exp/log for LSE arithmetic: the hardware approximations on the GPU (a few
// ulp; memory-bound kernels cannot afford the accurate software sequences),
// the C library on the host.
MLA_EXT_HD float fast_exp(float x) {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
  return __expf(x);
#else
  return expf(x);
#endif
}

MLA_EXT_HD float fast_log(float x) {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
  return __logf(x);
#else
  return logf(x);
#endif
}

// ---- fp16 (bits), IEEE binary16 ----
MLA_EXT_HD float fp16_to_float(uint16_t h) {
#if defined(__CUDA_ARCH__)
  float f;  // exact (every fp16 value is an fp32 value)
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
#endif
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  if (exp == 0x1fu) return bits_to_float(sign | 0x7f800000u | (man << 13));  // inf / NaN
  if (exp == 0) {
    // zero or subnormal: man * 2^-24, exact in fp32
    float v = float(man) * bits_to_float(0x33800000u);  // 2^-24
    return sign ? -v : v;
  }
  return bits_to_float(sign | ((exp + 112u) << 23) | (man << 13));
}

// Round to nearest even, overflow to inf, NaN stays NaN.
MLA_EXT_HD uint16_t float_to_fp16(float f) {
#if defined(__CUDA_ARCH__)
  uint16_t h;  // the same rounding in one instruction (NaN: a quiet NaN)
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
#endif
  uint32_t u = float_to_bits(f);
  uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return uint16_t(sign | 0x7e00u);
  if (a >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // rounds to >= 65520 -> inf
  if (a < 0x38800000u) {
    // result is subnormal (or zero) in fp16: value / 2^-24, rounded to nearest even
    if (a < 0x33000000u) return sign;  // < 2^-25: rounds to zero
    uint32_t exp = a >> 23;
    uint32_t man = (a & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126u - exp;  // 14..24 + ... such that result = man >> (shift)
    uint32_t r = man >> shift;
    uint32_t rem = man & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (r & 1u))) r += 1u;
    return uint16_t(sign | r);
  }
  uint32_t r = a - 0x38000000u;  // rebias exponent 127 -> 15
  r += 0xfffu + ((r >> 13) & 1u);
  return uint16_t(sign | (r >> 13));
}

// ---- FP8 e4m3fn (OCP: NVIDIA, gfx950) ----
// Exponent bias 7, no infinities, S.1111.111 is NaN. Decoded exactly into fp32.
MLA_EXT_HD float fp8_e4m3fn_to_float(uint8_t b) {
  if ((b & 0x7fu) == 0x7fu) return quiet_nan();
  // Place E and M under the fp32 exponent/mantissa fields, then rescale by 2^(127-7).
  // E == 0 lands on fp32 subnormals, which is exactly e4m3's subnormal range scaled.
  uint32_t u = (uint32_t(b & 0x80u) << 24) | (uint32_t(b & 0x7fu) << 20);
  return bits_to_float(u) * 1.329227995784916e36f;  // 2^120
}

// ---- FP8 e4m3fnuz (gfx942 / MI300 engines) ----
// Exponent bias 8, no infinities, no negative zero: 0x80 is the only NaN and
// 0x7f / 0xff are +-240 (the largest magnitude). Same bit placement as above,
// one exponent lower: the same bits mean half the e4m3fn value.
MLA_EXT_HD float fp8_e4m3fnuz_to_float(uint8_t b) {
  if (b == 0x80u) return quiet_nan();
  uint32_t u = (uint32_t(b & 0x80u) << 24) | (uint32_t(b & 0x7fu) << 20);
  return bits_to_float(u) * 6.646139978924579e35f;  // 2^119
}

// ---- FP8 e4m3 encoders (saturating), for scaled FP8 outputs ----
// Round to nearest even; |x| at or above the format's max (448 for OCP e4m3fn,
// 240 for e4m3fnuz) and +-inf saturate to +-max; NaN gives the format's NaN.
// FNUZ (gfx942): exponent bias 8, no negative zero (0x80 is its only NaN), so
// a negative value that rounds to zero is stored as +0. e4m3fn keeps the sign
// of zero (0x80 = -0) like torch's conversion.
template <bool FNUZ>
MLA_EXT_HD uint8_t float_to_fp8_e4m3_sat(float f) {
  constexpr uint32_t kBias = FNUZ ? 8u : 7u;
  constexpr uint32_t kMaxCode = FNUZ ? 0x7fu : 0x7eu;   // 240 / 448
  constexpr uint32_t kMaxBits = FNUZ ? 0x43700000u : 0x43e00000u;  // 240.f / 448.f
  constexpr uint32_t kNaN = FNUZ ? 0x80u : 0x7fu;
  const uint32_t u = float_to_bits(f);
  const uint32_t sign = (u >> 24) & 0x80u;
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return uint8_t(kNaN);
  if (a >= kMaxBits) return uint8_t(sign | kMaxCode);
  // Smallest normal: 2^(1 - bias). Below it the value is a multiple of the
  // subnormal unit 2^(-bias - 2): code = round(|x| / unit).
  constexpr uint32_t kMinNormalExp = 127u + 1u - kBias;  // biased fp32 exponent
  uint32_t code;
  if ((a >> 23) < kMinNormalExp) {
    const uint32_t exp = a >> 23;
    if (exp == 0) {
      code = 0;  // fp32 zero or subnormal: far below half a unit
    } else {
      // |x| = man * 2^(exp - 150); unit = 2^(-bias - 2); shift = 150 - exp - bias - 2 (>= 21)
      const uint32_t man = (a & 0x7fffffu) | 0x800000u;
      const uint32_t shift = 148u - kBias - exp;
      if (shift > 24u) {
        code = 0;  // |x| < unit / 2
      } else {
        code = man >> shift;
        const uint32_t rem = man & ((1u << shift) - 1u);
        const uint32_t half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (code & 1u))) code += 1u;
      }
    }
  } else {
    // Keep 3 mantissa bits with round to nearest even, then rebias the exponent.
    const uint32_t r = a + 0x7ffffu + ((a >> 20) & 1u);
    code = (r >> 20) - ((127u - kBias) << 3);
    if (code > kMaxCode) code = kMaxCode;
  }
  if (FNUZ && code == 0) return 0;
  return uint8_t(sign | code);
}

MLA_EXT_HD uint8_t float_to_fp8_e4m3fn_sat(float f) { return float_to_fp8_e4m3_sat<false>(f); }
MLA_EXT_HD uint8_t float_to_fp8_e4m3fnuz_sat(float f) { return float_to_fp8_e4m3_sat<true>(f); }

// ---- UE8M0 (unsigned 8-bit exponent scale, DeepSeek V4) ----
// b means 2^(b-127); b == 0 is 2^-127 (an fp32 subnormal), b == 255 is NaN.
// Branch-free: b << 23 is right for 1..254; bit 22 turns b == 0 into 2^-127 and b == 255's
// infinity into quiet_nan()'s bits. (The branches it replaces made the GPU tiles' per-scale
// conversion a divergent region each, which the compiler schedules nothing across.)
MLA_EXT_HD float ue8m0_to_float(uint8_t b) {
  const uint32_t u = b;
  return bits_to_float((u << 23) | (((u + 1u) & 0xffu) <= 1u ? (1u << 22) : 0u));
}

}  // namespace mla_ext
