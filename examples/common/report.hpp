#pragma once
// How an example reports the failure that ends it: "<program>: error: <what>"
// on stderr, once, and recorded for the launcher (dtrain::record_failure:
// dtrain-run names the rank whose error came first, and exits with its code).
//
// run_training reports a failure while its Trainer, and so its communicator,
// still exist, and only then lets the exception unwind. The moment this
// rank's communicator is destroyed its peers see it leave and fail too
// ("rank 0 left the communicator"), and unwinding can take seconds (rank 0's
// rendezvous store waits for the other ranks to hang up); reported from
// main's handler, after all that, the cause would reach the log after the
// peers' echoes of it. main's handler then finds the exception reported.

#include <errno.h>  // program_invocation_short_name (glibc): the name the program was started as

#include <cstdio>
#include <cstdlib>
#include <exception>

#include "dtrain/core/error.hpp"

namespace examples {

// Call from a catch handler.
inline void report_failure(const std::exception& e) {
  static std::exception_ptr reported;
  const std::exception_ptr now = std::current_exception();
  if (now && now == reported) return;  // the same object, rethrown with `throw;`
  reported = now;
  std::fprintf(stderr, "%s: error: %s\n", program_invocation_short_name, e.what());
  std::fflush(stderr);
  dtrain::record_failure(e);
}

// The exit status for the failure that ends the program (dtrain::exit_code).
// After a blas_pool_error a normal exit would wait forever for OpenBLAS's
// stuck threads, so the program ends here, its output flushed.
inline int exit_status(const std::exception& e) {
  if (dynamic_cast<const dtrain::blas_pool_error*>(&e)) {
    std::fflush(nullptr);
    std::_Exit(dtrain::exit_code(e));
  }
  return dtrain::exit_code(e);
}

}  // namespace examples
