#pragma once
// Error types. Every dtrain exception says what failed, where (a
// source_location captured at the throw site) and what the user can do.

#include <signal.h>
#include <string.h>  // sigabbrev_np

#include <cerrno>
#include <cstdint>
#include <exception>
#include <source_location>
#include <stdexcept>
#include <string>
#include <system_error>

#include "dtrain/core/macros.hpp"

namespace dtrain {

namespace detail {
// The text of the current errno, for errors from POSIX calls.
inline std::string errno_text() { return std::system_category().message(errno); }

DTRAIN_DECL std::string format_error(const std::string& what, const std::string& fix,
                                     const std::source_location& where);

// Microseconds since the Unix epoch (the system clock: comparable between
// the processes of one machine).
DTRAIN_DECL std::int64_t unix_now_us();
}  // namespace detail

class error : public std::runtime_error {
 public:
  explicit error(const std::string& what, const std::string& fix = {},
                 std::source_location where = std::source_location::current())
      : std::runtime_error(detail::format_error(what, fix, where)),
        problem_(what),
        fix_(fix),
        where_(where),
        raised_at_us_(detail::unix_now_us()) {}

  const std::string& problem() const noexcept { return problem_; }
  const std::string& fix() const noexcept { return fix_; }
  const std::source_location& where() const noexcept { return where_; }
  // When the error was made (thrown), in microseconds since the Unix epoch:
  // how dtrain-run tells the failure that started a job's end from the
  // failures it caused on other ranks (record_failure).
  std::int64_t raised_at_us() const noexcept { return raised_at_us_; }

 private:
  std::string problem_;
  std::string fix_;
  std::source_location where_;
  std::int64_t raised_at_us_;
};

// One subclass per subsystem so callers can catch what they can handle.
// Each spells its constructor: nvcc 13's front end crashes ("compare_expressions:
// bad expr kind") on an inheriting constructor (`using error::error;`) whose
// default argument is std::source_location::current().
class config_error : public error {
 public:
  explicit config_error(const std::string& what, const std::string& fix = {},
                        std::source_location where = std::source_location::current())
      : error(what, fix, where) {}
};

// OpenBLAS's thread pool does not fit the address-space limit (backend/host/device.hpp).
// Some of its threads may be retrying forever for their buffers, and a
// normal exit joins them: a program that catches this should end with
// std::_Exit after flushing its output, as dtrain's programs do.
class blas_pool_error : public config_error {
 public:
  explicit blas_pool_error(const std::string& what, const std::string& fix = {},
                           std::source_location where = std::source_location::current())
      : config_error(what, fix, where) {}
};

class launch_error : public error {
 public:
  explicit launch_error(const std::string& what, const std::string& fix = {},
                        std::source_location where = std::source_location::current())
      : error(what, fix, where) {}
};

// A launch environment variable (RANK, MASTER_PORT, SLURM_*, DTRAIN_*, ...)
// that is malformed or inconsistent with the others: a usage error.
class env_error : public launch_error {
 public:
  explicit env_error(const std::string& what, const std::string& fix = {},
                     std::source_location where = std::source_location::current())
      : launch_error(what, fix, where) {}
};

class comm_error : public error {
 public:
  explicit comm_error(const std::string& what, const std::string& fix = {},
                      std::source_location where = std::source_location::current())
      : error(what, fix, where) {}
};

class cuda_error : public error {
 public:
  explicit cuda_error(const std::string& what, const std::string& fix = {},
                      std::source_location where = std::source_location::current())
      : error(what, fix, where) {}
};

class checkpoint_error : public error {
 public:
  explicit checkpoint_error(const std::string& what, const std::string& fix = {},
                            std::source_location where = std::source_location::current())
      : error(what, fix, where) {}
};

// A step whose loss or gradient norm is not finite, under
// TrainerOptions::on_nonfinite = stop: names the step and the first unit
// with a non-finite gradient.
class nonfinite_error : public error {
 public:
  explicit nonfinite_error(const std::string& what, const std::string& fix = {},
                           std::source_location where = std::source_location::current())
      : error(what, fix, where) {}
};

class nccl_error : public comm_error {
 public:
  nccl_error(int status, const std::string& what, const std::string& fix = {},
             std::source_location where = std::source_location::current())
      : comm_error(what, fix, where), status_(status) {}
  int status() const noexcept { return status_; }

 private:
  int status_;
};

class gloo_error : public comm_error {
 public:
  explicit gloo_error(const std::string& what, const std::string& fix = {},
                      std::source_location where = std::source_location::current())
      : comm_error(what, fix, where) {}
};

// A collective that did not complete in time. Carries the collective's name,
// its sequence number and the ranks that had not reached it.
class timeout_error : public comm_error {
 public:
  explicit timeout_error(const std::string& what, const std::string& fix = {},
                         std::source_location where = std::source_location::current())
      : comm_error(what, fix, where) {}
};

// The exit status a program should end with for an error, the convention of
// the examples and dtrain-run: 2 for a usage error (config_error: a config key
// or value, the command line, a .npy data set or weights that do not fit;
// env_error: a launch environment variable), 1 for anything that failed while
// running (a rank, a collective, a safetensors or checkpoint file found
// unreadable or damaged). A rank killed by signal N shows as 128 + N.
inline int exit_code(const std::exception& e) {
  return dynamic_cast<const config_error*>(&e) || dynamic_cast<const env_error*>(&e) ? 2 : 1;
}

// Records the failure that ends this rank for the launcher, when it asked for
// one (torchrun's convention: the file named by TORCHELASTIC_ERROR_FILE,
// which dtrain-run and torchrun set per rank): the message, when the error
// was raised (error::raised_at_us; now for other exceptions) and the exit
// code the program will end with (exit_code(e) unless given). When ranks
// fail one after another, the first one's error is the cause and the others
// its echoes ("rank 0 left the communicator"); dtrain-run reports the earliest
// recorded error and exits with its code, whichever rank ended first. Call it
// from main's catch handler, before returning; it never throws, and without
// the variable it does nothing.
DTRAIN_DECL void record_failure(const std::exception& e, int code) noexcept;
inline void record_failure(const std::exception& e) noexcept { record_failure(e, exit_code(e)); }

// "SIGTERM", "SIGKILL", ...: how messages name a signal ("signal N" for one
// without a name).
DTRAIN_DECL std::string signal_name(int sig);

}  // namespace dtrain

#if DTRAIN_DEFINE_IMPL
#include "dtrain/core/error.ipp"
#endif
