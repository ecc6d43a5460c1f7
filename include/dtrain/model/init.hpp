#pragma once
// Deterministic parameter initialisation. The generator is written out here
// (splitmix64 + Box-Muller) rather than taken from <random>, whose
// distributions differ between standard libraries: the same seed must give
// the same weights with every compiler, so runs are reproducible anywhere.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <span>
#include <string>

#include "dtrain/core/error.hpp"
#include "dtrain/model/layout.hpp"
#include "dtrain/model/param.hpp"

namespace dtrain {

class SplitMix64 {
 public:
  explicit SplitMix64(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next() {
    std::uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

 private:
  std::uint64_t state_;
};

// Fills `out` according to `init`; the stream depends only on `seed`.
inline void init_values(std::span<float> out, const Init& init, std::uint64_t seed) {
  SplitMix64 rng(seed);
  switch (init.kind) {
    case init_kind::zeros:
      for (auto& x : out) x = 0.f;
      break;
    case init_kind::ones:
      for (auto& x : out) x = 1.f;
      break;
    case init_kind::constant:
      for (auto& x : out) x = init.a;
      break;
    case init_kind::uniform:
      for (auto& x : out) x = static_cast<float>(init.a + (init.b - init.a) * rng.uniform());
      break;
    case init_kind::given:
      if (init.values == nullptr || init.values->size() != out.size())
        throw config_error("a parameter's given initial values hold " +
                               std::to_string(init.values == nullptr ? 0 : init.values->size()) + " elements for " +
                               std::to_string(out.size()),
                           "give Init::given exactly numel() values");
      std::copy(init.values->begin(), init.values->end(), out.begin());
      break;
    case init_kind::normal:
      for (auto& x : out) {
        const double u1 = 1.0 - rng.uniform();  // (0, 1]: log is finite
        const double u2 = rng.uniform();
        x = static_cast<float>(init.a +
                               init.b * std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2));
      }
      break;
  }
}

// The seed of one parameter: distinct per (model seed, unit, parameter).
constexpr std::uint64_t param_seed(std::uint64_t seed, std::size_t unit, std::size_t index) {
  return seed * 0x100000001b3ull ^ (static_cast<std::uint64_t>(unit) << 20) ^ static_cast<std::uint64_t>(index);
}

// A unit's initial values: its trainable segment into `train` and its frozen
// segment into `frozen` (each the padded size; padding is zero). Every rank
// computes the same values from the same seed, one unit at a time, so a
// sharded strategy never holds more than one unit's full values.
inline void init_unit_values(const UnitSlots& unit, std::uint64_t seed, std::span<float> train,
                             std::span<float> frozen) {
  std::fill(train.begin(), train.end(), 0.f);
  std::fill(frozen.begin(), frozen.end(), 0.f);
  for (const auto& slot : unit.params) {
    const auto n = static_cast<std::size_t>(slot.spec.numel());
    auto dst = slot.spec.trainable ? train.subspan(slot.offset - unit.train_offset, n)
                                   : frozen.subspan(slot.offset - unit.frozen_offset, n);
    init_values(dst, slot.spec.init, param_seed(seed, slot.unit, slot.index));
  }
}

}  // namespace dtrain
