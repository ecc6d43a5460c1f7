#pragma once
// What the reliability tests share: a run's final parameters (the
// save_params= file of train_mlp) read back byte for byte, the wall clock
// the library stamps its fault-injection lines with, the run count and the
// seeded random draws of the fault harnesses.

#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <dtrain/io/safetensors.hpp>

namespace dtrain::test {

using Params = std::map<std::string, std::vector<std::byte>>;

inline Params read_params(const std::filesystem::path& file) {
  const auto f = dtrain::SafetensorsFile::open(file);
  Params out;
  for (const auto& name : f.names()) {
    const auto t = f.tensor(name);
    out[name].assign(t.bytes.begin(), t.bytes.end());
  }
  return out;
}

inline double wall_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// An integer from the environment (DTRAIN_FAULT_RUNS), `fallback` when unset.
inline int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

// The harness's random draws: seeded from DTRAIN_FAULT_SEED, else at random
// (printed, so a failing draw can be repeated).
inline std::mt19937_64& rng() {
  static std::mt19937_64 g([] {
    const char* v = std::getenv("DTRAIN_FAULT_SEED");
    const unsigned long long seed = v && *v ? std::strtoull(v, nullptr, 10) : std::random_device{}();
    std::printf("fault harness seed: %llu (DTRAIN_FAULT_SEED=%llu reproduces this draw)\n", seed, seed);
    return seed;
  }());
  return g;
}

}  // namespace dtrain::test
