// The definitions dataset.hpp declares with DTRAIN_DECL: included at the
// end of the header when DTRAIN_DEFINE_IMPL (core/macros.hpp), so they are
// compiled into every user translation unit (header-only) or once, into
// dtrain::runtime (separate compilation).
#pragma once

#include "dtrain/data/dataset.hpp"

DTRAIN_IMPL_BEGIN  // header-only: -O1 (core/macros.hpp)

    namespace dtrain {
  DTRAIN_DECL auto Dataset::gather(std::span<const std::int64_t> indices) const->Batch {
    if (static_cast<std::int64_t>(x.size()) != rows * features || static_cast<std::int64_t>(y.size()) != rows)
      throw config_error("the dataset's x/y sizes do not match its rows and features",
                         "call dataset.validate(num_classes) after building it");
    const auto f = static_cast<std::size_t>(features);
    std::vector<float> bx(indices.size() * f);
    std::vector<std::int32_t> by(indices.size());
    for (std::size_t i = 0; i < indices.size(); ++i) {
      const auto row = static_cast<std::size_t>(indices[i]);
      std::copy_n(x.begin() + static_cast<std::ptrdiff_t>(row * f), f, bx.begin() + static_cast<std::ptrdiff_t>(i * f));
      by[i] = y[row];
    }
    return Batch::table(bx, by, static_cast<std::int64_t>(indices.size()), features);
  }

  DTRAIN_DECL auto Dataset::validate(std::int64_t num_classes) const->void {
    const std::string fix = "check how the dataset was built or exported";
    if (rows < 1 || features < 1)
      throw config_error(
          "dataset is empty: " + std::to_string(rows) + " rows of " + std::to_string(features) + " features", fix);
    if (static_cast<std::int64_t>(x.size()) != rows * features)
      throw config_error("dataset has " + std::to_string(x.size()) + " feature values, expected rows * features = " +
                             std::to_string(rows) + " * " + std::to_string(features),
                         fix);
    if (static_cast<std::int64_t>(y.size()) != rows)
      throw config_error("dataset has " + std::to_string(y.size()) + " labels for " + std::to_string(rows) + " rows",
                         fix);
    if (num_classes < 1)
      throw config_error("dataset validated against " + std::to_string(num_classes) + " classes",
                         "pass the model's number of classes (at least 1)");
    for (std::size_t i = 0; i < x.size(); ++i)
      if (!std::isfinite(x[i]))
        throw config_error("dataset row " + std::to_string(i / static_cast<std::size_t>(features)) + ", feature " +
                               std::to_string(i % static_cast<std::size_t>(features)) + " is " + std::to_string(x[i]),
                           fix);
    for (std::size_t r = 0; r < y.size(); ++r)
      if (y[r] < 0 || y[r] >= num_classes)
        throw config_error("dataset row " + std::to_string(r) + " has label " + std::to_string(y[r]) +
                               ", outside [0, " + std::to_string(num_classes) + ")",
                           "labels must be class indices 0 .. num_classes - 1; " + fix);
  }
}  // namespace dtrain

namespace dtrain {

namespace detail {

DTRAIN_DECL Dataset assemble_dataset(std::vector<float> x, std::span<const std::int64_t> x_shape,
                                     std::vector<std::int32_t> y, std::span<const std::int64_t> y_shape,
                                     const std::string& source) {
  if (x_shape.size() != 2)
    throw config_error(source + ": features x have shape " + shape_text(x_shape) + ", expected [rows, features]",
                       "store x as a 2-D array");
  if (y_shape.size() != 1)
    throw config_error(source + ": labels y have shape " + shape_text(y_shape) + ", expected [rows]",
                       "store y as a 1-D array of class indices");
  if (x_shape[0] != y_shape[0])
    throw config_error(
        source + ": x has " + std::to_string(x_shape[0]) + " rows but y has " + std::to_string(y_shape[0]) + " labels",
        "x and y must describe the same rows");
  Dataset d;
  d.x = std::move(x);
  d.y = std::move(y);
  d.rows = x_shape[0];
  d.features = x_shape[1];
  return d;
}

DTRAIN_DECL std::vector<float> npy_features(const NpyArray& a, const std::string& source) {
  if (a.descr == "<f4") return decode_to_float<float>(a.data, [](float v) { return v; });
  if (a.descr == "<f8") return decode_to_float<double>(a.data, [](double v) { return static_cast<float>(v); });
  throw config_error(source + ": features have integer dtype '" + a.descr + "'",
                     "save the features as float32 or float64");
}

DTRAIN_DECL std::vector<std::int32_t> npy_labels(const NpyArray& a, const std::string& source) {
  if (a.descr == "<i4") return narrow_labels<std::int32_t>(a.data, source);
  if (a.descr == "<i8") return narrow_labels<std::int64_t>(a.data, source);
  throw config_error(source + ": labels have float dtype '" + a.descr + "'",
                     "save the labels as int32 or int64 class indices");
}
}  // namespace detail
}  // namespace dtrain

namespace dtrain {

DTRAIN_DECL Dataset load_npy_dataset(const std::filesystem::path& x_path, const std::filesystem::path& y_path) {
  const std::string x_source = detail::quoted_path(x_path);
  const std::string y_source = detail::quoted_path(y_path);
  const auto xa = detail::read_npy(x_path);
  auto x = detail::npy_features(xa, x_source);
  const auto ya = detail::read_npy(y_path);
  auto y = detail::npy_labels(ya, y_source);
  return detail::assemble_dataset(std::move(x), xa.shape, std::move(y), ya.shape, x_source + " and " + y_source);
}

DTRAIN_DECL Dataset load_safetensors_dataset(const std::filesystem::path& path) {
  const auto file = SafetensorsFile::open(path);
  const auto source = detail::quoted_path(path);
  if (!file.contains("x") || !file.contains("y"))
    throw config_error(source + " lacks tensor 'x' or 'y'",
                       "store features as 'x' [rows, features] and labels as 'y' [rows]");
  const auto x = file.tensor("x");
  const auto y = file.tensor("y");
  const bool float_x = x.dtype == element_type::f32 || x.dtype == element_type::f64 || x.dtype == element_type::f16 ||
                       x.dtype == element_type::bf16;
  if (!float_x)
    throw config_error(source + ": features 'x' have dtype " + std::string(safetensors_name(x.dtype)),
                       "store x as F32, F64, F16 or BF16");
  std::vector<std::int32_t> labels;
  if (y.dtype == element_type::i32)
    labels = detail::narrow_labels<std::int32_t>(y.bytes, source);
  else if (y.dtype == element_type::i64)
    labels = detail::narrow_labels<std::int64_t>(y.bytes, source);
  else
    throw config_error(source + ": labels 'y' have dtype " + std::string(safetensors_name(y.dtype)),
                       "store y as I32 or I64 class indices");
  return detail::assemble_dataset(file.read_f32("x"), x.shape, std::move(labels), y.shape, source);
}
}  // namespace dtrain
DTRAIN_IMPL_END
