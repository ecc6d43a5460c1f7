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
