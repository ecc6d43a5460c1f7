#pragma once
// Scalars for TensorBoard, written without TensorFlow or protobuf.
//
// TensorBoard reads "events files": a TFRecord stream whose records are
// serialised tensorflow.Event protocol buffers. A record is
//
//   8 bytes   the payload length, unsigned little-endian
//   4 bytes   the masked CRC-32C of those 8 bytes
//   n bytes   the payload (one Event)
//   4 bytes   the masked CRC-32C of the payload
//
// where masked(c) = ((c >> 15) | (c << 17)) + 0xa282ead8 (TFRecord masks its
// checksums so that a CRC stored inside checksummed data does not cancel out).
// The Event fields used here, with their protobuf field numbers:
//
//   Event      { double wall_time = 1; int64 step = 2; string file_version = 3;
//                Summary summary = 5; SessionLog session_log = 7; }
//   Summary    { repeated Value value = 1; }
//   Value      { string tag = 1; float simple_value = 2; }
//   SessionLog { SessionStatus status = 1; }   (START = 1)
//
// The file's first record is an Event carrying only wall_time and
// file_version "brain.Event:2"; every write_scalars() call after it is one
// Event holding that step's values. The encoding is written by hand: these
// messages need four wire types (varint, 64-bit, length-delimited, 32-bit),
// far less than a protobuf dependency would bring.
//
//   dtrain::TensorBoardWriter tb("runs/mlp");   // runs/mlp/events.out.tfevents.<seconds>.<host>
//   tb.write_scalars(step, {{"train/loss", loss}, {"train/lr", lr}});
//
// and `tensorboard --logdir runs` shows them. TensorBoard stores scalars as
// float32: a value is rounded to the nearest float (a double beyond float's
// range becomes an infinity).

#include <fcntl.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <initializer_list>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

#include "dtrain/io/crc32c.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/io/files.hpp"

namespace dtrain {

// One named value of a step. Tags group in TensorBoard's UI by their prefix
// up to the first '/' ("train/loss" and "train/lr" share a section).
struct TensorBoardScalar {
  std::string_view tag;
  double value = 0.0;
};

namespace detail {

// The low `n` bytes of `v`, least significant first: protobuf's fixed-width
// fields and TFRecord's length and checksums.
inline void append_little_endian(std::string& out, std::uint64_t v, int n) {
  for (int i = 0; i < n; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
}

// Protobuf's wire format, the subset Event needs. A key is
// (field number << 3) | wire type.
class ProtoBuffer {
 public:
  void varint(std::uint64_t v) {
    for (; v >= 0x80; v >>= 7) bytes_.push_back(static_cast<char>((v & 0x7f) | 0x80));
    bytes_.push_back(static_cast<char>(v));
  }
  void key(int field, int wire_type) {
    varint(static_cast<std::uint64_t>(field) << 3 | static_cast<std::uint64_t>(wire_type));
  }

  // int64 is a varint of the two's complement: a negative step takes 10 bytes.
  void int64_field(int field, std::int64_t v) {
    key(field, 0);
    varint(static_cast<std::uint64_t>(v));
  }
  void double_field(int field, double v) {
    key(field, 1);
    append_little_endian(bytes_, std::bit_cast<std::uint64_t>(v), 8);
  }
  void float_field(int field, float v) {
    key(field, 5);
    append_little_endian(bytes_, std::bit_cast<std::uint32_t>(v), 4);
  }
  void bytes_field(int field, std::string_view v) {
    key(field, 2);
    varint(v.size());
    bytes_.append(v);
  }

  const std::string& bytes() const { return bytes_; }

 private:
  std::string bytes_;
};

// A value as TensorBoard stores it: the nearest float32, and beyond float's
// range an infinity of the same sign (where a plain conversion is undefined).
inline float to_float32(double v) {
  constexpr double max = std::numeric_limits<float>::max();
  if (v > max) return std::numeric_limits<float>::infinity();
  if (v < -max) return -std::numeric_limits<float>::infinity();
  return static_cast<float>(v);
}

inline std::uint32_t masked_crc32c(std::string_view bytes) {
  const std::uint32_t c = crc32c(std::as_bytes(std::span(bytes.data(), bytes.size())));
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

// Appends `payload` to `out` as one TFRecord.
inline void append_tfrecord(std::string& out, std::string_view payload) {
  const std::size_t length_at = out.size();
  append_little_endian(out, payload.size(), 8);
  append_little_endian(out, masked_crc32c(std::string_view(out).substr(length_at, 8)), 4);
  out.append(payload);
  append_little_endian(out, masked_crc32c(payload), 4);
}

inline double unix_seconds_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

inline std::string host_name() {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0 || host[0] == '\0') return "localhost";
  return host;
}

}  // namespace detail

// Writes one events file in a folder TensorBoard reads (`tensorboard --logdir
// <folder or a parent>`). Each event reaches the file in one write(2) call
// (more only after a short write) before the call returns, so a run killed
// later keeps every step it wrote. Move-only; the destructor closes the file.
//
// Every writer starts a new file, so several runs (a restart, a resumed
// job) may share a folder: TensorBoard merges its files in name order, and
// the names start with the creation time. A second file created in the same
// second on the same host gets a suffix (".1", ".2", ...) that sorts after
// the first.
class TensorBoardWriter {
 public:
  // Creates `dir` (with its parents) if needed and a new events file in it.
  // Throws dtrain::error naming the path when either cannot be created.
  explicit TensorBoardWriter(const std::filesystem::path& dir) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec)
      throw error("cannot create the TensorBoard folder " + detail::quoted_path(dir) + ": " + ec.message(),
                  "choose a folder you can write to (or create it first)");
    const double now = detail::unix_seconds_now();
    const std::string base = "events.out.tfevents." + std::to_string(static_cast<std::int64_t>(now)) + "." +
                             detail::host_name();
    // O_EXCL: never append to, or truncate, another writer's file.
    for (int n = 0; fd_ < 0; ++n) {
      path_ = dir / (n == 0 ? base : base + "." + std::to_string(n));
      fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
      if (fd_ < 0 && errno != EEXIST)
        throw error("cannot create the TensorBoard events file " + detail::quoted_path(path_) + ": " +
                        detail::errno_text(),
                    "check that the folder is writable and the disk not full");
    }
    detail::ProtoBuffer event;
    event.double_field(1, now);                // Event.wall_time
    event.bytes_field(3, "brain.Event:2");     // Event.file_version
    try {
      write_event(event);
    } catch (...) {
      close();
      throw;
    }
  }

  TensorBoardWriter(TensorBoardWriter&& other) noexcept
      : path_(std::move(other.path_)), fd_(std::exchange(other.fd_, -1)), size_(other.size_) {}
  TensorBoardWriter& operator=(TensorBoardWriter&& other) noexcept {
    if (this != &other) {
      close();
      path_ = std::move(other.path_);
      fd_ = std::exchange(other.fd_, -1);
      size_ = other.size_;
    }
    return *this;
  }
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;
  ~TensorBoardWriter() { close(); }

  // One Event at `step` holding every value (stored as float32).
  void write_scalars(std::int64_t step, std::span<const TensorBoardScalar> values) {
    detail::ProtoBuffer summary;
    for (const auto& v : values) {
      if (v.tag.empty())
        throw error("TensorBoard scalar with an empty tag at step " + std::to_string(step) + " for " +
                        detail::quoted_path(path_),
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
  void write_scalars(std::int64_t step, std::initializer_list<TensorBoardScalar> values) {
    write_scalars(step, std::span(values.begin(), values.size()));
  }
  void write_scalar(std::string_view tag, double value, std::int64_t step) {
    write_scalars(step, {{tag, value}});
  }

  // Marks that a run (re)starts at `step`. TensorBoard then drops the values
  // at `step` and after that earlier files in the folder hold: a job resumed
  // from a checkpoint repeats the steps its killed attempt took after that
  // checkpoint, and only the repeat should show.
  void write_session_start(std::int64_t step) {
    detail::ProtoBuffer session;
    session.int64_field(1, 1);  // SessionLog.status = START
    detail::ProtoBuffer event = stamped(step);
    event.bytes_field(7, session.bytes());  // Event.session_log
    write_event(event);
  }

  const std::filesystem::path& path() const noexcept { return path_; }

 private:
  static detail::ProtoBuffer stamped(std::int64_t step) {
    detail::ProtoBuffer event;
    event.double_field(1, detail::unix_seconds_now());  // Event.wall_time
    event.int64_field(2, step);                         // Event.step
    return event;
  }

  // The event as one TFRecord. A failed write is cut off again, so the file
  // stays a sequence of whole records that TensorBoard reads to the end.
  void write_event(const detail::ProtoBuffer& event) {
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

  void close() noexcept {
    if (fd_ >= 0) ::close(std::exchange(fd_, -1));
  }

  std::filesystem::path path_;
  int fd_ = -1;
  std::size_t size_ = 0;  // bytes of whole records in the file
};

}  // namespace dtrain
