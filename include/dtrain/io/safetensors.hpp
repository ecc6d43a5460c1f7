#pragma once
// The safetensors file format (https://github.com/huggingface/safetensors):
//
//   8 bytes   N, the header length, unsigned little-endian
//   N bytes   a JSON object: per tensor {"dtype", "shape", "data_offsets":
//             [begin, end]} (offsets relative to the data section), plus an
//             optional "__metadata__" map of strings; padded with spaces so
//             the data section starts 8-byte aligned
//   the rest  the data section: tensors back to back, little-endian, C order
//
// SafetensorsWriter writes it atomically; SafetensorsFile maps a file and
// checks everything the format promises before handing out a byte, so a
// truncated, damaged or hostile file fails with a message instead of loading
// garbage (or reading past its end). (load_safetensors_dataset, the dataset loader for this format, is
// data/'s.)

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <ranges>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "dtrain/core/dtype.hpp"
#include "dtrain/core/element.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/macros.hpp"
#include "dtrain/io/files.hpp"

namespace dtrain {

// The format's dtype names are element_type's file names (core/element.hpp).
constexpr std::string_view safetensors_name(element_type d) { return detail::element_info(d).file_name; }

constexpr std::optional<element_type> parse_element_type(std::string_view name) {
  for (const auto& info : detail::element_infos)
    if (info.file_name == name) return info.type;
  return std::nullopt;
}

// What a safetensors file may claim, checked before anything is allocated
// for it: a header of at most 100 MB (the limit of Hugging Face's own
// reader, the safetensors crate) and tensors of at most 16 dimensions. A
// zero-sized dimension makes a shape free in data bytes, so without a rank
// limit a header could ask for millions of dimensions.
inline constexpr std::uint64_t safetensors_max_header_bytes = 100'000'000;
inline constexpr std::size_t safetensors_max_rank = 16;

// A tensor's entry in a safetensors header.
struct SafetensorsEntry {
  std::string name;
  element_type dtype;
  std::vector<std::int64_t> shape;
};

namespace detail {

// Elements in a shape, or nullopt when a dimension is negative or the byte
// count would overflow.
DTRAIN_DECL std::optional<std::uint64_t> shape_bytes(std::span<const std::int64_t> shape, std::size_t elem);

// The 8-byte length and the JSON header (padded with spaces so the data
// section starts 8-byte aligned) for tensors laid out back to back in
// `entries` order.
DTRAIN_DECL std::string encode_safetensors_header(std::span<const SafetensorsEntry> entries,
                                                  const std::map<std::string, std::string>& metadata,
                                                  const std::filesystem::path& path);

// A read-only, private memory map of a whole file.
class MappedFile {
 public:
  DTRAIN_DECL explicit MappedFile(const std::filesystem::path& path);
  MappedFile(MappedFile&& o) noexcept : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  MappedFile& operator=(MappedFile&& o) noexcept {
    if (this != &o) {
      unmap();
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile() { unmap(); }

  std::span<const std::byte> bytes() const { return {data_, size_}; }

 private:
  DTRAIN_DECL void unmap() noexcept;
  const std::byte* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace detail

class SafetensorsWriter {
 public:
  // Adds a tensor. The bytes are referenced, not copied (checkpoints are
  // large): they must stay valid until write() returns.
  DTRAIN_DECL void add(std::string name, element_type dtype, std::vector<std::int64_t> shape,
                       std::span<const std::byte> bytes);

  // Typed form: the dtype follows from the element type. Temporaries are
  // refused at compile time, since the writer keeps only a view.
  template <std::ranges::contiguous_range R>
  requires(std::ranges::borrowed_range<R> || std::is_lvalue_reference_v<R>) &&
      is_element<std::remove_cv_t<std::ranges::range_value_t<R>>> void add(std::string name,
                                                                           std::vector<std::int64_t> shape,
                                                                           R&& values) {
    using T = std::remove_cv_t<std::ranges::range_value_t<R>>;
    add(std::move(name), element_type_of<T>(), std::move(shape),
        std::as_bytes(std::span<const T>(std::ranges::data(values), std::ranges::size(values))));
  }

  void set_metadata(std::string key, std::string value) { metadata_[std::move(key)] = std::move(value); }

  std::size_t size() const { return tensors_.size(); }

  DTRAIN_DECL void write(const std::filesystem::path& path) const;

 private:
  struct Entry {
    std::string name;
    element_type dtype;
    std::vector<std::int64_t> shape;
    std::span<const std::byte> bytes;
  };
  std::vector<Entry> tensors_;
  std::map<std::string, std::string> metadata_;
};

// A safetensors file written tensor by tensor, for files too large to hold
// in memory at once (a consolidated checkpoint gathered unit by unit): the
// tensors are declared up front, their bytes then arrive in that order, and
// commit() makes the file appear atomically (as SafetensorsWriter does).
class SafetensorsStreamWriter {
 public:
  DTRAIN_DECL SafetensorsStreamWriter(const std::filesystem::path& path, std::vector<SafetensorsEntry> entries,
                                      const std::map<std::string, std::string>& metadata = {});

  // The next tensor's bytes (entries in declaration order), whole.
  DTRAIN_DECL void write(std::span<const std::byte> bytes);

  DTRAIN_DECL void commit();

 private:
  std::filesystem::path path_;
  std::vector<SafetensorsEntry> entries_;
  detail::AtomicFile file_;
  std::size_t next_ = 0;
};

// One tensor of an open file; `bytes` points into the file's mapping and is
// valid while the SafetensorsFile lives. Not necessarily aligned.
struct SafetensorsTensor {
  element_type dtype;
  std::vector<std::int64_t> shape;
  std::span<const std::byte> bytes;

  std::int64_t numel() const { return static_cast<std::int64_t>(bytes.size() / element_bytes(dtype)); }
};

class SafetensorsFile {
 public:
  // Maps and validates `path`; throws checkpoint_error naming the file and
  // the first problem found.
  static SafetensorsFile open(const std::filesystem::path& path) { return SafetensorsFile(path); }

  const std::filesystem::path& path() const { return path_; }
  // Tensor names in the order of their data in the file.
  const std::vector<std::string>& names() const { return names_; }
  bool contains(std::string_view name) const { return tensors_.find(name) != tensors_.end(); }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  DTRAIN_DECL SafetensorsTensor tensor(std::string_view name) const;

  // The tensor's elements as float, converted from F32, F64, F16 or BF16.
  DTRAIN_DECL std::vector<float> read_f32(std::string_view name) const;

  // The tensor's elements as int64, converted from any signed integer dtype
  // or U8/U16/U32.
  DTRAIN_DECL std::vector<std::int64_t> read_i64(std::string_view name) const;

 private:
  struct Entry {
    element_type dtype;
    std::vector<std::int64_t> shape;
    std::size_t begin;
    std::size_t end;
  };

  explicit SafetensorsFile(const std::filesystem::path& path) : path_(path), file_(path) { parse(); }

  template <class I>
  static std::vector<std::int64_t> widen(std::span<const std::byte> bytes) {
    std::vector<std::int64_t> out(bytes.size() / sizeof(I));
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = detail::load_element<I>(bytes, i);
    return out;
  }

  DTRAIN_DECL checkpoint_error conversion_error(std::string_view name, element_type dtype, const char* supported) const;

  [[noreturn]] DTRAIN_DECL void corrupt(const std::string& problem) const;

  DTRAIN_DECL void parse();

  DTRAIN_DECL void parse_metadata(const nlohmann::ordered_json& value);

  DTRAIN_DECL void parse_tensor(const std::string& name, const nlohmann::ordered_json& value);

  // Tensors must tile the data section exactly, as the format requires: no
  // overlap (two tensors sharing bytes), no gap, nothing after the last one.
  DTRAIN_DECL void check_layout();

  std::filesystem::path path_;
  detail::MappedFile file_;
  std::span<const std::byte> data_;
  std::map<std::string, Entry, std::less<>> tensors_;
  std::vector<std::string> names_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace dtrain

#if DTRAIN_DEFINE_IMPL
#include "dtrain/io/safetensors.ipp"
#endif
