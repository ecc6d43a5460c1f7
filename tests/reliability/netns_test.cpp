// Multi-node for real, on one machine: two network namespaces joined by a
// veth pair (iproute2), each one a "node" with its own address, and a
// dtrain-run --nnodes 2 --node-rank k --master-addr <node 0's address> inside
// each, training train_mlp over TCP between them.
//
//  - The final parameters equal a single-node run's at the same world size:
//    bit for bit with one rank per node (Gloo between the nodes adds two
//    numbers, as the shared-memory transport does), and within 1e-5 of the
//    largest parameter with two (shared memory within each node, then Gloo:
//    the four gradients are summed in a different order).
//  - Cutting the link mid-run (ip link set ... down) ends every rank within the
//    collective timeout + 5 s, each with one message naming the collective,
//    its sequence number, and the ranks it lost (on the side that lost the
//    rendezvous store, its Gloo peers on the other node, and that it cannot
//    reach rank 0's node).
//
// Creating namespaces needs CAP_NET_ADMIN (root, or a container that allows
// it): where `ip netns add` fails the test exits 77 and CTest reports it
// skipped. tests/reliability/run_multinode.sh runs it on its own.

#define BOOST_TEST_NO_MAIN
#define BOOST_TEST_ALTERNATIVE_INIT_API
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <regex>
#include <string>
#include <vector>

#include "launch/process.hpp"
#include "reliability/jobs.hpp"
#include "support/mlp_job.hpp"
#include <boost/test/unit_test.hpp>

namespace {

using namespace dtrain::test;
using dtrain::testing::small_mlp_job;
namespace fs = std::filesystem;

constexpr int timeout_s = 6;  // the collective timeout of the cut-link runs

std::string ip_binary() {
  for (const char* p : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"})
    if (::access(p, X_OK) == 0) return p;
  return {};
}

// Runs `ip args...`; its stderr when it fails, "" when it succeeded.
std::string ip(std::vector<std::string> args) {
  args.insert(args.begin(), ip_binary());
  Process p(std::move(args));
  const Finished f = p.wait(30);
  return f.exited_with(0) ? std::string() : "ip failed: " + f.err;
}

// Two namespaces, one veth pair: node k is 10.231.0.(k+1) in namespace names[k].
class Nodes {
 public:
  Nodes() {
    const std::string id = std::to_string(::getpid());
    for (int k = 0; k < 2; ++k) {
      names_.push_back("dtrain" + id + "n" + std::to_string(k));
      links_.push_back("dtr" + id + (k ? "b" : "a"));
    }
    for (const auto& n : names_) require(ip({"netns", "add", n}));
    require(ip(
        {"link", "add", links_[0], "netns", names_[0], "type", "veth", "peer", "name", links_[1], "netns", names_[1]}));
    for (int k = 0; k < 2; ++k) {
      require(ip({"-n", names_[k], "addr", "add", address(k) + "/24", "dev", links_[k]}));
      require(ip({"-n", names_[k], "link", "set", "lo", "up"}));
      require(ip({"-n", names_[k], "link", "set", links_[k], "up"}));
    }
  }
  Nodes(const Nodes&) = delete;
  Nodes& operator=(const Nodes&) = delete;
  ~Nodes() {
    for (const auto& n : names_) ip({"netns", "del", n});  // takes the veth pair with it
  }

  static std::string address(int k) { return "10.231.0." + std::to_string(k + 1); }
  const std::string& name(int k) const { return names_[k]; }
  void cut() { require(ip({"-n", names_[0], "link", "set", links_[0], "down"})); }

 private:
  static void require(const std::string& failure) { BOOST_REQUIRE_MESSAGE(failure.empty(), failure); }
  std::vector<std::string> names_, links_;
};

std::vector<std::string> train_mlp(const fs::path& dir, int steps, int timeout, int log_every) {
  return small_mlp_job(TRAIN_MLP_PATH, steps, log_every,
                       {"timeout_s=" + std::to_string(timeout), "save_params=" + (dir / "final.safetensors").string()});
}

// dtrain-run for node k of two, inside its namespace.
std::vector<std::string> on_node(const Nodes& nodes, int k, int per_node, const std::vector<std::string>& program) {
  std::vector<std::string> args{ip_binary(), "netns", "exec", nodes.name(k), "env",
                                // Both nodes' dtrain-run share the job's token, as a job script exports it.
                                "DTRAIN_JOB_TOKEN=netns-test-job-token-0123456789abcdef", DTRAIN_RUN_PATH,
                                "--nproc-per-node", std::to_string(per_node), "--nnodes", "2", "--node-rank",
                                std::to_string(k), "--master-addr", Nodes::address(0), "--master-port", "29517"};
  args.insert(args.end(), program.begin(), program.end());
  return args;
}

// The same job on this machine's loopback, one node.
std::vector<std::string> one_node(int ranks, const std::vector<std::string>& program) {
  std::vector<std::string> args{DTRAIN_RUN_PATH, "--nproc-per-node", std::to_string(ranks)};
  args.insert(args.end(), program.begin(), program.end());
  return args;
}

// Largest |a - b| over every parameter, and the largest |a|.
std::pair<double, double> difference(const Params& a, const Params& b) {
  double diff = 0, scale = 0;
  for (const auto& [name, bytes] : a) {
    const auto& other = b.at(name);
    BOOST_REQUIRE_EQUAL(bytes.size(), other.size());
    std::vector<float> x(bytes.size() / 4), y(bytes.size() / 4);
    std::memcpy(x.data(), bytes.data(), bytes.size());
    std::memcpy(y.data(), other.data(), other.size());
    for (std::size_t i = 0; i < x.size(); ++i) {
      diff = std::max(diff, std::abs(static_cast<double>(x[i]) - y[i]));
      scale = std::max(scale, std::abs(static_cast<double>(y[i])));
    }
  }
  return {diff, scale};
}

void same_as_one_node(int per_node) {
  constexpr int steps = 40;
  TempDir one, two;
  const Finished ref = Process(one_node(2 * per_node, train_mlp(one.path(), steps, 60, 100))).wait(120);
  BOOST_REQUIRE_MESSAGE(ref.exited_with(0), "the single-node run failed:\n" << ref.err);
  Nodes nodes;
  Process n1(on_node(nodes, 1, per_node, train_mlp(two.path(), steps, 60, 100)));
  Process n0(on_node(nodes, 0, per_node, train_mlp(two.path(), steps, 60, 100)));
  const Finished f0 = n0.wait(120), f1 = n1.wait(120);
  BOOST_REQUIRE_MESSAGE(f0.exited_with(0) && f1.exited_with(0), "node 0:\n" << f0.err << "\nnode 1:\n" << f1.err);
  BOOST_TEST(f0.out.find(std::to_string(2 * per_node) + " rank(s)") != std::string::npos, f0.out);
  const Params a = read_params(two.path() / "final.safetensors"), b = read_params(one.path() / "final.safetensors");
  if (per_node == 1) {
    BOOST_TEST((a == b), "the two-node parameters differ from the single-node run's");
  } else {
    const auto [diff, scale] = difference(a, b);
    std::printf("2 nodes x %d ranks vs 1 node x %d: largest difference %.3g (largest parameter %.3g)\n", per_node,
                2 * per_node, diff, scale);
    BOOST_TEST(diff <= 1e-5 * scale);
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(two_nodes_of_one_rank_equal_one_node_bit_for_bit) { same_as_one_node(1); }
BOOST_AUTO_TEST_CASE(two_nodes_of_two_ranks_equal_one_node) { same_as_one_node(2); }

BOOST_AUTO_TEST_CASE(a_cut_link_ends_every_rank_with_the_collective_named) {
  TempDir dir;
  Nodes nodes;
  const auto program = train_mlp(dir.path(), 100000000, timeout_s, 1000);
  Process n1(on_node(nodes, 1, 2, program));
  Process n0(on_node(nodes, 0, 2, program));
  // Cut once training is well under way (rank 0 logs step 1, then every 1000th).
  const bool training = wait_until([&] { return n0.stdout_so_far().find("| loss ") != std::string::npos; }, 60);
  BOOST_REQUIRE_MESSAGE(training, "training never started:\n" << n0.stderr_so_far() << n1.stderr_so_far());
  std::this_thread::sleep_for(std::chrono::seconds(2));
  nodes.cut();
  const double cut = wall_now();
  const Finished f0 = n0.wait(timeout_s + 60);
  const double end0 = wall_now();
  const Finished f1 = n1.wait(timeout_s + 60);
  const double took = std::max(end0, wall_now()) - cut;
  std::printf("link cut: both nodes ended %.2f s later (collective timeout %d s)\n", took, timeout_s);
  BOOST_TEST(!f0.exited_with(0));
  BOOST_TEST(!f1.exited_with(0));
  BOOST_TEST(took <= timeout_s + 5);
  // On each node the first rank to fail says which collective, its number and
  // whom it lost; its launcher then stops the node's other ranks.
  const auto first_error = [](const std::string& err) {
    const auto at = err.find("train_mlp: error: ");
    return at == std::string::npos ? std::string() : err.substr(at, err.find('\n', at) - at);
  };
  const std::string e0 = first_error(f0.err), e1 = first_error(f1.err);
  std::printf("node 0 reports: %s\nnode 1 reports: %s\n", e0.c_str(), e1.c_str());
  BOOST_TEST_INFO("node 0:\n" << f0.err << "\nnode 1:\n" << f1.err);
  BOOST_TEST(e0.find("did not complete") != std::string::npos);
  BOOST_TEST(e0.find("(collective #") != std::string::npos);
  // Node 0 hosts the store and hears nothing more from node 1 (ranks 2, 3).
  BOOST_TEST(e0.find("ranks not heard from since: ") != std::string::npos);
  BOOST_TEST(e1.find("(collective #") != std::string::npos);
  BOOST_TEST(e1.find("the rendezvous store at " + Nodes::address(0) + ":29517 did not answer") != std::string::npos);
  // Cut off from the store, it still names whom it lost: its Gloo peers on
  // node 0 (ranks 0, 1), or, when a node-local wait timed out first, the
  // local rank that never came back from Gloo (2, 3).
  BOOST_TEST(std::regex_search(e1, std::regex(R"(over Gloo \(TCP\): [01]$|in shared memory for rank [23] )")));
  BOOST_TEST(f0.err.find("failed; exiting with code 1") != std::string::npos);
  BOOST_TEST(f1.err.find("failed; exiting with code 1") != std::string::npos);
}

// Whether this process may do all the test does: create a namespace, run a
// program in it (a container may refuse the mounts `ip netns exec` makes),
// and give it a veth pair. Tried on a probe namespace, removed after.
bool namespaces_allowed() {
  const std::string probe = "dtrain" + std::to_string(::getpid()) + "probe";
  if (!ip({"netns", "add", probe}).empty()) return false;
  const bool allowed =
      ip({"netns", "exec", probe, ip_binary(), "link", "show"}).empty() &&
      ip({"-n", probe, "link", "add", "dtrprobea", "type", "veth", "peer", "name", "dtrprobeb"}).empty();
  return ip({"netns", "del", probe}).empty() && allowed;
}

// Exits 77 (skipped) where network namespaces cannot be made.
int main(int argc, char* argv[]) {
  if (ip_binary().empty()) {
    std::puts("no ip binary (Debian: iproute2): multi-node test skipped (exit 77)");
    return 77;
  }
  if (!namespaces_allowed()) {
    std::puts(
        "network namespaces are not allowed here (ip netns add, ip netns exec and veth pairs need "
        "CAP_NET_ADMIN and CAP_SYS_ADMIN): multi-node test skipped (exit 77)");
    return 77;
  }
  return boost::unit_test::unit_test_main([] { return true; }, argc, argv);
}
