// A full file system for real: a small tmpfs mounted in a private mount
// namespace (the test's own, so nothing outside sees it), filled with a
// ballast file and freed again.
//
//  - Trainer::save on the full disk fails on every rank with one message
//    naming ENOSPC, the bytes the rank writes and the free space; the partial
//    files go, the previous checkpoint stays and loads; once the ballast is
//    removed the same save succeeds.
//  - dtrain::fit with on_save_error = continue and keep_last = 1 through a
//    disk that fills at step 3 and is freed at step 5: the save at step 4
//    fails, the step-2 checkpoint is still there while the disk is full (keep
//    last prunes only after a commit), the saves at 6 and 8 succeed, and a
//    resumed run finds step 8 and trains nothing.
//
// Mounting needs a mount namespace: root, or unprivileged user namespaces
// (the test maps its user to root inside one). Where neither is allowed the
// test exits 77 and CTest reports it skipped; the ulimit -f variant of these
// checks (robust_test) runs everywhere.
#define BOOST_TEST_NO_MAIN
#define BOOST_TEST_ALTERNATIVE_INIT_API
#include <fcntl.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "strategy/common.hpp"
#include "support/ranks.hpp"
#include <boost/test/unit_test.hpp>

#include <dtrain/run/fit.hpp>
#include <dtrain/trainer.hpp>

using namespace dtrain;
using namespace dtrain::testing;
namespace fs = std::filesystem;

namespace {

constexpr std::size_t disk_bytes = 1 << 20;  // the tmpfs: room for a few UnevenNet checkpoints

fs::path& mount_point() {
  static fs::path p;
  return p;
}

void write_file(const fs::path& file, const std::string& text) { std::ofstream(file) << text; }

// Enters a private mount namespace (as root, or as root of a new user
// namespace) and mounts the tmpfs. "" on success, else why not.
std::string mount_small_disk() {
  const uid_t uid = ::getuid();
  const gid_t gid = ::getgid();
  if (::unshare(CLONE_NEWNS) != 0) {
    if (::unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0)
      return std::string("no mount namespace (unshare: ") + std::strerror(errno) + ")";
    write_file("/proc/self/setgroups", "deny");
    write_file("/proc/self/uid_map", "0 " + std::to_string(uid) + " 1");
    write_file("/proc/self/gid_map", "0 " + std::to_string(gid) + " 1");
  }
  if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0)
    return std::string("cannot make the mounts private: ") + std::strerror(errno);
  mount_point() = fs::temp_directory_path() / ("dtrain_disk_" + std::to_string(::getpid()));
  fs::create_directories(mount_point());
  const std::string size = "size=" + std::to_string(disk_bytes);
  if (::mount("tmpfs", mount_point().c_str(), "tmpfs", 0, size.c_str()) != 0) {
    const std::string why = std::string("cannot mount a tmpfs: ") + std::strerror(errno);
    fs::remove(mount_point());
    return why;
  }
  return {};
}

std::size_t free_bytes() {
  struct statvfs s {};
  require(::statvfs(mount_point().c_str(), &s) == 0, "statvfs of the tmpfs failed");
  return static_cast<std::size_t>(s.f_bavail) * s.f_frsize;
}

// Fills the disk but `leave` bytes with a ballast file; remove() frees it.
class Ballast {
 public:
  explicit Ballast(std::size_t leave) : file_(mount_point() / "ballast") {
    const std::size_t room = free_bytes();
    require(room > leave, "the tmpfs is fuller than the test expects");
    const int fd = ::open(file_.c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0600);
    require(fd >= 0, "cannot create the ballast file");
    const std::vector<char> block(4096, 'b');  // tmpfs has no fallocate guarantee: write real pages
    std::size_t left = room - leave;
    while (left > 0) {
      const std::size_t n = std::min(left, block.size());
      const ssize_t w = ::write(fd, block.data(), n);
      if (w <= 0) break;
      left -= static_cast<std::size_t>(w);
    }
    ::close(fd);
  }
  Ballast(const Ballast&) = delete;
  Ballast& operator=(const Ballast&) = delete;
  ~Ballast() { remove(); }
  void remove() { fs::remove(file_); }

 private:
  fs::path file_;
};

// A checkpoint folder on the tmpfs, emptied before and after.
struct DiskDir {
  fs::path path;
  explicit DiskDir(const std::string& name) : path(mount_point() / name) { fs::remove_all(path); }
  ~DiskDir() { fs::remove_all(path); }
};

}  // namespace

BOOST_AUTO_TEST_CASE(a_save_on_a_full_file_system) {
  DiskDir dir("save");
  std::vector<std::string> errors(2);
  std::vector<std::int64_t> reloaded(2, -1);
  run_ranks(2, [&](World& w) {
    UnevenNet net;
    Trainer<UnevenNet, Strategy<FSDP<FullShard>>> t(w, net, AdamW{.lr = 1e-2f});
    t.step(micro_batches(0, w.rank(), {6}));
    t.save(dir.path / "good");
    t.step(micro_batches(1, w.rank(), {6}));
    std::optional<Ballast> ballast;
    w.barrier("fill");
    if (w.rank() == 0) ballast.emplace(512);  // bytes: less than a shard file
    w.barrier("filled");
    try {
      t.save(dir.path / "full");
    } catch (const checkpoint_error& e) {
      errors[static_cast<std::size_t>(w.rank())] = e.what();
    }
    w.barrier("failed");
    reloaded[static_cast<std::size_t>(w.rank())] = t.load(dir.path / "good").step;
    t.step(micro_batches(1, w.rank(), {6}));
    if (w.rank() == 0) ballast->remove();
    w.barrier("freed");
    t.save(dir.path / "full");  // the same save, with room again
    require(t.load(dir.path / "full").step == 2, "the save after the disk was freed loads");
  });
  for (const auto& e : errors) {
    BOOST_TEST(e.find("could not write its part of checkpoint") != std::string::npos, e);
    BOOST_TEST(e.find("No space left on device") != std::string::npos, e);
    BOOST_TEST(e.find("bytes are free in " + (dir.path / "full").string()) != std::string::npos, e);
    BOOST_TEST(e.find("the partial files were removed") != std::string::npos, e);
  }
  for (auto step : reloaded) BOOST_TEST(step == 1, "the previous checkpoint loads after the failed save");
}

BOOST_AUTO_TEST_CASE(fit_through_a_disk_that_fills_and_is_freed) {
  DiskDir dir("fit");
  const Dataset data = random_dataset(64, 5);
  const FitOptions o{.steps = 8,
                     .batch_size = 4,
                     .checkpoint_dir = dir.path / "ck",
                     .save_every = 2,
                     .keep_last = 1,
                     .on_save_error = dtrain::save_error_policy::keep_going,
                     .progress = false};
  std::vector<FitResult> results(2);
  std::vector<std::string> while_full;  // the checkpoints rank 0 saw while the disk was full
  run_ranks(2, [&](World& w) {
    UnevenNet net;
    Trainer<UnevenNet, Strategy<DDP>> t(w, net, AdamW{.lr = 1e-2f});
    std::optional<Ballast> ballast;
    FitCallbacks cb;
    // Rank 0 fills the disk after step 3 and frees it after step 5: every
    // rank's save at step 4 comes after rank 0's step 4 (its all-reduce),
    // every save at 6 after rank 0's step 6.
    cb.on_step = [&](const StepStats& st, FitControl&) {
      if (w.rank() != 0) return;
      if (st.step == 3) ballast.emplace(512);
      if (st.step == 5) {
        for (const auto& c : list_checkpoints(o.checkpoint_dir)) while_full.push_back(c.filename().string());
        ballast->remove();
      }
    };
    results[static_cast<std::size_t>(w.rank())] = fit(t, data, o, cb);
  });
  for (const FitResult& r : results) {
    BOOST_TEST(r.steps == 8);
    BOOST_TEST(r.failed_saves == 1, "only the save at step 4 fails: " << r.failed_saves);
  }
  BOOST_TEST(while_full.size() == 1u, "keep_last = 1 kept " << while_full.size() << " checkpoint(s)");
  if (!while_full.empty()) BOOST_TEST(while_full[0] == "step-00000002");
  const auto left = list_checkpoints(o.checkpoint_dir);
  BOOST_TEST((left.size() == 1u && left[0].filename() == "step-00000008"));
  FitOptions again = o;
  again.resume = "latest";
  std::vector<FitResult> resumed(2);
  run_ranks(2, [&](World& w) {
    UnevenNet net;
    Trainer<UnevenNet, Strategy<DDP>> t(w, net, AdamW{.lr = 1e-2f});
    resumed[static_cast<std::size_t>(w.rank())] = fit(t, data, again);
  });
  for (const FitResult& r : resumed) {
    BOOST_TEST(r.first_step == 8);
    BOOST_TEST(r.steps == 8);
  }
}

bool init_unit_test() {
  boost::unit_test::framework::master_test_suite().p_name.value = "disk";
  return true;
}

int main(int argc, char* argv[]) {
  if (const std::string why = mount_small_disk(); !why.empty()) {
    std::printf("disk_test: %s; skipped (exit 77)\n", why.c_str());
    return 77;
  }
  const int rc = boost::unit_test::unit_test_main(&init_unit_test, argc, argv);
  ::umount(mount_point().c_str());
  std::error_code ignored;
  fs::remove(mount_point(), ignored);
  return rc;
}
