#pragma once
// dtrain-estimate run as a command (DTRAIN_ESTIMATE_PATH, set by
// tests/tools/CMakeLists.txt) by the tests of its command line.

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>
#include <utility>

#include <boost/test/unit_test.hpp>

namespace dtrain::testing {

// Runs dtrain-estimate; returns its exit status and its output (stdout and stderr).
inline std::pair<int, std::string> run_cli(const std::string& args) {
  const std::string cmd = std::string(DTRAIN_ESTIMATE_PATH) + " " + args + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  BOOST_REQUIRE(pipe != nullptr);
  std::string out;
  std::array<char, 4096> buf{};
  while (const std::size_t n = std::fread(buf.data(), 1, buf.size(), pipe)) out.append(buf.data(), n);
  const int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128, out};
}

}  // namespace dtrain::testing
