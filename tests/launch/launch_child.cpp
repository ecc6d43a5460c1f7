// A rank program for dtrain-run's end-to-end tests. Every mode first appends
// its pid to DIR/pids, so a test can check afterwards that none survived.
//   env DIR                    print what dtrain::discover_env() and the raw
//                              variables say, on stdout and stderr
//   fail DIR R CODE [ignore]   rank R exits CODE (or "sigkill": kills itself)
//                              once every rank has started; the others sleep
//                              60 s, ignoring SIGTERM and SIGINT if asked
//   trap-term DIR              on SIGTERM write DIR/term.<rank> and exit 0;
//                              writes DIR/ready.<rank> once the handler is set
//   ignore-signals DIR         ignores SIGTERM and SIGINT, writes
//                              DIR/ready.<rank>, sleeps
//   fail-once DIR CODE         rank 0 exits CODE, once every rank has started,
//                              unless DIR/failed exists (creating it); then
//                              every rank prints restart=<DTRAIN_RESTART_COUNT>
//   echo-failure DIR           rank 0 raises a config_error, records it
//                              (dtrain::record_failure), writes DIR/raised and
//                              sleeps, as a rank slow to unwind; every other
//                              rank then raises a comm_error (the echo), records
//                              it and exits 1 at once

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>

#include "dtrain/core/error.hpp"
#include "dtrain/launch/env.hpp"

namespace {

std::string dir;
std::string term_marker;

std::string var(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "<unset>";
}

int rank() { return std::atoi(var("RANK").c_str()); }

void ignore_stop_signals() {
  ::signal(SIGTERM, SIG_IGN);
  ::signal(SIGINT, SIG_IGN);
}

// Failing only after every rank has recorded its pid makes the tests'
// "nobody survived" check cover all of them (restarts append more pids).
void wait_for_every_rank() {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < deadline) {
    std::ifstream in(dir + "/pids");
    int lines = 0;
    for (std::string line; std::getline(in, line);) ++lines;
    if (lines % std::atoi(var("WORLD_SIZE").c_str()) == 0) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  std::exit(92);
}

void touch(const std::string& path, const std::string& text = "") {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (fd < 0) std::exit(90);
  if (!text.empty() && ::write(fd, text.data(), text.size()) != static_cast<ssize_t>(text.size())) std::exit(91);
  ::close(fd);
}

// Long enough that a test fails on its own timeout, not on this one, if the
// launcher never stops us.
void sleep_long() { std::this_thread::sleep_for(std::chrono::seconds(60)); }

extern "C" void on_term(int) {
  int fd = ::open(term_marker.c_str(), O_WRONLY | O_CREAT, 0644);
  if (fd >= 0) ::close(fd);
  ::_exit(0);
}

int print_env() {
  auto e = dtrain::discover_env();
  std::printf("rank=%d world=%d local=%d local_world=%d addr=%s port=%d source=%s\n", e.rank, e.world_size,
              e.local_rank, e.local_world_size, e.master_addr.c_str(), e.master_port, e.source.c_str());
  std::printf(
      "GROUP_RANK=%s DTRAIN_RUN=%s DTRAIN_RESTART_COUNT=%s OMP_NUM_THREADS=%s "
      "OPENBLAS_NUM_THREADS=%s\n",
      var("GROUP_RANK").c_str(), var("DTRAIN_RUN").c_str(), var("DTRAIN_RESTART_COUNT").c_str(),
      var("OMP_NUM_THREADS").c_str(), var("OPENBLAS_NUM_THREADS").c_str());
  std::printf("TORCHELASTIC_RUN_ID=%s DTRAIN_LAUNCH_DEVICE=%s\n", var("TORCHELASTIC_RUN_ID").c_str(),
              var("DTRAIN_LAUNCH_DEVICE").c_str());
  std::fprintf(stderr, "to stderr from %d\n", e.rank);
  std::printf("unfinished line from %d", e.rank);
  return 0;
}

int fail(int failing_rank, const std::string& code, bool ignore_term) {
  if (rank() == failing_rank) {
    wait_for_every_rank();
    if (code == "sigkill") ::raise(SIGKILL);
    return std::atoi(code.c_str());
  }
  if (ignore_term) ignore_stop_signals();
  sleep_long();
  return 0;
}

int wait_for_term(bool trap) {
  if (trap) {
    term_marker = dir + "/term." + std::to_string(rank());
    ::signal(SIGTERM, on_term);
  } else {
    ignore_stop_signals();
  }
  touch(dir + "/ready." + std::to_string(rank()));
  sleep_long();
  return 1;
}

int fail_once(int code) {
  std::string marker = dir + "/failed";
  if (rank() == 0 && ::access(marker.c_str(), F_OK) != 0) {
    wait_for_every_rank();
    touch(marker);
    return code;
  }
  std::printf("restart=%s\n", var("DTRAIN_RESTART_COUNT").c_str());
  return 0;
}

int echo_failure() {
  const std::string raised = dir + "/raised";
  if (rank() == 0) {
    wait_for_every_rank();
    try {
      throw dtrain::config_error("rank 0's own bad setting", "give a good one");
    } catch (const std::exception& e) {
      dtrain::record_failure(e);
    }
    touch(raised);
    sleep_long();  // until dtrain-run stops it
    return 2;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (::access(raised.c_str(), F_OK) != 0)
    if (std::chrono::steady_clock::now() > deadline)
      return 93;
    else
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // after rank 0's error, measurably
  dtrain::record_failure(dtrain::comm_error("rank 0 left the communicator"));
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) return 64;
  std::string mode = argv[1];
  dir = argv[2];
  touch(dir + "/pids", std::to_string(::getpid()) + "\n");
  if (mode == "env") return print_env();
  if (mode == "fail" && argc >= 5)
    return fail(std::atoi(argv[3]), argv[4], argc >= 6 && std::strcmp(argv[5], "ignore") == 0);
  if (mode == "trap-term") return wait_for_term(true);
  if (mode == "ignore-signals") return wait_for_term(false);
  if (mode == "fail-once" && argc >= 4) return fail_once(std::atoi(argv[3]));
  if (mode == "echo-failure") return echo_failure();
  return 64;
}
