#pragma once
// NumPy's .npy format, versions 1.0, 2.0 and 3.0: the magic, the header (a
// Python dict literal: descr, fortran_order, shape) and the raw little-endian
// data, every part checked so a damaged file is an error that names it.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "dtrain/core/element.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/macros.hpp"
#include "dtrain/io/files.hpp"

namespace dtrain::detail {

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

  DTRAIN_DECL void parse(NpyArray& out, bool& fortran_order);

 private:
  [[noreturn]] DTRAIN_DECL void fail(const std::string& what) const;
  DTRAIN_DECL void skip_space();
  DTRAIN_DECL bool peek_is(char c);
  DTRAIN_DECL void expect(char c);
  DTRAIN_DECL std::string quoted();
  DTRAIN_DECL bool boolean();
  DTRAIN_DECL std::vector<std::int64_t> tuple();

  std::string_view text_;
  std::string source_;
  std::size_t pos_ = 0;
};

DTRAIN_DECL std::size_t npy_item_size(const std::string& descr, const std::string& source);

// Parses a NumPy .npy file, format versions 1.0, 2.0 and 3.0: the magic
// "\x93NUMPY", major and minor version bytes, the header length (uint16 in
// v1, uint32 in v2/v3), the header dict padded with spaces and '\n', then
// the array data.
DTRAIN_DECL NpyArray read_npy(const std::filesystem::path& path);

}  // namespace dtrain::detail

#if DTRAIN_DEFINE_IMPL
#include "dtrain/io/npy.ipp"
#endif
