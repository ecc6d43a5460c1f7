// The definitions safetensors.hpp declares with DTRAIN_DECL: included at the
// end of the header when DTRAIN_DEFINE_IMPL (core/macros.hpp), so they are
// compiled into every user translation unit (header-only) or once, into
// dtrain::runtime (separate compilation).
#pragma once

#include "dtrain/io/json.hpp"
#include "dtrain/io/safetensors.hpp"

DTRAIN_IMPL_BEGIN  // header-only: -O1 (core/macros.hpp)

    namespace dtrain {
  namespace detail {

  DTRAIN_DECL std::optional<std::uint64_t> shape_bytes(std::span<const std::int64_t> shape, std::size_t elem) {
    std::uint64_t n = elem;
    for (const auto d : shape) {
      if (d < 0) return std::nullopt;
      const auto u = static_cast<std::uint64_t>(d);
      if (u != 0 && n > std::numeric_limits<std::uint64_t>::max() / u) return std::nullopt;
      n *= u;
    }
    return n;
  }

  DTRAIN_DECL MappedFile::MappedFile(const std::filesystem::path& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw checkpoint_error("cannot open " + quoted_path(path) + ": " + errno_text(), "check the path");
    struct ::stat st {};
    if (::fstat(fd, &st) != 0) {
      const auto why = errno_text();
      ::close(fd);
      throw checkpoint_error("cannot stat " + quoted_path(path) + ": " + why, "check the path");
    }
    size_ = static_cast<std::size_t>(st.st_size);
    // mmap rejects length 0; an empty file simply has no bytes.
    if (size_ > 0) {
      void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
      if (p == MAP_FAILED) {
        const auto why = errno_text();
        ::close(fd);
        throw checkpoint_error("cannot map " + quoted_path(path) + ": " + why, "check the file and free memory");
      }
      data_ = static_cast<const std::byte*>(p);
    }
    ::close(fd);  // the mapping keeps the file alive
  }

  DTRAIN_DECL auto MappedFile::unmap() noexcept -> void {
    if (data_) ::munmap(const_cast<std::byte*>(data_), size_);
  }

  DTRAIN_DECL std::string encode_safetensors_header(std::span<const SafetensorsEntry> entries,
                                                    const std::map<std::string, std::string>& metadata,
                                                    const std::filesystem::path& path) {
    nlohmann::ordered_json header = nlohmann::ordered_json::object();
    if (!metadata.empty()) header["__metadata__"] = metadata;
    std::uint64_t offset = 0;
    for (const auto& e : entries) {
      if (e.shape.size() > safetensors_max_rank)
        throw checkpoint_error("safetensors tensor '" + e.name + "' has " + std::to_string(e.shape.size()) +
                                   " dimensions, more than the " + std::to_string(safetensors_max_rank) +
                                   " dtrain reads back",
                               "reshape the tensor to fewer dimensions");
      const auto bytes = shape_bytes(e.shape, element_bytes(e.dtype));
      if (!bytes)
        throw checkpoint_error("safetensors tensor '" + e.name + "' has an invalid shape " + shape_text(e.shape),
                               "give every dimension a non-negative size");
      header[e.name] = {
          {"dtype", safetensors_name(e.dtype)}, {"shape", e.shape}, {"data_offsets", {offset, offset + *bytes}}};
      offset += *bytes;
    }
    std::string text;
    try {
      text = header.dump();
    } catch (const nlohmann::json::exception& ex) {
      throw checkpoint_error("cannot encode the safetensors header for " + quoted_path(path) + ": " + ex.what(),
                             "tensor names and metadata must be valid UTF-8");
    }
    text.append((8 - text.size() % 8) % 8, ' ');
    std::string out(8, '\0');
    for (std::size_t i = 0; i < 8; ++i) out[i] = static_cast<char>((text.size() >> (8 * i)) & 0xffu);
    return out + text;
  }
  }  // namespace detail
}  // namespace dtrain

namespace dtrain {

DTRAIN_DECL auto SafetensorsWriter::add(std::string name, element_type dtype, std::vector<std::int64_t> shape,
                                        std::span<const std::byte> bytes) -> void {
  if (name.empty() || name == "__metadata__")
    throw checkpoint_error("safetensors tensor name '" + name + "' is reserved or empty", "rename the tensor");
  if (std::ranges::any_of(tensors_, [&](const Entry& e) { return e.name == name; }))
    throw checkpoint_error("safetensors tensor '" + name + "' was added twice", "give every tensor a unique name");
  const auto expected = detail::shape_bytes(shape, element_bytes(dtype));
  if (!expected || *expected != bytes.size())
    throw checkpoint_error("safetensors tensor '" + name + "' of shape " + shape_text(shape) + " and dtype " +
                               std::string(safetensors_name(dtype)) + " was given " + std::to_string(bytes.size()) +
                               " bytes",
                           "pass exactly product(shape) * element size bytes");
  tensors_.push_back({std::move(name), dtype, std::move(shape), bytes});
}

DTRAIN_DECL auto SafetensorsWriter::write(const std::filesystem::path& path) const -> void {
  // Wider elements first: with the 8-aligned data start, every tensor then
  // starts aligned to its element size (what safetensors' own writer does).
  std::vector<const Entry*> order;
  for (const auto& t : tensors_) order.push_back(&t);
  std::ranges::stable_sort(order, std::greater<>{}, [](const Entry* e) { return element_bytes(e->dtype); });
  std::vector<SafetensorsEntry> entries;
  for (const Entry* e : order) entries.push_back({e->name, e->dtype, e->shape});
  const std::string header = detail::encode_safetensors_header(entries, metadata_, path);
  detail::AtomicFile file(path);
  file.write(std::as_bytes(std::span(header)));
  for (const Entry* e : order) file.write(e->bytes);
  file.commit();
}

DTRAIN_DECL SafetensorsStreamWriter::SafetensorsStreamWriter(const std::filesystem::path& path,
                                                             std::vector<SafetensorsEntry> entries,
                                                             const std::map<std::string, std::string>& metadata)
    : path_(path), entries_(std::move(entries)), file_(path) {
  const std::string header = detail::encode_safetensors_header(entries_, metadata, path);
  file_.write(std::as_bytes(std::span(header)));
}

DTRAIN_DECL auto SafetensorsStreamWriter::write(std::span<const std::byte> bytes) -> void {
  if (next_ >= entries_.size())
    throw checkpoint_error("SafetensorsStreamWriter: more tensors written to " + detail::quoted_path(path_) +
                               " than the " + std::to_string(entries_.size()) + " declared",
                           "write each declared tensor once, in declaration order");
  const auto& e = entries_[next_];
  const auto expected = *detail::shape_bytes(e.shape, element_bytes(e.dtype));
  if (bytes.size() != expected)
    throw checkpoint_error("SafetensorsStreamWriter: tensor '" + e.name + "' was given " +
                               std::to_string(bytes.size()) + " bytes, not " + std::to_string(expected),
                           "write product(shape) * element size bytes per tensor");
  file_.write(bytes);
  ++next_;
}

DTRAIN_DECL auto SafetensorsStreamWriter::commit() -> void {
  if (next_ != entries_.size())
    throw checkpoint_error("SafetensorsStreamWriter: " + std::to_string(entries_.size() - next_) + " of the " +
                               std::to_string(entries_.size()) + " tensors of " + detail::quoted_path(path_) +
                               " were never written",
                           "write every declared tensor before commit()");
  file_.commit();
}

DTRAIN_DECL auto SafetensorsFile::tensor(std::string_view name) const -> SafetensorsTensor {
  const auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    std::string have;
    for (const auto& n : names_) have += (have.empty() ? "" : ", ") + n;
    throw checkpoint_error(
        detail::quoted_path(path_) + " has no tensor '" + std::string(name) + "' (it has: " + have + ")",
        "check the tensor name, or that this is the right file");
  }
  const auto& e = it->second;
  return {e.dtype, e.shape, data_.subspan(e.begin, e.end - e.begin)};
}

DTRAIN_DECL auto SafetensorsFile::read_f32(std::string_view name) const -> std::vector<float> {
  const auto t = tensor(name);
  switch (t.dtype) {
    case element_type::f32: return detail::decode_to_float<float>(t.bytes, [](float v) { return v; });
    case element_type::f64:
      return detail::decode_to_float<double>(t.bytes, [](double v) { return static_cast<float>(v); });
    case element_type::f16: return detail::decode_to_float<std::uint16_t>(t.bytes, detail::fp16_bits_to_float);
    case element_type::bf16: return detail::decode_to_float<std::uint16_t>(t.bytes, detail::bf16_bits_to_float);
    default: throw conversion_error(name, t.dtype, "read_f32 converts F32, F64, F16 and BF16");
  }
}

DTRAIN_DECL auto SafetensorsFile::read_i64(std::string_view name) const -> std::vector<std::int64_t> {
  const auto t = tensor(name);
  switch (t.dtype) {
    case element_type::i8: return widen<std::int8_t>(t.bytes);
    case element_type::i16: return widen<std::int16_t>(t.bytes);
    case element_type::i32: return widen<std::int32_t>(t.bytes);
    case element_type::i64: return widen<std::int64_t>(t.bytes);
    case element_type::u8: return widen<std::uint8_t>(t.bytes);
    case element_type::u16: return widen<std::uint16_t>(t.bytes);
    case element_type::u32: return widen<std::uint32_t>(t.bytes);
    default: throw conversion_error(name, t.dtype, "read_i64 converts I8, I16, I32, I64, U8, U16 and U32");
  }
}

DTRAIN_DECL auto SafetensorsFile::conversion_error(std::string_view name, element_type dtype,
                                                   const char* supported) const -> checkpoint_error {
  return checkpoint_error("tensor '" + std::string(name) + "' in " + detail::quoted_path(path_) + " has dtype " +
                              std::string(safetensors_name(dtype)) + "; " + supported,
                          "read it with tensor(name) and convert it yourself");
}

DTRAIN_DECL auto SafetensorsFile::corrupt(const std::string& problem) const -> void {
  throw checkpoint_error(detail::quoted_path(path_) + " is not a valid safetensors file: " + problem,
                         "the file is truncated or damaged; restore it or save it again");
}

DTRAIN_DECL auto SafetensorsFile::parse() -> void {
  const auto all = file_.bytes();
  if (all.size() < 8) corrupt("it has " + std::to_string(all.size()) + " bytes, fewer than the 8-byte header length");
  std::uint64_t header_len = 0;
  for (std::size_t i = 0; i < 8; ++i) header_len |= std::to_integer<std::uint64_t>(all[i]) << (8 * i);
  if (header_len > all.size() - 8)
    corrupt("the header length " + std::to_string(header_len) + " exceeds the " + std::to_string(all.size() - 8) +
            " bytes after it");
  if (header_len > safetensors_max_header_bytes)
    corrupt("the header length " + std::to_string(header_len) + " exceeds the format's limit of " +
            std::to_string(safetensors_max_header_bytes) + " bytes");
  const std::string_view text(reinterpret_cast<const char*>(all.data() + 8), header_len);
  // corrupt() throws the error itself, with the file's name and fix.
  const nlohmann::ordered_json header = detail::parse_json(
      text, [&](const std::string& problem) -> checkpoint_error { corrupt("the header is " + problem); });
  if (!header.is_object()) corrupt("the header is not a JSON object");
  data_ = all.subspan(8 + header_len);

  for (const auto& [key, value] : header.items()) {
    if (key == "__metadata__")
      parse_metadata(value);
    else
      parse_tensor(key, value);
  }
  check_layout();
}

DTRAIN_DECL auto SafetensorsFile::parse_metadata(const nlohmann::ordered_json& value) -> void {
  if (!value.is_object()) corrupt("__metadata__ is not an object");
  for (const auto& [k, v] : value.items()) {
    if (!v.is_string()) corrupt("__metadata__ entry '" + k + "' is not a string");
    metadata_[k] = v.get<std::string>();
  }
}

DTRAIN_DECL auto SafetensorsFile::parse_tensor(const std::string& name, const nlohmann::ordered_json& value) -> void {
  const std::string what = "tensor '" + name + "'";
  if (!value.is_object()) corrupt(what + " is not an object");
  const auto field = [&](const char* key) -> const nlohmann::ordered_json& {
    const auto it = value.find(key);
    if (it == value.end()) corrupt(what + " has no \"" + key + "\"");
    return *it;
  };
  const auto& dtype_json = field("dtype");
  const auto dtype = dtype_json.is_string() ? parse_element_type(dtype_json.get<std::string>()) : std::nullopt;
  if (!dtype) corrupt(what + " has unknown dtype " + dtype_json.dump());
  const auto& shape_json = field("shape");
  if (!shape_json.is_array()) corrupt(what + " has a shape that is not an array");
  if (shape_json.size() > safetensors_max_rank)
    corrupt(what + " has " + std::to_string(shape_json.size()) + " dimensions, more than the " +
            std::to_string(safetensors_max_rank) + " dtrain reads");
  std::vector<std::int64_t> shape;
  for (const auto& d : shape_json) {
    if (!d.is_number_unsigned() ||
        d.get<std::uint64_t>() > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
      corrupt(what + " has an invalid dimension " + d.dump());
    shape.push_back(d.get<std::int64_t>());
  }
  const auto& off = field("data_offsets");
  if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
    corrupt(what + " has data_offsets " + off.dump() + ", expected [begin, end]");
  const auto begin = off[0].get<std::uint64_t>();
  const auto end = off[1].get<std::uint64_t>();
  if (begin > end || end > data_.size())
    corrupt(what + " has data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) + "] outside the " +
            std::to_string(data_.size()) + "-byte data section");
  const auto expected = detail::shape_bytes(shape, element_bytes(*dtype));
  if (!expected || *expected != end - begin)
    corrupt(what + " of shape " + shape_text(shape) + " and dtype " + std::string(safetensors_name(*dtype)) +
            " spans " + std::to_string(end - begin) + " bytes, expected " +
            (expected ? std::to_string(*expected) : std::string("an overflowing count")));
  tensors_.emplace(name,
                   Entry{*dtype, std::move(shape), static_cast<std::size_t>(begin), static_cast<std::size_t>(end)});
}

DTRAIN_DECL auto SafetensorsFile::check_layout() -> void {
  std::vector<std::pair<const std::string*, const Entry*>> by_offset;
  for (const auto& [name, e] : tensors_) by_offset.emplace_back(&name, &e);
  std::ranges::sort(by_offset, {}, [](const auto& p) { return std::pair(p.second->begin, p.second->end); });
  std::size_t cursor = 0;
  const std::string* previous = nullptr;
  for (const auto& [name, e] : by_offset) {
    if (e->begin < cursor)
      corrupt("tensor '" + *name + "' overlaps tensor '" + *previous + "' (its data starts at " +
              std::to_string(e->begin) + ", before " + std::to_string(cursor) + ")");
    if (e->begin > cursor)
      corrupt("the data section has a gap of " + std::to_string(e->begin - cursor) + " bytes before tensor '" + *name +
              "'");
    cursor = e->end;
    previous = name;
    names_.push_back(*name);
  }
  if (cursor != data_.size())
    corrupt("the data section has " + std::to_string(data_.size() - cursor) + " bytes after the last tensor");
}
}  // namespace dtrain
DTRAIN_IMPL_END
