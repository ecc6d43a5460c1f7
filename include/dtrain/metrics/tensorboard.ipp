// The definitions tensorboard.hpp declares with DTRAIN_DECL: included at the
// end of the header when DTRAIN_DEFINE_IMPL (core/macros.hpp), so they are
// compiled into every user translation unit (header-only) or once, into
// dtrain::runtime (separate compilation).
#pragma once

#include "dtrain/metrics/tensorboard.hpp"

DTRAIN_IMPL_BEGIN  // header-only: -O1 (core/macros.hpp)

    namespace dtrain {
  namespace detail {

  DTRAIN_DECL void append_little_endian(std::string& out, std::uint64_t v, int n) {
    for (int i = 0; i < n; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
  }

  DTRAIN_DECL auto ProtoBuffer::varint(std::uint64_t v) -> void {
    for (; v >= 0x80; v >>= 7) bytes_.push_back(static_cast<char>((v & 0x7f) | 0x80));
    bytes_.push_back(static_cast<char>(v));
  }

  DTRAIN_DECL auto ProtoBuffer::key(int field, int wire_type) -> void {
    varint(static_cast<std::uint64_t>(field) << 3 | static_cast<std::uint64_t>(wire_type));
  }

  DTRAIN_DECL auto ProtoBuffer::int64_field(int field, std::int64_t v) -> void {
    key(field, 0);
    varint(static_cast<std::uint64_t>(v));
  }

  DTRAIN_DECL auto ProtoBuffer::double_field(int field, double v) -> void {
    key(field, 1);
    append_little_endian(bytes_, std::bit_cast<std::uint64_t>(v), 8);
  }

  DTRAIN_DECL auto ProtoBuffer::float_field(int field, float v) -> void {
    key(field, 5);
    append_little_endian(bytes_, std::bit_cast<std::uint32_t>(v), 4);
  }

  DTRAIN_DECL auto ProtoBuffer::bytes_field(int field, std::string_view v) -> void {
    key(field, 2);
    varint(v.size());
    bytes_.append(v);
  }

  DTRAIN_DECL float to_float32(double v) {
    constexpr double max = std::numeric_limits<float>::max();
    if (v > max) return std::numeric_limits<float>::infinity();
    if (v < -max) return -std::numeric_limits<float>::infinity();
    return static_cast<float>(v);
  }

  DTRAIN_DECL std::uint32_t masked_crc32c(std::string_view bytes) {
    const std::uint32_t c = crc32c(std::as_bytes(std::span(bytes.data(), bytes.size())));
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
  }

  DTRAIN_DECL void append_tfrecord(std::string& out, std::string_view payload) {
    const std::size_t length_at = out.size();
    append_little_endian(out, payload.size(), 8);
    append_little_endian(out, masked_crc32c(std::string_view(out).substr(length_at, 8)), 4);
    out.append(payload);
    append_little_endian(out, masked_crc32c(payload), 4);
  }

  DTRAIN_DECL double unix_seconds_now() {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  }

  DTRAIN_DECL std::string host_name() {
    char host[256] = {};
    if (::gethostname(host, sizeof host - 1) != 0 || host[0] == '\0') return "localhost";
    return host;
  }
  }  // namespace detail
}  // namespace dtrain

namespace dtrain {

DTRAIN_DECL TensorBoardWriter::TensorBoardWriter(const std::filesystem::path& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec)
    throw error("cannot create the TensorBoard folder " + detail::quoted_path(dir) + ": " + ec.message(),
                "choose a folder you can write to (or create it first)");
  const double now = detail::unix_seconds_now();
  const std::string base =
      "events.out.tfevents." + std::to_string(static_cast<std::int64_t>(now)) + "." + detail::host_name();
  // O_EXCL: never append to, or truncate, another writer's file.
  for (int n = 0; fd_ < 0; ++n) {
    path_ = dir / (n == 0 ? base : base + "." + std::to_string(n));
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
    if (fd_ < 0 && errno != EEXIST)
      throw error(
          "cannot create the TensorBoard events file " + detail::quoted_path(path_) + ": " + detail::errno_text(),
          "check that the folder is writable and the disk not full");
  }
  detail::ProtoBuffer event;
  event.double_field(1, now);             // Event.wall_time
  event.bytes_field(3, "brain.Event:2");  // Event.file_version
  try {
    write_event(event);
  } catch (...) {
    close();
    throw;
  }
}

DTRAIN_DECL auto TensorBoardWriter::write_scalars(std::int64_t step, std::span<const TensorBoardScalar> values)
    -> void {
  detail::ProtoBuffer summary;
  for (const auto& v : values) {
    if (v.tag.empty())
      throw error(
          "TensorBoard scalar with an empty tag at step " + std::to_string(step) + " for " + detail::quoted_path(path_),
          "name every scalar, e.g. \"train/loss\"");
    detail::ProtoBuffer value;
    value.bytes_field(1, v.tag);                        // Value.tag
    value.float_field(2, detail::to_float32(v.value));  // Value.simple_value
    summary.bytes_field(1, value.bytes());              // Summary.value
  }
  detail::ProtoBuffer event = stamped(step);
  event.bytes_field(5, summary.bytes());  // Event.summary
  write_event(event);
}

DTRAIN_DECL auto TensorBoardWriter::write_scalars(std::int64_t step, std::initializer_list<TensorBoardScalar> values)
    -> void {
  write_scalars(step, std::span(values.begin(), values.size()));
}

DTRAIN_DECL auto TensorBoardWriter::write_scalar(std::string_view tag, double value, std::int64_t step) -> void {
  write_scalars(step, {{tag, value}});
}

DTRAIN_DECL auto TensorBoardWriter::write_session_start(std::int64_t step) -> void {
  detail::ProtoBuffer session;
  session.int64_field(1, 1);  // SessionLog.status = START
  detail::ProtoBuffer event = stamped(step);
  event.bytes_field(7, session.bytes());  // Event.session_log
  write_event(event);
}

DTRAIN_DECL auto TensorBoardWriter::stamped(std::int64_t step) -> detail::ProtoBuffer {
  detail::ProtoBuffer event;
  event.double_field(1, detail::unix_seconds_now());  // Event.wall_time
  event.int64_field(2, step);                         // Event.step
  return event;
}

DTRAIN_DECL auto TensorBoardWriter::write_event(const detail::ProtoBuffer& event) -> void {
  std::string record;
  detail::append_tfrecord(record, event.bytes());
  std::string_view rest = record;
  while (!rest.empty()) {
    const ::ssize_t n = ::write(fd_, rest.data(), rest.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      std::string why = n < 0 ? detail::errno_text() : "nothing written";
      if (::ftruncate(fd_, static_cast<::off_t>(size_)) != 0) why += "; it may now end in a partial record";
      throw error("writing the TensorBoard events file " + detail::quoted_path(path_) + " failed: " + why,
                  "check free disk space and quotas");
    }
    rest.remove_prefix(static_cast<std::size_t>(n));
  }
  size_ += record.size();
}

DTRAIN_DECL auto TensorBoardWriter::close() noexcept -> void {
  if (fd_ >= 0) ::close(std::exchange(fd_, -1));
}
}  // namespace dtrain
DTRAIN_IMPL_END
