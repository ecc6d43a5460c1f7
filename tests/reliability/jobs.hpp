#pragma once
// What the reliability tests share: a run's final parameters (the
// save_params= file of train_mlp) read back byte for byte, and the wall clock
// the library stamps its fault-injection lines with.

#include <dtrain/checkpoint/safetensors.hpp>

#include <chrono>
#include <cstddef>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

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

}  // namespace dtrain::test
