// Shared by the dev probes in this folder (not part of the library).
#pragma once

#include <cstddef>
#include <cstdint>

// Pseudo-random fill (hash of the index): bf16 values in about [-2, 2], fp32 LSEs in [-4, 4], so
// the data is like the benchmark's torch.randn inputs rather than a constant pattern.
__global__ void fill_random(uint16_t* v, size_t n, float* l, size_t nl, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t x = uint32_t(i) * 2654435761u ^ seed;
    x ^= x >> 15; x *= 2246822519u; x ^= x >> 13;
    const float f = (float(x & 0xffffff) / float(1 << 24)) * 4.f - 2.f;
    v[i] = uint16_t(__float_as_uint(f) >> 16);
    if (i < nl) l[i] = f * 2.f;
  }
}
