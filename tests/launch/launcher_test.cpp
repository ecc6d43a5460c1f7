#include <boost/test/unit_test.hpp>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <string>
#include <vector>

#include "dtrain/launch/launcher.hpp"

namespace {

dtrain::RunOptions parse(std::vector<std::string> args) { return dtrain::parse_run_options(args); }

void check_rejected(std::vector<std::string> args, const std::string& needle) {
  BOOST_TEST_CONTEXT("args starting " << args.front()) {
    BOOST_CHECK_EXCEPTION(parse(args), dtrain::launch_error, [&](const dtrain::launch_error& e) {
      return e.problem().find(needle) != std::string::npos && !e.fix().empty();
    });
  }
}

std::string value_of(const std::vector<std::string>& env, const std::string& name) {
  std::string found;
  int count = 0;
  for (const auto& entry : env)
    if (entry.rfind(name + "=", 0) == 0) {
      found = entry.substr(name.size() + 1);
      ++count;
    }
  BOOST_TEST(count == 1, name << " appears " << count << " times");
  return found;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(launcher_options)

BOOST_AUTO_TEST_CASE(defaults) {
  auto o = parse({"./train", "--lr", "3"});
  BOOST_TEST((o.nproc.kind == dtrain::NprocSpec::Kind::count));
  BOOST_TEST(o.nproc.count == 1);
  BOOST_TEST(o.nnodes == 1);
  BOOST_TEST(o.node_rank == 0);
  BOOST_TEST(o.effective_master_addr() == "127.0.0.1");
  BOOST_TEST(!o.master_port.has_value());
  BOOST_TEST(o.max_restarts == 0);
  BOOST_TEST(o.prefix);
  BOOST_TEST(o.grace_period_s == 5.0);
  BOOST_TEST(o.program == "./train");
  // Everything after PROGRAM belongs to it, flags that look like ours too.
  BOOST_TEST(o.program_args == (std::vector<std::string>{"--lr", "3"}));
}

BOOST_AUTO_TEST_CASE(every_flag_in_both_spellings) {
  auto o = parse({"--nproc-per-node", "4", "--nnodes=3", "--node_rank", "2", "--master-addr",
                  "10.1.1.1", "--master_port=4242", "--max-restarts", "2", "--no-prefix",
                  "--grace_period", "0.25", "prog", "--nnodes", "9"});
  BOOST_TEST(o.nproc.count == 4);
  BOOST_TEST(o.nnodes == 3);
  BOOST_TEST(o.node_rank == 2);
  BOOST_TEST(o.effective_master_addr() == "10.1.1.1");
  BOOST_TEST(*o.master_port == 4242);
  BOOST_TEST(o.max_restarts == 2);
  BOOST_TEST(!o.prefix);
  BOOST_TEST(o.grace_period_s == 0.25);
  BOOST_TEST(o.program_args == (std::vector<std::string>{"--nnodes", "9"}));

  BOOST_TEST((parse({"--nproc_per_node=gpu", "p"}).nproc.kind == dtrain::NprocSpec::Kind::gpu));
  BOOST_TEST((parse({"--nproc-per-node", "auto", "p"}).nproc.kind ==
              dtrain::NprocSpec::Kind::automatic));
  BOOST_TEST(parse({"--no-prefix", "--prefix", "p"}).prefix);
  BOOST_TEST(parse({"--", "--weird-program-name"}).program == "--weird-program-name");
  BOOST_TEST(*parse({"--master-port", "0", "p"}).master_port == 0);
  BOOST_TEST(parse({"--help"}).help);
  BOOST_TEST(parse({"-h"}).help);
  BOOST_TEST(parse({"--version"}).version);
}

BOOST_AUTO_TEST_CASE(bad_flags) {
  check_rejected({"--bogus", "p"}, "unknown option --bogus");
  check_rejected({"--nproc-per-node", "0", "p"}, "--nproc-per-node 0");
  check_rejected({"--nproc-per-node", "many", "p"}, "--nproc-per-node many");
  check_rejected({"--nproc-per-node"}, "needs a value");
  check_rejected({"--nnodes", "0", "p"}, "--nnodes 0");
  check_rejected({"--nnodes", "1:4", "p"}, "elastic");
  check_rejected({"--nnodes", "2", "--node-rank", "2", "--master-addr", "h", "p"}, "--node-rank 2");
  check_rejected({"--node-rank", "-1", "p"}, "--node-rank -1");
  check_rejected({"--nnodes", "2", "--node-rank", "1", "p"}, "needs --master-addr");
  check_rejected({"--nnodes", "2", "--master-addr", "h", "--master-port", "0", "p"},
                 "one node only");
  check_rejected({"--master-port", "65536", "p"}, "--master-port 65536");
  check_rejected({"--master-port", "http", "p"}, "--master-port http");
  check_rejected({"--master-addr=", "p"}, "--master-addr is empty");
  check_rejected({"--max-restarts", "-1", "p"}, "--max-restarts -1");
  check_rejected({"--grace-period", "-1", "p"}, "--grace-period -1");
  check_rejected({"--grace-period", "soon", "p"}, "--grace-period soon");
  check_rejected({"--prefix=yes", "p"}, "takes no value");
  check_rejected({"--nproc-per-node", "2"}, "no PROGRAM");
}

BOOST_AUTO_TEST_CASE(usage_documents_every_flag) {
  auto usage = dtrain::run_usage();
  for (const char* flag : {"--nproc-per-node", "--nnodes", "--node-rank", "--master-addr",
                           "--master-port", "--max-restarts", "--prefix", "--no-prefix",
                           "--grace-period", "--help", "--version", "29500", "127.0.0.1"})
    BOOST_TEST(usage.find(flag) != std::string::npos, flag);
}

BOOST_AUTO_TEST_CASE(nproc_resolution) {
  using K = dtrain::NprocSpec::Kind;
  BOOST_TEST(dtrain::resolve_nproc({K::count, 3}, 8, 64) == 3);
  BOOST_TEST(dtrain::resolve_nproc({K::gpu, 0}, 8, 64) == 8);
  BOOST_CHECK_THROW(dtrain::resolve_nproc({K::gpu, 0}, 0, 64), dtrain::launch_error);
  BOOST_TEST(dtrain::resolve_nproc({K::automatic, 0}, 2, 64) == 2);
  BOOST_TEST(dtrain::resolve_nproc({K::automatic, 0}, 0, 6) == 6);
}

BOOST_AUTO_TEST_CASE(host_facts) {
  BOOST_TEST(dtrain::cuda_device_count() >= 0);
  BOOST_TEST(dtrain::usable_cpu_count() >= 1);
  int port = dtrain::free_tcp_port();
  BOOST_TEST(port >= 1);
  BOOST_TEST(port <= 65535);
  // The port really is free: we can listen on it.
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  BOOST_TEST(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  ::close(fd);
}

BOOST_AUTO_TEST_CASE(rank_environment) {
  auto o = parse({"--nnodes", "2", "--node-rank", "1", "--master-addr", "n0", "p"});
  dtrain::GroupLayout g{
      .nproc_per_node = 3, .master_port = 777, .cpu_count = 8, .restart_count = 2, .job_id = "r42x2"};
  std::vector<std::string> inherited{"PATH=/bin", "RANK=99", "OMP_NUM_THREADS=5",
                                     "MASTER_ADDR=old"};
  auto env = dtrain::rank_environment(o, g, 2, inherited);
  BOOST_TEST(value_of(env, "PATH") == "/bin");
  BOOST_TEST(value_of(env, "RANK") == "5");
  BOOST_TEST(value_of(env, "WORLD_SIZE") == "6");
  BOOST_TEST(value_of(env, "DTRAIN_JOB_ID") == "r42x2");
  BOOST_TEST(value_of(env, "LOCAL_RANK") == "2");
  BOOST_TEST(value_of(env, "LOCAL_WORLD_SIZE") == "3");
  BOOST_TEST(value_of(env, "GROUP_RANK") == "1");
  BOOST_TEST(value_of(env, "MASTER_ADDR") == "n0");
  BOOST_TEST(value_of(env, "MASTER_PORT") == "777");
  BOOST_TEST(value_of(env, "DTRAIN_RUN") == "1");
  BOOST_TEST(value_of(env, "DTRAIN_RESTART_COUNT") == "2");
  BOOST_TEST(value_of(env, "OMP_NUM_THREADS") == "5");       // the user's choice stays
  BOOST_TEST(value_of(env, "OPENBLAS_NUM_THREADS") == "2");  // 8 cores / 3 ranks

  g.cpu_count = 2;
  auto crowded = dtrain::rank_environment(o, g, 0, {});
  BOOST_TEST(value_of(crowded, "OMP_NUM_THREADS") == "1");  // never 0
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(line_prefixer)

BOOST_AUTO_TEST_CASE(whole_lines_only) {
  dtrain::LinePrefixer p("[rank 3] ");
  BOOST_TEST(p.feed("hel") == "");
  BOOST_TEST(p.feed("lo\nwor") == "[rank 3] hello\n");
  BOOST_TEST(p.feed("ld\n\nnext\nta") == "[rank 3] world\n[rank 3] \n[rank 3] next\n");
  BOOST_TEST(p.finish() == "[rank 3] ta\n");
  BOOST_TEST(p.finish() == "");
}

BOOST_AUTO_TEST_CASE(long_lines_are_split) {
  dtrain::LinePrefixer p("> ", 4);
  BOOST_TEST(p.feed("abcdefghij") == "> abcd\n> efgh\n");
  BOOST_TEST(p.feed("k\n") == "> ijk\n");
  BOOST_TEST(p.finish() == "");
}

BOOST_AUTO_TEST_SUITE_END()
