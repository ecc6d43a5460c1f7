#pragma once
// Shared by the data tests: the values make_fixtures.py wrote into
// fixtures/, a scratch directory, and raw file helpers.

#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace dtrain_test {

inline constexpr std::int64_t fixture_rows = 7;
inline constexpr std::int64_t fixture_features = 3;
inline constexpr std::int64_t fixture_classes = 4;

// Same formulas as make_fixtures.py; every value is exact in fp16 and bf16.
inline float fixture_feature(std::int64_t i, std::int64_t j) {
  return static_cast<float>(((i * 31 + j * 17) % 23) - 11.5) * 0.125f;
}
inline std::int32_t fixture_label(std::int64_t i) { return static_cast<std::int32_t>((i * 5 + 1) % fixture_classes); }

inline std::vector<float> fixture_x() {
  std::vector<float> x;
  for (std::int64_t i = 0; i < fixture_rows; ++i)
    for (std::int64_t j = 0; j < fixture_features; ++j) x.push_back(fixture_feature(i, j));
  return x;
}
inline std::vector<std::int32_t> fixture_y() {
  std::vector<std::int32_t> y;
  for (std::int64_t i = 0; i < fixture_rows; ++i) y.push_back(fixture_label(i));
  return y;
}

inline std::filesystem::path fixture(const std::string& name) {
  return std::filesystem::path(DTRAIN_SOURCE_DIR) / "tests/data/fixtures" / name;
}

// A fresh directory per test, removed afterwards; unique per process and
// instance so parallel test runs never share files.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    path_ = std::filesystem::temp_directory_path() /
            ("dtrain-data-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

inline std::vector<char> read_bytes(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

inline void write_bytes(const std::filesystem::path& p, const std::vector<char>& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

template <class T>
void append_le(std::vector<char>& out, T v) {
  const auto* p = reinterpret_cast<const char*>(&v);
  out.insert(out.end(), p, p + sizeof v);
}

}  // namespace dtrain_test
