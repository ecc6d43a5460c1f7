// The definitions npy.hpp declares with DTRAIN_DECL: included at the
// end of the header when DTRAIN_DEFINE_IMPL (core/macros.hpp), so they are
// compiled into every user translation unit (header-only) or once, into
// dtrain::runtime (separate compilation).
#pragma once

#include "dtrain/io/npy.hpp"

DTRAIN_IMPL_BEGIN  // header-only: -O1 (core/macros.hpp)

    namespace dtrain::detail {
  DTRAIN_DECL auto NpyHeaderParser::parse(NpyArray & out, bool& fortran_order)->void {
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

  DTRAIN_DECL auto NpyHeaderParser::fail(const std::string& what) const->void {
    throw config_error(source_ + ": bad .npy header (" + what + ") in: " + std::string(text_),
                       "write the file with numpy.save");
  }

  DTRAIN_DECL auto NpyHeaderParser::skip_space()->void {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\n' || text_[pos_] == '\t')) ++pos_;
  }

  DTRAIN_DECL auto NpyHeaderParser::peek_is(char c)->bool {
    skip_space();
    return pos_ < text_.size() && text_[pos_] == c;
  }

  DTRAIN_DECL auto NpyHeaderParser::expect(char c)->void {
    if (!peek_is(c)) fail(std::string("expected '") + c + "' at offset " + std::to_string(pos_));
    ++pos_;
  }

  DTRAIN_DECL auto NpyHeaderParser::quoted()->std::string {
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

  DTRAIN_DECL auto NpyHeaderParser::boolean()->bool {
    skip_space();
    for (const auto& [word, value] : {std::pair<std::string_view, bool>{"True", true}, {"False", false}})
      if (text_.substr(pos_, word.size()) == word) {
        pos_ += word.size();
        return value;
      }
    fail("expected True or False at offset " + std::to_string(pos_));
  }

  DTRAIN_DECL auto NpyHeaderParser::tuple()->std::vector<std::int64_t> {
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

  DTRAIN_DECL std::size_t npy_item_size(const std::string& descr, const std::string& source) {
    const std::string fix =
        "save little-endian float32/float64 features and int32/int64 labels, e.g. "
        "numpy.save(path, a.astype('<f4'))";
    if (descr.size() >= 2 && descr[0] == '>')
      throw config_error(source + ": the array is big-endian ('" + descr + "')", fix);
    if (descr == "<f4" || descr == "<i4") return 4;
    if (descr == "<f8" || descr == "<i8") return 8;
    throw config_error(source + ": unsupported .npy dtype '" + descr + "'", fix);
  }

  DTRAIN_DECL NpyArray read_npy(const std::filesystem::path& path) {
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
        throw config_error(source + ": shape " + shape_text(arr.shape) + " is too large", "the header is corrupt");
      count *= static_cast<std::uint64_t>(d);
    }
    const std::uint64_t bytes = count * item;
    if (file_size - prefix - header_len != bytes)
      throw config_error(source + ": shape " + shape_text(arr.shape) + " of '" + arr.descr + "' needs " +
                             std::to_string(bytes) + " data bytes but the file has " +
                             std::to_string(file_size - prefix - header_len),
                         "the file is truncated or was not written by numpy.save");
    arr.data.resize(bytes);
    read(arr.data.data(), bytes, "array data");
    return arr;
  }
}  // namespace dtrain::detail
DTRAIN_IMPL_END
