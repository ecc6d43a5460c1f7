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

#include "dtrain/core/error.hpp"
#include "dtrain/core/macros.hpp"
#include "dtrain/io/crc32c.hpp"
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
DTRAIN_DECL void append_little_endian(std::string& out, std::uint64_t v, int n);

// Protobuf's wire format, the subset Event needs. A key is
// (field number << 3) | wire type.
class ProtoBuffer {
 public:
  DTRAIN_DECL void varint(std::uint64_t v);
  DTRAIN_DECL void key(int field, int wire_type);

  // int64 is a varint of the two's complement: a negative step takes 10 bytes.
  DTRAIN_DECL void int64_field(int field, std::int64_t v);
  DTRAIN_DECL void double_field(int field, double v);
  DTRAIN_DECL void float_field(int field, float v);
  DTRAIN_DECL void bytes_field(int field, std::string_view v);

  const std::string& bytes() const { return bytes_; }

 private:
  std::string bytes_;
};

// A value as TensorBoard stores it: the nearest float32, and beyond float's
// range an infinity of the same sign (where a plain conversion is undefined).
DTRAIN_DECL float to_float32(double v);

DTRAIN_DECL std::uint32_t masked_crc32c(std::string_view bytes);

// Appends `payload` to `out` as one TFRecord.
DTRAIN_DECL void append_tfrecord(std::string& out, std::string_view payload);

DTRAIN_DECL double unix_seconds_now();

DTRAIN_DECL std::string host_name();

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
  DTRAIN_DECL explicit TensorBoardWriter(const std::filesystem::path& dir);

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
  DTRAIN_DECL void write_scalars(std::int64_t step, std::span<const TensorBoardScalar> values);
  DTRAIN_DECL void write_scalars(std::int64_t step, std::initializer_list<TensorBoardScalar> values);
  DTRAIN_DECL void write_scalar(std::string_view tag, double value, std::int64_t step);

  // Marks that a run (re)starts at `step`. TensorBoard then drops the values
  // at `step` and after that earlier files in the folder hold: a job resumed
  // from a checkpoint repeats the steps its killed attempt took after that
  // checkpoint, and only the repeat should show.
  DTRAIN_DECL void write_session_start(std::int64_t step);

  const std::filesystem::path& path() const noexcept { return path_; }

 private:
  DTRAIN_DECL static detail::ProtoBuffer stamped(std::int64_t step);

  // The event as one TFRecord. A failed write is cut off again, so the file
  // stays a sequence of whole records that TensorBoard reads to the end.
  DTRAIN_DECL void write_event(const detail::ProtoBuffer& event);

  DTRAIN_DECL void close() noexcept;

  std::filesystem::path path_;
  int fd_ = -1;
  std::size_t size_ = 0;  // bytes of whole records in the file
};

}  // namespace dtrain

#if DTRAIN_DEFINE_IMPL
#include "dtrain/metrics/tensorboard.ipp"
#endif
