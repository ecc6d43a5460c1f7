#pragma once
// Running an example (train_mlp, train_gpt, train_policy) as real processes
// launched by dtrain-run, for the example tests.
#include <sys/wait.h>

#include <cerrno>  // program_invocation_short_name (glibc)
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <boost/test/unit_test.hpp>

#include <dtrain/comm/store.hpp>

namespace dtrain::test {

namespace fs = std::filesystem;

inline int free_port() {
  TcpStoreServer probe(0, "127.0.0.1");
  return probe.port();
}

// A path in this test program's own scratch folder (CTest runs the example
// tests in parallel: each keeps its logs and files apart).
inline fs::path scratch(const std::string& name) {
  const fs::path dir = fs::path(DTRAIN_TEST_BINARY_DIR) / "scratch" / program_invocation_short_name;
  fs::create_directories(dir);
  return dir / name;
}

// scratch(name), emptied.
inline fs::path fresh(const std::string& name) {
  const auto p = scratch(name);
  fs::remove_all(p);
  return p;
}

inline std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// `program args` on `ranks` CPU ranks through dtrain-run, output to
// scratch("last.log"); its exit status (128 when it did not exit).
inline int run_example(const std::string& program, int ranks, const std::string& args) {
  const std::string cmd = "timeout 300 " + std::string(DTRAIN_RUN_PATH) + " --nproc-per-node " + std::to_string(ranks) +
                          " --master-port " + std::to_string(free_port()) + " " + program + " " + args + " > " +
                          scratch("last.log").string() + " 2>&1";
  const int status = std::system(cmd.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

inline std::string last_log() { return read_file(scratch("last.log")); }

// Every record's "loss" from a metrics JSONL file.
inline std::vector<double> losses(const fs::path& metrics) {
  std::ifstream in(metrics);
  std::vector<double> out;
  for (std::string line; std::getline(in, line);) {
    const auto k = line.find("\"loss\": ");
    BOOST_REQUIRE(k != std::string::npos);
    out.push_back(std::stod(line.substr(k + 8)));
  }
  return out;
}

// The value after `"key": ` in a line of JSON.
inline double json_number(const std::string& line, const std::string& key) {
  const auto k = line.find("\"" + key + "\": ");
  BOOST_REQUIRE_MESSAGE(k != std::string::npos, "no " << key << " in " << line);
  return std::stod(line.substr(k + key.size() + 4));
}

}  // namespace dtrain::test
