// The definitions files.hpp declares with DTRAIN_DECL: included at the
// end of the header when DTRAIN_DEFINE_IMPL (core/macros.hpp), so they are
// compiled into every user translation unit (header-only) or once, into
// dtrain::runtime (separate compilation).
#pragma once

#include "dtrain/io/files.hpp"

DTRAIN_IMPL_BEGIN  // header-only: -O1 (core/macros.hpp)

    namespace dtrain::detail {
  DTRAIN_DECL std::string quoted_path(const std::filesystem::path& p) {
    std::string s(1, '\'');
    s += p.native();
    s += '\'';
    return s;
  }

  DTRAIN_DECL std::filesystem::path contained_path(const std::filesystem::path& dir, std::string_view name,
                                                   std::string_view what, links policy) {
    namespace fs = std::filesystem;
    // The name as the message shows it: control bytes escaped (a NUL would
    // cut the message short), a long name cut.
    std::string shown;
    for (const char c : name.substr(0, 80)) {
      const auto u = static_cast<unsigned char>(c);
      if (u < 0x20 || u == 0x7f) {
        static constexpr char hex[] = "0123456789abcdef";
        shown += {'\\', 'x', hex[u >> 4], hex[u & 0xf]};
      } else {
        shown += c;
      }
    }
    if (name.size() > 80) shown += "...";
    const auto refuse = [&](const std::string& problem) {
      throw checkpoint_error(std::string(what) + " names the file '" + shown + "', which " + problem,
                             "a checkpoint names only files in its own directory: this one is damaged or was made "
                             "to read other files; use a copy from a source you trust");
    };
    const auto in_dir = " " + quoted_path(dir.empty() ? fs::path(".") : dir);
    if (name.empty()) refuse("is empty, not a file in" + in_dir);
    if (name.find('\0') != std::string_view::npos) refuse("holds a NUL byte, which no file name can");
    if (name.front() == '/') refuse("is an absolute path, not a file in" + in_dir);
    for (std::size_t at = 0; at <= name.size();) {
      const std::size_t next = std::min(name.find_first_of("/\\", at), name.size());
      if (name.substr(at, next - at) == "..") refuse("climbs out of its directory" + in_dir + " with \"..\"");
      at = next + 1;
    }
    if (name == ".") refuse("is the directory" + in_dir + " itself, not a file in it");
    if (name.find_first_of("/\\") != std::string_view::npos)
      refuse("has a path separator: only a plain file name in" + in_dir + " is read");
    if (name.size() > 255) refuse("is longer than the 255 bytes a file name can have");
    // A name that passes the checks above is a file in `dir`, unless it is
    // a symbolic link: resolved, it must still be inside `dir`.
    const fs::path path = dir / fs::path(std::string(name));
    if (policy == links::follow) return path;
    std::error_code ec;
    const fs::path real_dir = fs::weakly_canonical(dir.empty() ? fs::path(".") : dir, ec);
    fs::path real;
    if (!ec) real = fs::weakly_canonical(path, ec);
    if (ec) refuse("cannot be resolved in" + in_dir + ": " + ec.message());
    const fs::path rel = real.lexically_relative(real_dir);
    if (rel == ".") refuse("is a symbolic link to its directory" + in_dir + ", not a file in it");
    if (rel.empty() || *rel.begin() == "..")
      refuse("is a symbolic link to " + quoted_path(real) + ", outside its directory " + quoted_path(real_dir));
    return path;
  }

  DTRAIN_DECL void write_all(int fd, std::span<const std::byte> bytes, const std::filesystem::path& tmp) {
    while (!bytes.empty()) {
      const ::ssize_t n = ::write(fd, bytes.data(), bytes.size());
      if (n < 0 && errno == EINTR) continue;
      if (n < 0)
        throw checkpoint_error("writing " + quoted_path(tmp) + " failed: " + errno_text(),
                               "check free disk space and quotas");
      bytes = bytes.subspan(static_cast<std::size_t>(n));
    }
  }

  DTRAIN_DECL void sync_directory(std::filesystem::path dir, const std::string& what) {
    if (dir.empty()) dir = ".";
    const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    const bool synced = dfd >= 0 && ::fsync(dfd) == 0;
    if (dfd >= 0) ::close(dfd);
    if (!synced)
      throw checkpoint_error(what + " but could not fsync its directory " + quoted_path(dir) + ": " + errno_text(),
                             "the file is complete, but a crash now could lose it; check the file system");
  }

  DTRAIN_DECL AtomicFile::AtomicFile(std::filesystem::path path) : path_(std::move(path)), tmp_(path_) {
    tmp_ += ".tmp";
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0)
      throw checkpoint_error("cannot create " + quoted_path(tmp_) + ": " + errno_text(),
                             "check that the directory exists and is writable");
  }

  DTRAIN_DECL AtomicFile::~AtomicFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(tmp_.c_str());
  }

  DTRAIN_DECL auto AtomicFile::commit()->void {
    if (::fsync(fd_) != 0)
      throw checkpoint_error("fsync of " + quoted_path(tmp_) + " failed: " + errno_text(),
                             "check the file system's health and free space");
    const int closing = std::exchange(fd_, -1);
    if (::close(closing) != 0)
      throw checkpoint_error("closing " + quoted_path(tmp_) + " failed: " + errno_text(),
                             "check the file system's health and free space");
    if (::rename(tmp_.c_str(), path_.c_str()) != 0)
      throw checkpoint_error("renaming " + quoted_path(tmp_) + " to " + quoted_path(path_) + " failed: " + errno_text(),
                             "check the permissions of the target directory");
    committed_ = true;
    sync_directory(path_.parent_path(), "wrote " + quoted_path(path_));
  }

  DTRAIN_DECL void write_file_atomically(const std::filesystem::path& path,
                                         std::span<const std::span<const std::byte>> pieces) {
    AtomicFile file(path);
    for (const auto piece : pieces) file.write(piece);
    file.commit();
  }

}  // namespace dtrain::detail

DTRAIN_IMPL_END
