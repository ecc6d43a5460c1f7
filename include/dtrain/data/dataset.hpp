#pragma once
// An in-memory classification dataset (features x, integer labels y) and its
// loaders for NumPy .npy files and safetensors files (the formats themselves
// are io/'s).
//
// Files are read as little-endian; dtrain targets little-endian hosts only.

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dtrain/core/error.hpp"
#include "dtrain/core/macros.hpp"
#include "dtrain/core/tensor.hpp"
#include "dtrain/io/files.hpp"
#include "dtrain/io/npy.hpp"
#include "dtrain/io/safetensors.hpp"

namespace dtrain {

static_assert(std::endian::native == std::endian::little, "dtrain reads and writes little-endian files");

// Row-major features [rows, features] and one label per row.
struct Dataset {
  std::vector<float> x;
  std::vector<std::int32_t> y;
  std::int64_t rows = 0;
  std::int64_t features = 0;

  std::int64_t size() const { return rows; }

  // The rows `indices` as a batch: "x" [n, features] and "y" [n].
  DTRAIN_DECL Batch gather(std::span<const std::int64_t> indices) const;

  // Throws config_error naming the first problem: inconsistent sizes, a
  // non-finite feature or a label outside [0, num_classes).
  DTRAIN_DECL void validate(std::int64_t num_classes) const;
};

namespace detail {

// Labels stored as int32 or int64, narrowed to int32; `source` names the file
// in the error for the first label that does not fit.
template <class I>
std::vector<std::int32_t> narrow_labels(std::span<const std::byte> bytes, const std::string& source) {
  std::vector<std::int32_t> out(bytes.size() / sizeof(I));
  for (std::size_t r = 0; r < out.size(); ++r) {
    const I v = load_element<I>(bytes, r);
    if (v < std::numeric_limits<std::int32_t>::min() || v > std::numeric_limits<std::int32_t>::max())
      throw config_error(
          source + ": label " + std::to_string(v) + " at row " + std::to_string(r) + " does not fit in int32",
          "labels must be class indices");
    out[r] = static_cast<std::int32_t>(v);
  }
  return out;
}

// x must be [N, F] and y [N]; returns the dataset with those sizes.
DTRAIN_DECL Dataset assemble_dataset(std::vector<float> x, std::span<const std::int64_t> x_shape,
                                     std::vector<std::int32_t> y, std::span<const std::int64_t> y_shape,
                                     const std::string& source);

DTRAIN_DECL std::vector<float> npy_features(const NpyArray& a, const std::string& source);

DTRAIN_DECL std::vector<std::int32_t> npy_labels(const NpyArray& a, const std::string& source);

}  // namespace detail

// Features from a 2-D float32/float64 .npy file, labels from a 1-D
// int32/int64 one (both little-endian, C order). Throws config_error naming
// the file and the problem.
DTRAIN_DECL Dataset load_npy_dataset(const std::filesystem::path& x_path, const std::filesystem::path& y_path);

// A dataset stored as safetensors: "x" [rows, features] in F32, F64, F16 or
// BF16 (converted to float) and "y" [rows] in I32 or I64. Throws
// checkpoint_error for a damaged file and config_error for missing tensors,
// wrong shapes or dtypes.
DTRAIN_DECL Dataset load_safetensors_dataset(const std::filesystem::path& path);

}  // namespace dtrain

#if DTRAIN_DEFINE_IMPL
#include "dtrain/data/dataset.ipp"
#endif
