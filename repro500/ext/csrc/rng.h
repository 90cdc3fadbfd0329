// Counter-based random numbers shared by the CPU and CUDA kernels.
//
// The draw for element i is splitmix64's output for the counter (seed, i):
//     key = mix64(seed);  h = mix64(key + (i + 1) * 0x9E3779B97F4A7C15);  u = (h >> 40) / 2^24
// so it does not depend on threads, blocks or devices, and the pure-PyTorch reference
// (repro500/ext/reference.py) reproduces it bit for bit.  mix64 is the splitmix64 finaliser
// (Steele, Lea & Flood, OOPSLA 2014).
#pragma once
#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define REPRO500_HD __host__ __device__ __forceinline__
#else
#define REPRO500_HD inline
#endif

namespace repro500 {

constexpr uint64_t kGoldenGamma = 0x9E3779B97F4A7C15ULL;

REPRO500_HD uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// Uniform in [0, 1) with 24 random bits (exact in float32).
REPRO500_HD float uniform01(uint64_t seed_key, uint64_t index) {
  const uint64_t h = mix64(seed_key + (index + 1) * kGoldenGamma);
  return static_cast<float>(h >> 40) * (1.0f / 16777216.0f);
}

// Stochastic rounding of one element, shared by both devices so they agree exactly:
// l = |x| * factor with factor = levels / scale (float32, once per bucket),
// q = floor(l) + [u < frac(l)], clamped to levels; a NaN gives 0 (the NaN scale propagates).
REPRO500_HD int stochastic_level(float magnitude, float factor, int levels, float u) {
  const float l = magnitude * factor;
  if (!(l >= 0.0f)) return 0;
  if (l >= static_cast<float>(levels)) return levels;  // also catches +inf
  // 0 <= l < levels: truncation is floor (and, unlike floorf, needs no libm call on x86-64).
  const int fl = static_cast<int>(l);
  return fl + static_cast<int>(u < (l - static_cast<float>(fl)));
}

}  // namespace repro500
