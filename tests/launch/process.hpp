#pragma once
// Runs a launcher (dtrain-run, torchrun, mpirun) or a rank program as a real
// process for the end-to-end tests: output goes to files (no pipe to drain,
// no deadlock), and every wait has a timeout so a broken launcher fails the
// test instead of hanging it.

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <boost/test/unit_test.hpp>

namespace dtrain::test {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

inline std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "dtrain-launch-XXXXXX").string();
    if (!::mkdtemp(pattern.data())) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  const fs::path& path() const { return path_; }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

// What a process that outlived its timeout is doing: for it and each of its
// descendants, every thread's name, scheduler state, the kernel function it
// sleeps in (wchan) and the system call it is in; then, where gdb is
// installed, every thread's stack (of the first four processes). A hang seen once on another machine (the
// GPU machine, CI) then says where it hangs.
inline std::string thread_report(pid_t root) {
  const auto first_line = [](const fs::path& p) {
    std::string s = read_text(p);
    if (const auto nl = s.find('\n'); nl != std::string::npos) s.resize(nl);
    return s;
  };
  // "PID (comm) S PPID ...": the fields after the name, which may hold spaces.
  const auto stat_fields = [&](const fs::path& p) {
    const std::string stat = first_line(p);
    const auto close = stat.rfind(") ");
    std::vector<std::string> fields;
    if (close == std::string::npos) return fields;
    std::istringstream in(stat.substr(close + 2));
    for (std::string f; in >> f;) fields.push_back(f);
    return fields;
  };
  std::vector<pid_t> pids{root};
  for (std::size_t i = 0; i < pids.size() && pids.size() < 16; ++i) {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator("/proc", ec)) {
      const std::string name = e.path().filename().string();
      if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
      const auto f = stat_fields(e.path() / "stat");
      if (f.size() > 1 && f[1] == std::to_string(pids[i])) pids.push_back(std::stoi(name));
    }
  }
  std::ostringstream out;
  for (pid_t pid : pids) {
    const fs::path proc = "/proc/" + std::to_string(pid);
    std::error_code ec;
    out << "process " << pid << " (" << first_line(proc / "comm") << "):\n";
    for (const auto& t : fs::directory_iterator(proc / "task", ec)) {
      const auto f = stat_fields(t.path() / "stat");
      std::string syscall = first_line(t.path() / "syscall");
      syscall = syscall.substr(0, syscall.find(' '));
      out << "  thread " << t.path().filename().string() << " " << first_line(t.path() / "comm") << ": state "
          << (f.empty() ? "?" : f[0]) << ", wchan " << first_line(t.path() / "wchan") << ", syscall " << syscall
          << "\n";
    }
    if (ec) out << "  (its threads could not be read: " << ec.message() << ")\n";
  }
  if (std::system("command -v gdb > /dev/null 2>&1") == 0) {
    const fs::path log = fs::temp_directory_path() / ("dtrain-stacks-" + std::to_string(::getpid()) + ".txt");
    std::string stacks;
    for (std::size_t i = 0; i < pids.size() && i < 4 && stacks.size() < 12000; ++i) {
      const std::string cmd = "timeout 30 gdb -nx -batch -p " + std::to_string(pids[i]) +
                              " -ex 'thread apply all bt 12' > " + log.string() + " 2>&1";
      if (std::system(cmd.c_str()) == -1) break;
      stacks += "gdb, the stacks of process " + std::to_string(pids[i]) + ":\n" + read_text(log);
    }
    if (stacks.size() > 12000) stacks = stacks.substr(0, 12000) + "\n(cut at 12000 characters)\n";
    out << stacks;
    std::error_code ignored;
    fs::remove(log, ignored);
  }
  return out.str();
}

struct Finished {
  int status = 0;
  std::string out, err;
  double seconds = 0;

  bool exited_with(int code) const { return WIFEXITED(status) && WEXITSTATUS(status) == code; }
  bool killed_by(int sig) const { return WIFSIGNALED(status) && WTERMSIG(status) == sig; }
  // "exit 1", "killed by signal 15": for messages.
  std::string describe() const {
    if (WIFEXITED(status)) return "exit " + std::to_string(WEXITSTATUS(status));
    if (WIFSIGNALED(status)) return "killed by signal " + std::to_string(WTERMSIG(status));
    return "status " + std::to_string(status);
  }
};

// Environment changes for the launched process: a value sets, nullopt unsets.
using EnvChanges = std::vector<std::pair<std::string, std::optional<std::string>>>;

// Group::own starts the process in a process group of its own, so that a
// timeout also stops what it started (a launcher's workers and helpers),
// not only the process itself.
enum class Group { shared, own };

class Process {
 public:
  // cpu_limit > 0 restricts the process to that many of our CPUs, so a test
  // of core-count logic behaves the same on a 2-core and a 128-core machine.
  Process(std::vector<std::string> args, const EnvChanges& env = {}, int cpu_limit = 0, Group group = Group::shared)
      : name_(fs::path(args.at(0)).filename().string()),
        out_(dir_ / "stdout"),
        err_(dir_ / "stderr"),
        start_(Clock::now()),
        group_(group) {
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_ = ::fork();
    if (pid_ == 0) {
      if (group == Group::own) ::setpgid(0, 0);
      // The test process is single-threaded, so the child may allocate. Only
      // file descriptors are redirected: flushing the test's stdio buffers
      // here would print its output twice.
      redirect(out_, 1);
      redirect(err_, 2);
      // A shell's background job starts with SIGINT and SIGQUIT ignored, and
      // dtrain-run keeps ignored signals ignored; the tests want the defaults.
      for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT}) ::signal(sig, SIG_DFL);
      if (cpu_limit > 0) limit_cpus(cpu_limit);
      for (const auto& [name, value] : env) {
        if (value)
          ::setenv(name.c_str(), value->c_str(), 1);
        else
          ::unsetenv(name.c_str());
      }
      ::execv(argv[0], argv.data());
      ::_exit(121);
    }
    BOOST_REQUIRE_MESSAGE(pid_ > 0, "fork failed");
    // Also here, so that the group exists before anyone signals it.
    if (group == Group::own) ::setpgid(pid_, pid_);
  }

  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  ~Process() {
    if (pid_ > 0) {
      signal_all(SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }

  pid_t pid() const { return pid_; }

  std::string stderr_so_far() const { return read_text(err_); }
  std::string stdout_so_far() const { return read_text(out_); }

  static void redirect(const std::string& path, int target) {
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || ::dup2(fd, target) < 0) ::_exit(120);
    ::close(fd);
  }

  static void limit_cpus(int n) {
    cpu_set_t mine, kept;
    CPU_ZERO(&kept);
    if (::sched_getaffinity(0, sizeof(mine), &mine) != 0) ::_exit(122);
    for (int cpu = 0; cpu < CPU_SETSIZE && n > 0; ++cpu)
      if (CPU_ISSET(cpu, &mine)) {
        CPU_SET(cpu, &kept);
        --n;
      }
    if (::sched_setaffinity(0, sizeof(kept), &kept) != 0) ::_exit(123);
  }

  Finished wait(double timeout_s = 30) {
    Finished f;
    auto deadline = start_ + std::chrono::duration<double>(timeout_s);
    while (::waitpid(pid_, &f.status, WNOHANG) == 0) {
      if (Clock::now() > deadline) {
        const std::string threads = thread_report(pid_);
        stop(f.status);
        BOOST_FAIL(name_ << " did not finish within " << timeout_s << " s and was killed; stdout:\n"
                         << read_text(out_) << "stderr:\n"
                         << read_text(err_) << "where its threads were:\n"
                         << threads);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    // Whatever the process left running in its group goes with it.
    if (group_ == Group::own) ::kill(-pid_, SIGKILL);
    pid_ = -1;
    f.seconds = std::chrono::duration<double>(Clock::now() - start_).count();
    f.out = read_text(out_);
    f.err = read_text(err_);
    return f;
  }

 private:
  // The process, or its whole group.
  void signal_all(int sig) const { ::kill(group_ == Group::own ? -pid_ : pid_, sig); }

  // A process of its own group is asked to stop first (SIGTERM, which
  // launchers pass on to their workers); then all of the group is killed.
  void stop(int& status) {
    bool reaped = false;
    if (group_ == Group::own) {
      ::kill(-pid_, SIGTERM);
      const auto deadline = Clock::now() + std::chrono::seconds(5);
      while (!(reaped = ::waitpid(pid_, &status, WNOHANG) == pid_) && Clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    signal_all(SIGKILL);
    if (!reaped) ::waitpid(pid_, &status, 0);
    pid_ = -1;
  }

  std::string name_;
  TempDir dir_;
  std::string out_, err_;
  Clock::time_point start_;
  Group group_;
  pid_t pid_ = -1;
};

// A test that runs a program under `ulimit -v` skips in an AddressSanitizer or
// ThreadSanitizer build: both reserve terabytes of shadow address space as
// the process starts, which the limit forbids. GCC says __SANITIZE_ADDRESS__
// and __SANITIZE_THREAD__, clang __has_feature.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool sanitizer_shadow = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
inline constexpr bool sanitizer_shadow = true;
#else
inline constexpr bool sanitizer_shadow = false;
#endif
#else
inline constexpr bool sanitizer_shadow = false;
#endif

inline Finished run(std::vector<std::string> args, const EnvChanges& env = {}, int cpu_limit = 0) {
  Process p(std::move(args), env, cpu_limit);
  return p.wait();
}

// Polls `ready` until it holds; false on timeout.
template <class Ready>
bool wait_until(Ready ready, double timeout_s = 20) {
  auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
  while (Clock::now() < deadline) {
    if (ready()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

inline bool wait_for_files(const std::vector<std::string>& paths) {
  return wait_until(
      [&] { return std::all_of(paths.begin(), paths.end(), [](const auto& p) { return fs::exists(p); }); });
}

// The pids the rank programs recorded, and which of them still exist.
inline std::vector<pid_t> recorded_pids(const TempDir& dir) {
  std::vector<pid_t> pids;
  std::ifstream in(dir / "pids");
  for (pid_t pid; in >> pid;) pids.push_back(pid);
  return pids;
}

// A zombie has ended; whether it lingers depends on who reaps orphans here
// (some container init processes never do), not on dtrain-run.
inline bool running(pid_t pid) {
  if (::kill(pid, 0) != 0) return false;
  std::string stat = read_text("/proc/" + std::to_string(pid) + "/stat");
  auto after_name = stat.rfind(") ");
  return after_name == std::string::npos || stat.compare(after_name + 2, 1, "Z") != 0;
}

inline std::vector<pid_t> survivors(const TempDir& dir) {
  std::vector<pid_t> alive;
  for (pid_t pid : recorded_pids(dir))
    if (running(pid)) alive.push_back(pid);
  return alive;
}

}  // namespace dtrain::test
