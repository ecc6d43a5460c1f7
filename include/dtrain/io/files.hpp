#pragma once
// Files as dtrain reads and writes them: paths quoted for messages, file
// names from files kept inside their directory, little-endian arrays read
// from bytes that may be unaligned, and files written atomically (a reader
// sees the old file or the complete new one, never a part) with the
// directory synced so the rename survives a crash.

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "dtrain/core/error.hpp"
#include "dtrain/core/macros.hpp"

namespace dtrain::detail {

// 'path', for messages. Built by appending: GCC 12 reports a bogus
// -Wrestrict for "'" + p.string() + "'" at -O2 (GCC bug 105329).
DTRAIN_DECL std::string quoted_path(const std::filesystem::path& p);

// `dir` / `name`, for a file name read from a file (a checkpoint index's
// shards, a transformers weight_map): a checkpoint may come from anyone, and
// its index must not make dtrain read, or report on, files elsewhere. Throws
// checkpoint_error (naming `what`, the file the name came from) unless
// `name` is a plain file name: not empty, "." or "..", no '/', backslash or NUL,
// at most 255 bytes, and, with links::stay_inside, once symbolic links are
// resolved, still a file inside `dir` (a link within the directory is fine,
// one leading out is not). links::follow accepts links out: the Hugging Face
// cache's snapshot folders are links to its blobs. The file need not exist:
// opening it reports that.
enum class links { stay_inside, follow };
DTRAIN_DECL std::filesystem::path contained_path(const std::filesystem::path& dir, std::string_view name,
                                                 std::string_view what, links policy = links::stay_inside);

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

DTRAIN_DECL void write_all(int fd, std::span<const std::byte> bytes, const std::filesystem::path& tmp);

// fsyncs a directory, so that a rename or a removal inside it survives a crash.
DTRAIN_DECL void sync_directory(std::filesystem::path dir, const std::string& what);

// A file written so that readers see either the old file at `path` or the
// complete new one: bytes go to path.tmp; commit() fsyncs it, renames it
// over path and fsyncs the directory (making the rename itself durable).
// Destroyed without commit() (an error, an exception), path.tmp is removed
// and an existing file at `path` is untouched.
class AtomicFile {
 public:
  DTRAIN_DECL explicit AtomicFile(std::filesystem::path path);
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  DTRAIN_DECL ~AtomicFile();

  void write(std::span<const std::byte> bytes) { write_all(fd_, bytes, tmp_); }

  DTRAIN_DECL void commit();

 private:
  std::filesystem::path path_, tmp_;
  int fd_ = -1;
  bool committed_ = false;
};

// `pieces` written one after the other to `path`, atomically (AtomicFile).
DTRAIN_DECL void write_file_atomically(const std::filesystem::path& path,
                                       std::span<const std::span<const std::byte>> pieces);

}  // namespace dtrain::detail

#if DTRAIN_DEFINE_IMPL
#include "dtrain/io/files.ipp"
#endif
