#pragma once
// Counter-based random numbers: a value is a pure function of a 64-bit
// stream and an index, so the host and the GPU, a recomputed forward and a
// resumed run all draw the same numbers, in any order, without state.

#include <cstdint>

#include "dtrain/core/macros.hpp"

namespace dtrain::detail {

// splitmix64 (Steele, Lea, Flood 2014): a 64-bit counter passed through a
// fixed mixing function. Tiny, fast, fully specified by these few lines.
DTRAIN_HOST_DEVICE inline std::uint64_t splitmix64_mix(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// A stream derived from a parent stream and a key (a rank, a step, a part).
DTRAIN_HOST_DEVICE inline std::uint64_t derive_stream(std::uint64_t parent, std::uint64_t key) {
  return splitmix64_mix(parent ^ splitmix64_mix(key + 0x9e3779b97f4a7c15ull));
}

// Uniform in [0, 1) with 24 random bits (every value exact in float).
DTRAIN_HOST_DEVICE inline float uniform01(std::uint64_t stream, std::uint64_t index) {
  return static_cast<float>(derive_stream(stream, index) >> 40) * (1.f / 16777216.f);
}

}  // namespace dtrain::detail
