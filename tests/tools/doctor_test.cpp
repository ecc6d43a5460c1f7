// dtrain-doctor as the troubleshooting page runs it, on CPU ranks: its
// setup report, then every collective over the host transport a job would
// use (shared memory, and Gloo with DTRAIN_HOST_TRANSPORT=gloo) at every
// size from 8 B to --max-bytes, each checked, with exit status 0; bad
// arguments exit 2 naming the problem.
#define BOOST_TEST_MODULE doctor
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <boost/test/unit_test.hpp>
#include <launch/process.hpp>

namespace {

using dtrain::test::Finished;
using dtrain::test::Process;

Finished doctor(std::vector<std::string> args, const dtrain::test::EnvChanges& env = {}) {
  args.insert(args.begin(), DTRAIN_DOCTOR_PATH);
  return Process(args, env).wait(120);
}

// Rows of the table for `collective` (and `op`), by message size in bytes.
std::vector<long> sizes_of(const std::string& out, const std::string& collective, const std::string& op) {
  std::vector<long> sizes;
  const std::regex row("^ *([0-9]+) +[0-9]+ +(fp32|bf16|fp16|-) +" + collective + " +" + op + " ");
  std::istringstream lines(out);
  std::smatch m;
  for (std::string line; std::getline(lines, line);)
    if (std::regex_search(line, m, row)) sizes.push_back(std::stol(m[1]));
  return sizes;
}

void check_table(const Finished& f, const std::string& transport) {
  BOOST_TEST_MESSAGE(f.out);
  BOOST_REQUIRE_MESSAGE(f.exited_with(0), f.describe() << "\n" << f.out << f.err);
  for (const char* section : {"cpu cores", "blas threads", "host kernels", "environment", "collective timeout"})
    BOOST_TEST(f.out.find(section) != std::string::npos, "no '" << section << "' line");
  BOOST_TEST(f.out.find("host transport  " + transport + " (2 ranks on 1 node") != std::string::npos, f.out);
  BOOST_TEST(f.out.find("collectives     2 CPU ranks") != std::string::npos, f.out);
  // 8 B growing 4x, and --max-bytes itself (4 KiB)
  const std::vector<long> want{8, 32, 128, 512, 2048, 4096};
  for (const auto& [collective, op] : std::vector<std::pair<std::string, std::string>>{{"all_reduce", "sum"},
                                                                                       {"all_reduce", "avg"},
                                                                                       {"reduce_scatter", "sum"},
                                                                                       {"all_gather", "-"},
                                                                                       {"broadcast", "-"}}) {
    BOOST_TEST_CONTEXT(collective << " " << op) { BOOST_TEST(sizes_of(f.out, collective, op) == want); }
  }
  BOOST_TEST(f.out.find("barrier") != std::string::npos);
  BOOST_TEST(std::regex_search(f.out, std::regex("all [0-9]+ checks passed")), f.out);
}

}  // namespace

BOOST_AUTO_TEST_CASE(two_cpu_ranks_over_shared_memory) {
  check_table(doctor({"--host", "--ranks", "2", "--max-bytes", "4K", "--iters", "2", "--warmup", "1"}), "shm");
}

BOOST_AUTO_TEST_CASE(two_cpu_ranks_over_gloo) {
  check_table(doctor({"--host", "--ranks", "2", "--max-bytes", "4K", "--iters", "2", "--warmup", "1"},
                     {{"DTRAIN_HOST_TRANSPORT", "gloo"}}),
              "gloo");
}

BOOST_AUTO_TEST_CASE(bad_arguments_exit_2_naming_them) {
  const Finished small = doctor({"--host", "--max-bytes", "3"});
  BOOST_TEST(small.exited_with(2), small.describe());
  BOOST_TEST(small.err.find("--max-bytes must be at least 8") != std::string::npos, small.err);
  const Finished suffix = doctor({"--host", "--max-bytes", "4X"});
  BOOST_TEST(suffix.exited_with(2), suffix.describe());
  BOOST_TEST(suffix.err.find("unknown suffix 'X'") != std::string::npos, suffix.err);
  const Finished unknown = doctor({"--hots"});
  BOOST_TEST(unknown.exited_with(2), unknown.describe());
}
