#pragma once
// The hf tests' way to run a program (train_lm, dtrain-run, a Python
// script): through the shell, its output into a log file the test quotes
// when it fails.

#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "launch/process.hpp"  // dtrain::test::read_text

namespace dtrain::testing {

// Runs `cmd` with stdout and stderr in `log`; its exit status (128 if killed).
inline int run_logged(const std::string& cmd, const std::filesystem::path& log) {
  const int status = std::system((cmd + " > " + log.string() + " 2>&1").c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

using dtrain::test::read_text;

}  // namespace dtrain::testing
