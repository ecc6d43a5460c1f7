// dtrain-run: starts one process per local rank and supervises the group.
// Options, rank environments and output prefixing are decided in
// <launcher/launcher.hpp>; this file owns the processes.
//
// Process model (why it is built this way):
//  - Each rank runs in its own process group. A terminal's Ctrl-C then reaches
//    dtrain-run alone, which forwards it once (in the launcher's group, ranks
//    would get it twice: from the terminal and forwarded), and signalling the
//    group also reaches whatever the rank itself started (a wrapper script's
//    child), so nothing is left behind.
//  - Signal handlers only write the signal number into a pipe that the main
//    loop polls together with the ranks' output pipes; every decision happens
//    in the loop, none in a handler.
//  - On Linux each rank also gets PR_SET_PDEATHSIG, so even a dtrain-run killed
//    by SIGKILL (which it cannot forward) leaves no orphans behind.

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include <array>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "launcher/launcher.hpp"

#include "dtrain/version.hpp"

namespace {

using Clock = std::chrono::steady_clock;

constexpr std::array handled_signals = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGCHLD, SIGPIPE};

// What a rank exits with after saving a checkpoint on a preemption notice
// (dtrain::preempted_exit_code, run/preemption.hpp): the job should be
// requeued, not restarted here, so dtrain-run exits with it too.
constexpr int preempted_exit_code = 75;

int signal_pipe[2] = {-1, -1};

extern "C" void note_signal(int sig) {
  int saved = errno;
  auto byte = static_cast<unsigned char>(sig);
  // A full pipe already holds a wake-up; losing this byte loses nothing.
  [[maybe_unused]] auto n = ::write(signal_pipe[1], &byte, 1);
  errno = saved;
}

void write_all(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    // The reader went away (EPIPE; SIGPIPE is ignored): drop the output but
    // keep supervising, the ranks must still be stopped and reaped.
    if (n <= 0) return;
    data.remove_prefix(static_cast<std::size_t>(n));
  }
}

std::string seconds(double s) {
  char text[32];
  std::snprintf(text, sizeof(text), "%g s", s);
  return text;
}

void say(const std::string& message) { write_all(2, "dtrain-run: " + message + "\n"); }

// Installs the launcher's handlers (SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1
// and SIGUSR2 are forwarded to the ranks; SIGCHLD wakes the loop) and remembers what it inherited, which
// each rank gets back before exec (an ignored SIGPIPE or a blocked signal
// would otherwise leak into the program through exec).
class LauncherSignals {
 public:
  LauncherSignals() {
    if (::pipe2(signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0)
      throw dtrain::launch_error(std::string("pipe2: ") + std::strerror(errno));
    ::sigprocmask(SIG_SETMASK, nullptr, &inherited_mask_);
    sigset_t ours;
    sigemptyset(&ours);
    for (std::size_t i = 0; i < handled_signals.size(); ++i) {
      int sig = handled_signals[i];
      ::sigaction(sig, nullptr, &inherited_[i]);
      // A signal ignored on entry (nohup, a background job's SIGINT) stays
      // ignored, for dtrain-run and, through exec, for the ranks.
      if (sig != SIGCHLD && sig != SIGPIPE && inherited_[i].sa_handler == SIG_IGN) continue;
      struct sigaction sa {};
      sa.sa_handler = sig == SIGPIPE ? SIG_IGN : note_signal;
      sa.sa_flags = SA_RESTART | (sig == SIGCHLD ? SA_NOCLDSTOP : 0);
      sigfillset(&sa.sa_mask);
      ::sigaction(sig, &sa, nullptr);
      sigaddset(&ours, sig);
    }
    ::sigprocmask(SIG_UNBLOCK, &ours, nullptr);
  }

  // Async-signal-safe: runs in the forked rank before exec.
  void restore_in_child() const noexcept {
    for (std::size_t i = 0; i < handled_signals.size(); ++i) ::sigaction(handled_signals[i], &inherited_[i], nullptr);
    ::sigprocmask(SIG_SETMASK, &inherited_mask_, nullptr);
  }

  int fd() const { return signal_pipe[0]; }

  std::vector<int> take() const {
    std::vector<int> sigs;
    unsigned char buf[64];
    ssize_t n;
    while ((n = ::read(signal_pipe[0], buf, sizeof(buf))) > 0) sigs.insert(sigs.end(), buf, buf + n);
    return sigs;
  }

  // Ends dtrain-run by `sig`, so its parent (a shell loop, a scheduler) sees
  // the same cause of death the ranks saw.
  [[noreturn]] void die_by(int sig) const {
    ::signal(sig, SIG_DFL);
    sigset_t one;
    sigemptyset(&one);
    sigaddset(&one, sig);
    ::sigprocmask(SIG_UNBLOCK, &one, nullptr);
    ::raise(sig);
    std::_Exit(128 + sig);
  }

 private:
  sigset_t inherited_mask_{};
  std::array<struct sigaction, handled_signals.size()> inherited_{};
};

// The program as given on the command line, resolved against PATH once so a
// typo is reported before any rank starts.
std::string find_program(const std::string& name) {
  auto runnable = [](const std::string& path) {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
  };
  if (name.find('/') != std::string::npos) {
    if (runnable(name)) return name;
  } else if (const char* path = std::getenv("PATH")) {
    std::string_view dirs = path;
    while (true) {
      auto colon = dirs.find(':');
      std::string dir(dirs.substr(0, colon));
      std::string candidate = (dir.empty() ? "." : dir) + "/" + name;
      if (runnable(candidate)) return candidate;
      if (colon == std::string_view::npos) break;
      dirs.remove_prefix(colon + 1);
    }
  }
  throw dtrain::launch_error("cannot run '" + name + "': not found or not executable",
                             "check the path, or that the program is on PATH");
}

std::vector<char*> c_strings(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (auto& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

struct Stream {
  int fd = -1;     // read end of the rank's pipe; -1 once closed
  int target = 1;  // dtrain-run's own stdout or stderr
  dtrain::LinePrefixer lines;
  int log = -1;  // the rank's log file under --tee, written as it comes; -1 for none
};

struct Rank {
  int rank = 0;
  pid_t pid = -1;
  bool running = false;
  // The streams dtrain-run copies: those it prefixes or tees. A stream that
  // goes only to a log file (--redirects) or unprefixed to the console is
  // the rank's own file descriptor, with nothing to copy.
  std::vector<Stream> streams;
};

struct Failure {
  int rank = 0;
  int exit_code = 1;
};

struct Outcome {
  std::optional<Failure> failure;
  int signal = 0;     // a signal dtrain-run received and forwarded (not a notice)
  int preempted = 0;  // ranks that exited with preempted_exit_code
};

// One start of all local ranks, run until every one of them has been reaped.
class Group {
 public:
  Group(const dtrain::RunOptions& opts, const dtrain::GroupLayout& layout, const std::string& path,
        const std::vector<std::string>& inherited_env, const LauncherSignals& signals)
      : opts_(opts), layout_(layout), path_(path), env_(inherited_env), signals_(signals) {}

  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;

  // Reached only when run() was left by an exception: nothing may outlive us.
  ~Group() {
    for (auto& r : ranks_) {
      if (!r.running) continue;
      ::kill(-r.pid, SIGKILL);
      while (::waitpid(r.pid, nullptr, 0) < 0 && errno == EINTR) {
      }
    }
    for (auto& r : ranks_)
      for (auto& s : r.streams) close_stream(s);
  }

  Outcome run() {
    ranks_.reserve(static_cast<std::size_t>(layout_.nproc_per_node));
    for (int local = 0; local < layout_.nproc_per_node && !stopping_; ++local) {
      try {
        start(local);
      } catch (const dtrain::launch_error& e) {
        say(e.problem());
        fail(global_rank(local), 127);
      }
    }
    while (any_running()) {
      poll_once();
      if (kill_at_ && Clock::now() >= *kill_at_) {
        say("rank(s) " + running_ranks() + " still running " + seconds(opts_.grace_period_s) +
            " after being stopped; sending SIGKILL");
        kill_now();
      }
    }
    if (outcome_.failure && !outcome_.signal) find_root_cause();
    // Stopping tore the ranks down; whatever their process groups still hold
    // (a child a rank started) goes too. A reaped group id is not reused
    // while any member lives, so this reaches only leftovers.
    if (stopping_)
      for (auto& r : ranks_)
        if (r.pid > 0) ::kill(-r.pid, SIGKILL);
    return outcome_;
  }

 private:
  int global_rank(int local) const { return opts_.node_rank * layout_.nproc_per_node + local; }

  bool any_running() const {
    for (const auto& r : ranks_)
      if (r.running) return true;
    return false;
  }

  void start(int local) {
    Rank& r = ranks_.emplace_back();
    r.rank = global_rank(local);
    auto env = dtrain::rank_environment(opts_, layout_, local, env_);
    std::vector<std::string> args{opts_.program};
    args.insert(args.end(), opts_.program_args.begin(), opts_.program_args.end());
    auto envp = c_strings(env);
    auto argv = c_strings(args);

    // Per stream (stdout, stderr): `pipes` when dtrain-run copies it (to
    // prefix or tee it), `logs` when it goes to a log file. The child's end
    // is the pipe's write end, else the log file, else dtrain-run's own.
    // exec_status reports an exec failure's errno; a successful exec closes
    // it (O_CLOEXEC) and the parent reads end-of-file.
    std::array<std::array<int, 2>, 2> pipes{{{-1, -1}, {-1, -1}}};
    std::array<int, 2> logs{-1, -1}, exec_status{-1, -1};
    std::array<dtrain::StreamRoute, 2> routes;
    const auto close_everything = [&] {
      close_all({pipes[0][0], pipes[0][1], pipes[1][0], pipes[1][1], logs[0], logs[1], exec_status[0], exec_status[1]});
    };
    const std::string failed_start = "could not start rank " + std::to_string(r.rank) + ": ";
    if (!layout_.error_dir.empty()) {  // a fresh place for its error record (restarts reuse none)
      const auto file = dtrain::rank_error_file(layout_.error_dir, layout_.restart_count, local);
      std::error_code ec;
      std::filesystem::create_directories(file.parent_path(), ec);
      std::filesystem::remove(file, ec);
    }
    for (int k = 0; k < 2; ++k) {
      const int stream = k == 0 ? dtrain::StdStreams::out : dtrain::StdStreams::err;
      routes[k] = dtrain::stream_route(opts_, local, stream);
      if (routes[k].file) {
        const auto file = dtrain::rank_log_file(layout_.log_dir, layout_.restart_count, local, stream);
        std::error_code ec;
        std::filesystem::create_directories(file.parent_path(), ec);
        logs[k] = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (logs[k] < 0) {
          std::string reason = std::strerror(errno);
          close_everything();
          throw dtrain::launch_error(failed_start + "cannot write " + file.string() + ": " + reason);
        }
      }
      const bool copied = routes[k].console && (opts_.prefix || routes[k].file);
      if (copied && ::pipe2(pipes[k].data(), O_CLOEXEC) != 0) {
        std::string reason = std::strerror(errno);
        close_everything();
        throw dtrain::launch_error(failed_start + reason);
      }
    }
    int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (devnull < 0 || ::pipe2(exec_status.data(), O_CLOEXEC) != 0) {
      std::string reason = std::strerror(errno);
      close_all({devnull});
      close_everything();
      throw dtrain::launch_error(failed_start + reason);
    }
    std::array<int, 2> child_fds{};
    for (int k = 0; k < 2; ++k) child_fds[k] = pipes[k][1] >= 0 ? pipes[k][1] : routes[k].console ? -1 : logs[k];

    // Signals stay blocked across fork so no handler of ours runs in the
    // child before it has restored the inherited dispositions.
    sigset_t all, old;
    sigfillset(&all);
    ::sigprocmask(SIG_BLOCK, &all, &old);
    pid_t launcher = ::getpid();
    pid_t pid = ::fork();
    if (pid == 0) exec_rank(launcher, devnull, child_fds[0], child_fds[1], exec_status[1], argv.data(), envp.data());
    int fork_errno = errno;
    ::sigprocmask(SIG_SETMASK, &old, nullptr);
    close_all({devnull, pipes[0][1], pipes[1][1], exec_status[1]});
    pipes[0][1] = pipes[1][1] = exec_status[1] = -1;
    if (pid < 0) {
      close_everything();
      throw dtrain::launch_error(failed_start + "fork: " + std::strerror(fork_errno));
    }
    // Also set here: whichever of parent and child runs first, the group
    // exists before dtrain-run may signal it.
    ::setpgid(pid, pid);
    r.pid = pid;
    r.running = true;
    const std::string prefix = opts_.prefix ? "[rank " + std::to_string(r.rank) + "] " : "";
    for (int k = 0; k < 2; ++k) {
      if (pipes[k][0] >= 0) {
        // The stream keeps a teed log file; a redirected one is the child's now.
        r.streams.push_back({pipes[k][0], k + 1, dtrain::LinePrefixer(prefix), logs[k]});
        ::fcntl(pipes[k][0], F_SETFL, O_NONBLOCK);
      } else {
        close_all({logs[k]});
      }
    }
    int child_errno = 0;
    ssize_t n;
    while ((n = ::read(exec_status[0], &child_errno, sizeof(child_errno))) < 0 && errno == EINTR) {
    }
    ::close(exec_status[0]);
    if (n > 0)  // the rank exits 127 and is reaped by the loop
      throw dtrain::launch_error("could not start rank " + std::to_string(r.rank) + ": exec " + path_ + ": " +
                                 std::strerror(child_errno));
  }

  // Runs in the forked child: async-signal-safe calls only, since the parent
  // may have threads (the CUDA driver's, after cuInit).
  [[noreturn]] void exec_rank(pid_t launcher, int devnull, int out, int err, int exec_status, char* const* argv,
                              char* const* envp) const noexcept {
    ::setpgid(0, 0);
#ifdef __linux__
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != launcher) ::_exit(127);  // dtrain-run died before prctl
#endif
    ::dup2(devnull, 0);
    if (out >= 0) ::dup2(out, 1);
    if (err >= 0) ::dup2(err, 2);
    signals_.restore_in_child();
    ::execve(path_.c_str(), argv, envp);
    int e = errno;
    [[maybe_unused]] auto n = ::write(exec_status, &e, sizeof(e));
    ::_exit(127);
  }

  void poll_once() {
    std::vector<pollfd> fds{{signals_.fd(), POLLIN, 0}};
    std::vector<Stream*> streams;
    for (auto& r : ranks_)
      for (auto& s : r.streams)
        if (s.fd >= 0) {
          fds.push_back({s.fd, POLLIN, 0});
          streams.push_back(&s);
        }
    int timeout_ms = -1;
    if (kill_at_) {
      auto left = std::chrono::ceil<std::chrono::milliseconds>(*kill_at_ - Clock::now());
      timeout_ms = static_cast<int>(std::max<std::int64_t>(0, left.count()));
    }
    if (::poll(fds.data(), fds.size(), timeout_ms) < 0) {
      if (errno == EINTR) return;
      throw dtrain::launch_error(std::string("poll: ") + std::strerror(errno));
    }
    for (std::size_t i = 1; i < fds.size(); ++i)
      if (fds[i].revents != 0) pump(*streams[i - 1]);
    if (fds[0].revents != 0) {
      for (int sig : signals_.take()) {
        if (sig == SIGCHLD)
          reap();
        else
          on_launcher_signal(sig);
      }
    }
  }

  // Moves what the rank wrote to dtrain-run's output; false when nothing more
  // is available now.
  bool pump(Stream& s) {
    char buf[64 * 1024];
    ssize_t n = ::read(s.fd, buf, sizeof(buf));
    if (n > 0) {
      if (s.log >= 0) write_all(s.log, {buf, static_cast<std::size_t>(n)});
      write_all(s.target, s.lines.feed({buf, static_cast<std::size_t>(n)}));
      return true;
    }
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return false;
    write_all(s.target, s.lines.finish());
    close_stream(s);
    return false;
  }

  // A reaped rank has written everything it will; what a process it started
  // may still write into the inherited pipe is not waited for.
  void drain(Stream& s) {
    while (s.fd >= 0 && pump(s)) {
    }
    if (s.fd >= 0) {
      write_all(s.target, s.lines.finish());
      close_stream(s);
    }
  }

  static void close_stream(Stream& s) {
    if (s.fd >= 0) ::close(s.fd);
    if (s.log >= 0) ::close(s.log);
    s.fd = s.log = -1;
  }

  static void close_all(std::initializer_list<int> fds) {
    for (int fd : fds)
      if (fd >= 0) ::close(fd);
  }

  // Collects every rank that has ended. When several failed before one pass
  // saw them (a rank killed by a signal, and a peer that noticed the dead
  // rank and exited with an error), a signal death is the cause and is the
  // failure reported; the others are listed too.
  void reap() {
    struct Ended {
      int rank, code;
      pid_t pid;
      bool signalled;
    };
    std::vector<Ended> failed;
    for (auto& r : ranks_) {
      const int local = static_cast<int>(&r - ranks_.data());
      int status = 0;
      if (!r.running || ::waitpid(r.pid, &status, WNOHANG) != r.pid) continue;
      r.running = false;
      for (auto& s : r.streams) drain(s);
      if (WIFEXITED(status) && WEXITSTATUS(status) == 0) continue;
      if (WIFEXITED(status) && WEXITSTATUS(status) == preempted_exit_code) {
        ++outcome_.preempted;  // saved and asked for a requeue: not a failure; the others follow
        continue;
      }
      const bool signalled = !WIFEXITED(status);
      failed.push_back({r.rank, signalled ? 128 + WTERMSIG(status) : WEXITSTATUS(status), r.pid, signalled});
      failures_.push_back({r.rank, local, failed.back().code, signalled});
    }
    if (failed.empty() || stopping_) return;  // stopped by us: not the cause
    std::stable_partition(failed.begin(), failed.end(), [](const Ended& e) { return e.signalled; });
    for (const Ended& e : failed) {
      std::string how = e.signalled ? "was killed by " + dtrain::signal_name(e.code - 128) + " (exit code "
                                    : std::string("exited with code ");
      how += std::to_string(e.code);
      if (e.signalled) how += ')';
      say("rank " + std::to_string(e.rank) + " (pid " + std::to_string(e.pid) + ") " + how);
    }
    fail(failed.front().rank, failed.front().code);
  }

  void fail(int rank, int code) {
    outcome_.failure = Failure{rank, code};
    failed_at_us_ = dtrain::detail::unix_now_us();
    stop(SIGTERM);
  }

  // The first rank to end is not always the one that failed first: a rank
  // whose peer failed may notice it (its connection closed) and exit before
  // the failing rank has finished unwinding. Ranks that record their error
  // (dtrain::record_failure) say when it was raised; the earliest error
  // raised before the first rank ended is the cause, and its code the exit
  // status. A rank that died by a signal first (a crash) records nothing and
  // stays the cause.
  void find_root_cause() {
    if (layout_.error_dir.empty() || !failed_at_us_) return;
    const auto reported = std::find_if(failures_.begin(), failures_.end(),
                                       [&](const Failed& f) { return f.rank == outcome_.failure->rank; });
    if (reported == failures_.end() || reported->signalled) return;
    const Failed* cause = nullptr;
    dtrain::ErrorRecord first;
    for (const Failed& f : failures_) {
      const auto record =
          dtrain::read_error_record(dtrain::rank_error_file(layout_.error_dir, layout_.restart_count, f.local));
      if (!record || record->raised_at_us > failed_at_us_) continue;
      if (cause && record->raised_at_us >= first.raised_at_us) continue;
      cause = &f;
      first = *record;
    }
    if (!cause || cause->rank == reported->rank) return;
    std::string line = first.message.substr(0, first.message.find('\n'));
    say("rank " + std::to_string(cause->rank) + " failed first (its error was raised " +
        std::to_string((failed_at_us_ - first.raised_at_us) / 1000) + " ms before rank " +
        std::to_string(reported->rank) + " ended): " + line);
    outcome_.failure = Failure{cause->rank, cause->signalled ? first.exit_code : cause->code};
  }

  void on_launcher_signal(int sig) {
    // A notice (Slurm's --signal=USR1@T): passed on; the ranks save and exit
    // with preempted_exit_code on their own, nothing is stopped here.
    if (sig == SIGUSR1 || sig == SIGUSR2) {
      say("received " + dtrain::signal_name(sig) + "; forwarding it to the ranks");
      for (auto& r : ranks_)
        if (r.running) ::kill(-r.pid, sig);
      return;
    }
    if (outcome_.signal != 0) {
      say("received " + dtrain::signal_name(sig) + " again; killing rank(s) " + running_ranks() + " now");
      kill_now();
      return;
    }
    outcome_.signal = sig;
    say("received " + dtrain::signal_name(sig) + "; forwarding it to the ranks");
    stop(sig);
  }

  void stop(int sig) {
    int live = 0;
    for (auto& r : ranks_)
      if (r.running) {
        ::kill(-r.pid, sig);
        ++live;
      }
    if (!stopping_ && live > 0 && sig == SIGTERM && !outcome_.signal)
      say("stopping the other " + std::to_string(live) + " rank(s) with SIGTERM");
    stopping_ = true;
    if (!kill_at_)
      kill_at_ = Clock::now() +
                 std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(opts_.grace_period_s));
  }

  void kill_now() {
    for (auto& r : ranks_)
      if (r.running) ::kill(-r.pid, SIGKILL);
    kill_at_.reset();
  }

  std::string running_ranks() const {
    std::string names;
    for (const auto& r : ranks_)
      if (r.running) names += (names.empty() ? "" : ", ") + std::to_string(r.rank);
    return names;
  }

  struct Failed {
    int rank, local, code;
    bool signalled;
  };
  std::vector<Failed> failures_;   // every rank that failed, stopped ones too, in the order reaped
  std::int64_t failed_at_us_ = 0;  // when the first failure was seen (dtrain::detail::unix_now_us)
  const dtrain::RunOptions& opts_;
  dtrain::GroupLayout layout_;
  const std::string& path_;
  const std::vector<std::string>& env_;
  const LauncherSignals& signals_;
  std::vector<Rank> ranks_;
  Outcome outcome_;
  bool stopping_ = false;
  std::optional<Clock::time_point> kill_at_;
};

void report(const dtrain::error& e) {
  std::string text = "dtrain-run: error: " + e.problem();
  if (!e.fix().empty()) text += "\n  fix: " + e.fix();
  write_all(2, text + "\n");
}

// This launch's id: names its ranks' shared-memory segments (DTRAIN_JOB_ID).
std::string job_id(int restart) {
  std::string id = std::to_string(::getpid());  // appended, not `"r" + ...`: GCC 12 warns falsely there
  id.insert(id.begin(), 'r');
  id += 'x';
  id += std::to_string(restart);
  return id;
}

int launch(const dtrain::RunOptions& opts) {
  int cpus = dtrain::usable_cpu_count();
  int nproc = 0;
  std::string path;
  try {
    bool need_gpus =
        opts.nproc.kind == dtrain::NprocSpec::Kind::gpu || opts.nproc.kind == dtrain::NprocSpec::Kind::automatic;
    nproc = dtrain::resolve_nproc(opts.nproc, need_gpus ? dtrain::cuda_device_count() : 0, cpus);
  } catch (const dtrain::launch_error& e) {
    report(e);
    return 2;
  }
  try {
    path = find_program(opts.program);
  } catch (const dtrain::launch_error& e) {
    report(e);
    return 127;
  }
  std::string log_dir;
  if (dtrain::logs_to_files(opts)) {
    try {
      log_dir = dtrain::make_log_run_dir(opts).string();
    } catch (const dtrain::launch_error& e) {
      report(e);
      return 2;
    }
    say("rank logs (--redirects/--tee) go to " + log_dir + "/attempt_K/LOCAL_RANK/");
  } else if (opts.log_dir) {
    say("--log-dir without --redirects or --tee writes no logs (as torchrun); add --tee 3 to copy them there");
  }
  // The ranks' error records (rank_error_file) go beside their logs, else
  // into a private folder removed when dtrain-run ends; without one the
  // failure reported is the first rank to end.
  std::string error_dir = log_dir;
  if (error_dir.empty()) {
    std::error_code ec;
    std::string pattern = (std::filesystem::temp_directory_path(ec) / "dtrain-run-errors-XXXXXX").string();
    if (!ec && ::mkdtemp(pattern.data())) error_dir = pattern;
  }
  struct RemoveAtEnd {
    std::string dir;
    void now() {
      std::error_code ec;
      if (!dir.empty()) std::filesystem::remove_all(dir, ec);
      dir.clear();
    }
    ~RemoveAtEnd() { now(); }
  } private_errors{error_dir == log_dir ? std::string() : error_dir};
  std::vector<std::string> inherited;
  for (char** e = environ; *e; ++e) inherited.emplace_back(*e);
  LauncherSignals signals;
  bool pick_port = opts.nnodes == 1 && opts.master_port.value_or(0) == 0;
  // One token for the whole launch, restarts included: a rank restarted on
  // this node must still be admitted by the other nodes' ranks.
  const std::string token = dtrain::job_token_for(opts, dtrain::process_env);
  for (int restart = 0;; ++restart) {
    dtrain::GroupLayout layout{
        .nproc_per_node = nproc,
        .master_port = pick_port ? dtrain::free_tcp_port() : opts.master_port.value_or(dtrain::default_master_port),
        .cpu_count = cpus,
        .restart_count = restart,
        .job_id = job_id(restart),
        .log_dir = log_dir,
        .error_dir = error_dir,
        .job_token = token};
    Group group(opts, layout, path, inherited, signals);
    Outcome outcome = group.run();
    dtrain::remove_job_segments(layout.job_id);
    if (outcome.preempted > 0 && !outcome.failure) {
      say(std::to_string(outcome.preempted) + " rank(s) saved a checkpoint on a preemption notice; exiting with code " +
          std::to_string(preempted_exit_code) + " (requeue the job; resume=latest continues it)");
      return preempted_exit_code;
    }
    if (outcome.signal) {
      private_errors.now();
      signals.die_by(outcome.signal);
    }
    if (!outcome.failure) return 0;
    if (restart >= opts.max_restarts) {
      say("rank " + std::to_string(outcome.failure->rank) + " failed; exiting with code " +
          std::to_string(outcome.failure->exit_code));
      return outcome.failure->exit_code;
    }
    say("restarting all " + std::to_string(nproc) + " local rank(s) (restart " + std::to_string(restart + 1) + " of " +
        std::to_string(opts.max_restarts) + ")");
  }
}

}  // namespace

int main(int argc, char** argv) {
  dtrain::RunOptions opts;
  try {
    std::vector<std::string> args(argv + 1, argv + argc);
    opts = dtrain::parse_run_options(args);
    dtrain::check_slurm_nodes(opts, dtrain::process_env);
  } catch (const dtrain::launch_error& e) {
    report(e);
    return 2;
  }
  if (opts.help) {
    write_all(1, dtrain::run_usage());
    return 0;
  }
  if (opts.version) {
    write_all(1, "dtrain-run " + std::string(dtrain::version) + "\n");
    return 0;
  }
  if (opts.new_token) {
    write_all(1, dtrain::new_job_token() + "\n");
    return 0;
  }
  try {
    return launch(opts);
  } catch (const dtrain::error& e) {
    report(e);
  } catch (const std::exception& e) {
    say(std::string("error: ") + e.what());
  }
  return 1;
}
