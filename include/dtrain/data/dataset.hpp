#pragma once
// An in-memory classification dataset (features x, integer labels y) and its
// loader for NumPy .npy files. The safetensors loader lives beside the format
// in checkpoint/safetensors.hpp (layers only include downward).
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
#include "dtrain/core/tensor.hpp"

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
  Batch gather(std::span<const std::int64_t> indices) const {
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

  // Throws config_error naming the first problem: inconsistent sizes, a
  // non-finite feature or a label outside [0, num_classes).
  void validate(std::int64_t num_classes) const {
    const std::string fix = "check how the dataset was built or exported";
    if (rows < 1 || features < 1)
      throw config_error("dataset is empty: " + std::to_string(rows) + " rows of " + std::to_string(features) +
                             " features",
                         fix);
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
                               std::to_string(i % static_cast<std::size_t>(features)) + " is " +
                               std::to_string(x[i]),
                           fix);
    for (std::size_t r = 0; r < y.size(); ++r)
      if (y[r] < 0 || y[r] >= num_classes)
        throw config_error("dataset row " + std::to_string(r) + " has label " + std::to_string(y[r]) +
                               ", outside [0, " + std::to_string(num_classes) + ")",
                           "labels must be class indices 0 .. num_classes - 1; " + fix);
  }
};

namespace detail {

// 'path', for messages. Built by appending: GCC 12 reports a bogus
// -Wrestrict for "'" + p.string() + "'" at -O2 (GCC bug 105329).
inline std::string quoted_path(const std::filesystem::path& p) {
  std::string s(1, '\'');
  s += p.native();
  s += '\'';
  return s;
}

// Element i of a little-endian array of T in bytes that may be unaligned
// (safetensors and .npy only promise byte alignment).
template <class T>
T load_element(std::span<const std::byte> bytes, std::size_t i) {
  T v;
  std::memcpy(&v, bytes.data() + i * sizeof(T), sizeof(T));
  return v;
}

template <class T, class Decode>
std::vector<float> decode_to_float(std::span<const std::byte> bytes, Decode decode) {
  std::vector<float> out(bytes.size() / sizeof(T));
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = decode(load_element<T>(bytes, i));
  return out;
}

// Labels stored as int32 or int64, narrowed to int32; `source` names the file
// in the error for the first label that does not fit.
template <class I>
std::vector<std::int32_t> narrow_labels(std::span<const std::byte> bytes, const std::string& source) {
  std::vector<std::int32_t> out(bytes.size() / sizeof(I));
  for (std::size_t r = 0; r < out.size(); ++r) {
    const I v = load_element<I>(bytes, r);
    if (v < std::numeric_limits<std::int32_t>::min() || v > std::numeric_limits<std::int32_t>::max())
      throw config_error(source + ": label " + std::to_string(v) + " at row " + std::to_string(r) +
                             " does not fit in int32",
                         "labels must be class indices");
    out[r] = static_cast<std::int32_t>(v);
  }
  return out;
}

inline std::string shape_string(std::span<const std::int64_t> shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// x must be [N, F] and y [N]; returns the dataset with those sizes.
inline Dataset assemble_dataset(std::vector<float> x, std::span<const std::int64_t> x_shape,
                                std::vector<std::int32_t> y, std::span<const std::int64_t> y_shape,
                                const std::string& source) {
  if (x_shape.size() != 2)
    throw config_error(source + ": features x have shape " + shape_string(x_shape) + ", expected [rows, features]",
                       "store x as a 2-D array");
  if (y_shape.size() != 1)
    throw config_error(source + ": labels y have shape " + shape_string(y_shape) + ", expected [rows]",
                       "store y as a 1-D array of class indices");
  if (x_shape[0] != y_shape[0])
    throw config_error(source + ": x has " + std::to_string(x_shape[0]) + " rows but y has " +
                           std::to_string(y_shape[0]) + " labels",
                       "x and y must describe the same rows");
  Dataset d;
  d.x = std::move(x);
  d.y = std::move(y);
  d.rows = x_shape[0];
  d.features = x_shape[1];
  return d;
}

// A parsed .npy file: its dtype descriptor, shape and raw little-endian data.
struct NpyArray {
  std::string descr;
  std::vector<std::int64_t> shape;
  std::vector<std::byte> data;
};

// Reads the header dict, a Python literal such as
//   {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }
// (not JSON: single quotes, True/False, tuples), hence this small parser.
class NpyHeaderParser {
 public:
  NpyHeaderParser(std::string_view text, std::string source) : text_(text), source_(std::move(source)) {}

  void parse(NpyArray& out, bool& fortran_order) {
    bool seen_descr = false, seen_order = false, seen_shape = false;
    expect('{');
    while (!peek_is('}')) {
      const std::string key = quoted();
      expect(':');
      if (key == "descr") {
        out.descr = quoted();
        seen_descr = true;
      } else if (key == "fortran_order") {
        fortran_order = boolean();
        seen_order = true;
      } else if (key == "shape") {
        out.shape = tuple();
        seen_shape = true;
      } else {
        fail("unexpected key '" + key + "'");
      }
      if (!peek_is('}')) expect(',');
    }
    expect('}');
    if (!seen_descr || !seen_order || !seen_shape) fail("the header lacks 'descr', 'fortran_order' or 'shape'");
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw config_error(source_ + ": bad .npy header (" + what + ") in: " + std::string(text_),
                       "write the file with numpy.save");
  }
  void skip_space() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\n' || text_[pos_] == '\t')) ++pos_;
  }
  bool peek_is(char c) {
    skip_space();
    return pos_ < text_.size() && text_[pos_] == c;
  }
  void expect(char c) {
    if (!peek_is(c)) fail(std::string("expected '") + c + "' at offset " + std::to_string(pos_));
    ++pos_;
  }
  std::string quoted() {
    skip_space();
    if (pos_ >= text_.size() || (text_[pos_] != '\'' && text_[pos_] != '"'))
      fail("expected a quoted string at offset " + std::to_string(pos_));
    const char quote = text_[pos_++];
    const auto end = text_.find(quote, pos_);
    if (end == std::string_view::npos) fail("unterminated string");
    std::string s(text_.substr(pos_, end - pos_));
    pos_ = end + 1;
    return s;
  }
  bool boolean() {
    skip_space();
    for (const auto& [word, value] : {std::pair<std::string_view, bool>{"True", true}, {"False", false}})
      if (text_.substr(pos_, word.size()) == word) {
        pos_ += word.size();
        return value;
      }
    fail("expected True or False at offset " + std::to_string(pos_));
  }
  std::vector<std::int64_t> tuple() {
    std::vector<std::int64_t> dims;
    expect('(');
    while (!peek_is(')')) {
      std::int64_t v = 0;
      std::size_t digits = 0;
      for (; pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9'; ++pos_, ++digits) {
        if (v > (std::numeric_limits<std::int64_t>::max() - 9) / 10) fail("dimension too large");
        v = v * 10 + (text_[pos_] - '0');
      }
      if (digits == 0) fail("expected a dimension at offset " + std::to_string(pos_));
      dims.push_back(v);
      if (!peek_is(')')) expect(',');
    }
    expect(')');
    return dims;
  }

  std::string_view text_;
  std::string source_;
  std::size_t pos_ = 0;
};

inline std::size_t npy_item_size(const std::string& descr, const std::string& source) {
  const std::string fix = "save little-endian float32/float64 features and int32/int64 labels, e.g. "
                          "numpy.save(path, a.astype('<f4'))";
  if (descr.size() >= 2 && descr[0] == '>')
    throw config_error(source + ": the array is big-endian ('" + descr + "')", fix);
  if (descr == "<f4" || descr == "<i4") return 4;
  if (descr == "<f8" || descr == "<i8") return 8;
  throw config_error(source + ": unsupported .npy dtype '" + descr + "'", fix);
}

// Parses a NumPy .npy file, format versions 1.0, 2.0 and 3.0: the magic
// "\x93NUMPY", major and minor version bytes, the header length (uint16 in
// v1, uint32 in v2/v3), the header dict padded with spaces and '\n', then
// the array data.
inline NpyArray read_npy(const std::filesystem::path& path) {
  const std::string source = quoted_path(path);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw config_error("cannot open " + source, "check the path and its permissions");
  const auto file_size = static_cast<std::uint64_t>(std::filesystem::file_size(path));
  const auto read = [&](void* dst, std::uint64_t n, const char* what) {
    if (!in.read(static_cast<char*>(dst), static_cast<std::streamsize>(n)))
      throw config_error(source + ": file ends inside the " + std::string(what), "the file is truncated");
  };
  char preamble[8];
  read(preamble, sizeof preamble, ".npy preamble");
  if (std::string_view(preamble, 6) != "\x93NUMPY")
    throw config_error(source + " is not a .npy file (no \\x93NUMPY magic)", "write the file with numpy.save");
  const int major = static_cast<unsigned char>(preamble[6]);
  std::uint64_t header_len = 0;
  std::uint64_t prefix = 0;
  if (major == 1) {
    std::uint16_t n;
    read(&n, 2, ".npy header length");
    header_len = n;
    prefix = 10;
  } else if (major == 2 || major == 3) {
    std::uint32_t n;
    read(&n, 4, ".npy header length");
    header_len = n;
    prefix = 12;
  } else {
    throw config_error(source + ": unsupported .npy format version " + std::to_string(major),
                       "write the file with numpy.save (format 1.0, 2.0 or 3.0)");
  }
  if (prefix + header_len > file_size)
    throw config_error(source + ": .npy header length " + std::to_string(header_len) + " exceeds the file size " +
                           std::to_string(file_size),
                       "the file is truncated or not a .npy file");
  std::string header(header_len, '\0');
  read(header.data(), header_len, ".npy header");

  NpyArray arr;
  bool fortran_order = false;
  NpyHeaderParser(header, source).parse(arr, fortran_order);
  if (fortran_order)
    throw config_error(source + ": the array is in Fortran (column-major) order",
                       "save a C-ordered array: numpy.save(path, numpy.ascontiguousarray(a))");
  const std::size_t item = npy_item_size(arr.descr, source);
  std::uint64_t count = 1;
  for (const auto d : arr.shape) {
    if (d != 0 && count > std::numeric_limits<std::uint64_t>::max() / item / static_cast<std::uint64_t>(d))
      throw config_error(source + ": shape " + shape_string(arr.shape) + " is too large", "the header is corrupt");
    count *= static_cast<std::uint64_t>(d);
  }
  const std::uint64_t bytes = count * item;
  if (file_size - prefix - header_len != bytes)
    throw config_error(source + ": shape " + shape_string(arr.shape) + " of '" + arr.descr + "' needs " +
                           std::to_string(bytes) + " data bytes but the file has " +
                           std::to_string(file_size - prefix - header_len),
                       "the file is truncated or was not written by numpy.save");
  arr.data.resize(bytes);
  read(arr.data.data(), bytes, "array data");
  return arr;
}

inline std::vector<float> npy_features(const NpyArray& a, const std::string& source) {
  if (a.descr == "<f4") return decode_to_float<float>(a.data, [](float v) { return v; });
  if (a.descr == "<f8") return decode_to_float<double>(a.data, [](double v) { return static_cast<float>(v); });
  throw config_error(source + ": features have integer dtype '" + a.descr + "'",
                     "save the features as float32 or float64");
}

inline std::vector<std::int32_t> npy_labels(const NpyArray& a, const std::string& source) {
  if (a.descr == "<i4") return narrow_labels<std::int32_t>(a.data, source);
  if (a.descr == "<i8") return narrow_labels<std::int64_t>(a.data, source);
  throw config_error(source + ": labels have float dtype '" + a.descr + "'",
                     "save the labels as int32 or int64 class indices");
}

}  // namespace detail

// Features from a 2-D float32/float64 .npy file, labels from a 1-D
// int32/int64 one (both little-endian, C order). Throws config_error naming
// the file and the problem.
inline Dataset load_npy_dataset(const std::filesystem::path& x_path, const std::filesystem::path& y_path) {
  const std::string x_source = detail::quoted_path(x_path);
  const std::string y_source = detail::quoted_path(y_path);
  const auto xa = detail::read_npy(x_path);
  auto x = detail::npy_features(xa, x_source);
  const auto ya = detail::read_npy(y_path);
  auto y = detail::npy_labels(ya, y_source);
  return detail::assemble_dataset(std::move(x), xa.shape, std::move(y), ya.shape, x_source + " and " + y_source);
}

}  // namespace dtrain
