// Strangers against a job (docs/security.md): the rendezvous store admits
// only clients that prove the job token, refuses the others with a log line
// naming their address, and neither a rank without the token nor hostile
// clients (silent, garbage, an oversized length, a connection flood) stall
// or change a running job: train_mlp at 2 ranks under dtrain-run ends with
// the parameters of an undisturbed run, bit for bit.

#define BOOST_TEST_MODULE reliability_security
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "launch/process.hpp"
#include "reliability/jobs.hpp"
#include "support/mlp_job.hpp"
#include <boost/test/unit_test.hpp>

#include <dtrain/comm/store.hpp>
#include <dtrain/comm/world.hpp>

namespace fs = std::filesystem;
using namespace dtrain::test;
using dtrain::testing::small_mlp_job;

namespace {

const std::string job_token = "security-test-job-token-0123456789abcdef";

// A raw TCP connection to 127.0.0.1:port (-1 if refused): what a stranger has.
int dial(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Whether the server spoke first, as dtrain's store does (its hello, 38 bytes).
bool got_hello(int fd) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, 2000) <= 0) return false;
  char buf[64];
  return ::recv(fd, buf, sizeof buf, 0) >= 4 && std::string_view(buf, 4) == "DTRS";
}

void send_bytes(int fd, const std::string& bytes) {
  std::size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t w = ::send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (w <= 0) return;
    sent += static_cast<std::size_t>(w);
  }
}

// Reads until the peer closes (true) or 3 s pass (false).
bool closed_by_peer(int fd) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  char buf[4096];
  while (std::chrono::steady_clock::now() < until) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    const ssize_t r = ::recv(fd, buf, sizeof buf, 0);
    if (r <= 0) return true;
  }
  return false;
}

std::string random_bytes(std::size_t n, std::mt19937& g) {
  std::string s(n, '\0');
  for (auto& c : s) c = static_cast<char>(g() & 0xff);
  // Not a command where the handshake's 64 bytes end: with no token the
  // parser meets it (random bytes could be a valid request).
  s[0] = s[64] = static_cast<char>(0xee);
  return s;
}

// One kind of hostile client, run against `port` until `stop`; counts the
// attempts that reached a dtrain store (it answered with its hello).
struct Attack {
  std::string name;
  std::function<bool(int port, std::mt19937& g)> once;  // true: reached the store
};

std::vector<Attack> attacks() {
  return {
      {"silent",  // connects, reads the hello, says nothing; held until the handshake deadline
       [](int port, std::mt19937&) {
         const int fd = dial(port);
         if (fd < 0) return false;
         const bool reached = got_hello(fd);
         std::this_thread::sleep_for(std::chrono::milliseconds(300));
         ::close(fd);
         return reached;
       }},
      {"garbage",  // random bytes in place of the handshake (or of a request)
       [](int port, std::mt19937& g) {
         const int fd = dial(port);
         if (fd < 0) return false;
         const bool reached = got_hello(fd);
         send_bytes(fd, random_bytes(4096, g));
         const bool closed = closed_by_peer(fd);
         ::close(fd);
         return reached && closed;
       }},
      {"oversized",  // a valid-looking SET declaring a 4 GiB key
       [](int port, std::mt19937&) {
         const int fd = dial(port);
         if (fd < 0) return false;
         const bool reached = got_hello(fd);
         std::string req(64, '\0');  // an answer to the challenge (all zeros: no proof)
         req += '\x01';
         req += std::string("\xf0\xff\xff\xff", 4);
         req += std::string(1024, 'k');
         send_bytes(fd, req);
         const bool closed = closed_by_peer(fd);
         ::close(fd);
         return reached && closed;
       }},
      {"flood",  // hundreds of connections at once, then all closed
       [](int port, std::mt19937&) {
         std::vector<int> fds;
         for (int i = 0; i < 300; ++i)
           if (const int fd = dial(port); fd >= 0) fds.push_back(fd);
         const bool reached = !fds.empty() && got_hello(fds.back());
         for (int fd : fds) ::close(fd);
         return reached;
       }},
      {"wrong token",  // a dtrain client with another job's token
       [](int port, std::mt19937&) {
         try {
           dtrain::TcpStore store("127.0.0.1", port, std::chrono::milliseconds(1500),
                                  "another-jobs-token-0123456789abcdef0123");
           store.set("stolen", "x");
           return false;  // admitted: the check below fails the test
         } catch (const dtrain::launch_error& e) {
           return std::string(e.what()).find("refused this rank") != std::string::npos ||
                  std::string(e.what()).find("runs without a job token") != std::string::npos;
         } catch (const dtrain::error&) {
           return false;
         }
       }},
  };
}

int free_port() {
  dtrain::TcpStoreServer probe(0, "127.0.0.1");
  return probe.port();
}

struct Run {
  Finished end;
  Params params;
};

// train_mlp at 2 ranks under dtrain-run on `port`, slowed to last a few
// seconds (rank 0 sleeps 15 ms a step) so the strangers meet it running.
Run train(const fs::path& dir, const std::string& label, int port, const EnvChanges& env) {
  const auto out = dir / (label + ".safetensors");
  auto args = dtrain::testing::launched(
      {DTRAIN_RUN_PATH, "--nproc-per-node", "2", "--master-port", std::to_string(port)},
      small_mlp_job(TRAIN_MLP_PATH, 200, 100, {"save_params=" + out.string(), "timeout_s=60"}));
  EnvChanges all = env;
  all.emplace_back("DTRAIN_FAULT_DELAY", "0:15");
  Process job(args, all, 0, Group::own);
  Run r{job.wait(120), {}};
  if (r.end.exited_with(0)) r.params = read_params(out);
  return r;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(security)

// The store's handshake, in one process: the token admits, anything else is
// refused before it can read or write a key.
BOOST_AUTO_TEST_CASE(the_store_admits_only_the_token) {
  dtrain::TcpStoreServer server(0, "127.0.0.1", job_token);
  const auto timeout = std::chrono::milliseconds(2000);
  dtrain::TcpStore rank("127.0.0.1", server.port(), timeout, job_token);
  rank.set("weights", "secret");
  const auto refused = [&](const std::string& token, const std::string& says) {
    try {
      dtrain::TcpStore stranger("127.0.0.1", server.port(), timeout, token);
      BOOST_ERROR("a client with token '" << token << "' was admitted");
    } catch (const dtrain::launch_error& e) {
      BOOST_TEST(std::string(e.what()).find(says) != std::string::npos, e.what());
    }
  };
  refused("another-jobs-token-0123456789abcdef0123", "refused this rank: its job token is not the job's");
  refused("", "requires the job's token, and this process has none");
  // A stranger's raw bytes: only the 64 of the handshake are read, then the door closes.
  const int fd = dial(server.port());
  BOOST_REQUIRE(fd >= 0);
  BOOST_TEST(got_hello(fd));
  std::string get_request("\x02\x07\x00\x00\x00weights", 12);
  send_bytes(fd, get_request + std::string(64, 'x'));
  BOOST_TEST(closed_by_peer(fd));
  ::close(fd);
  BOOST_TEST(rank.get("weights") == "secret");  // still there, still served

  // A rank with a token does not talk to a store without one (a stranger's, maybe).
  dtrain::TcpStoreServer open_server(0, "127.0.0.1");
  try {
    dtrain::TcpStore r("127.0.0.1", open_server.port(), timeout, job_token);
    BOOST_ERROR("a rank with a token used a store without one");
  } catch (const dtrain::launch_error& e) {
    BOOST_TEST(std::string(e.what()).find("runs without a job token") != std::string::npos, e.what());
  }
}

// A world of several ranks without a token stops at once, saying how to get one.
BOOST_AUTO_TEST_CASE(a_world_without_a_token_stops_at_start) {
  try {
    dtrain::World w(dtrain::World::Layout{1, 2, 1, 2, {}}, "127.0.0.1", free_port(), dtrain::CommOptions{});
    BOOST_ERROR("a rank without a token started");
  } catch (const dtrain::launch_error& e) {
    BOOST_TEST(e.problem().find("rank 1 of a 2-rank job has no job token") != std::string::npos, e.what());
    BOOST_TEST(e.fix().find("DTRAIN_JOB_TOKEN=$(dtrain-run --new-token)") != std::string::npos, e.what());
  }
  dtrain::CommOptions weak;
  weak.job_token = "short";
  BOOST_CHECK_THROW(dtrain::World(dtrain::World::Layout{1, 2, 1, 2, {}}, "127.0.0.1", free_port(), weak),
                    dtrain::config_error);
}

// Limits, in one process: a flood beyond the pending handshakes, silent
// clients past the deadline, an oversized request from an admitted client.
BOOST_AUTO_TEST_CASE(the_store_holds_its_limits) {
  dtrain::StoreLimits limits;
  limits.handshake_timeout = std::chrono::milliseconds(500);
  limits.max_pending = 64;
  limits.max_request_bytes = 1 << 20;
  dtrain::TcpStoreServer server(0, "127.0.0.1", job_token, limits);
  std::vector<int> silent;
  for (int i = 0; i < 500; ++i)
    if (const int fd = dial(server.port()); fd >= 0) silent.push_back(fd);
  BOOST_TEST(silent.size() == 500u);
  // Past max_pending the oldest are closed; a rank still gets in at once.
  const auto start = std::chrono::steady_clock::now();
  dtrain::TcpStore rank("127.0.0.1", server.port(), std::chrono::milliseconds(5000), job_token);
  rank.set("k", "v");
  BOOST_TEST(rank.get("k") == "v");
  BOOST_TEST((std::chrono::steady_clock::now() - start < std::chrono::seconds(3)));
  // Every silent one is closed by the deadline (or the cap).
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));
  std::size_t open = 0;
  for (int fd : silent) {
    pollfd p{fd, POLLIN, 0};
    char buf[64];
    bool eof = false;
    while (::poll(&p, 1, 0) > 0) {
      const ssize_t r = ::recv(fd, buf, sizeof buf, 0);
      if (r <= 0) {
        eof = true;
        break;
      }
    }
    open += eof ? 0 : 1;
    ::close(fd);
  }
  BOOST_TEST(open == 0u);
  // An admitted client that declares a request over the limit is cut off.
  BOOST_CHECK_THROW(rank.set("big", std::string((1 << 20) + 1, 'x')), dtrain::comm_error);
  dtrain::TcpStore again("127.0.0.1", server.port(), std::chrono::milliseconds(2000), job_token);
  BOOST_TEST(again.get("k") == "v");
}

// The whole job: strangers of every kind and a rank with another token hit
// the running job's rendezvous; it finishes with an undisturbed run's
// parameters. Also with DTRAIN_INSECURE_NO_TOKEN=1, where the hostile bytes
// reach the request parser itself.
BOOST_AUTO_TEST_CASE(hostile_clients_change_nothing) {
  TempDir dir;
  const Run clean = train(dir.path(), "clean", free_port(), {});
  BOOST_REQUIRE_MESSAGE(clean.end.exited_with(0), clean.end.out + clean.end.err);
  for (const bool insecure : {false, true}) {
    const std::string label = insecure ? "insecure" : "token";
    const int port = free_port();
    std::atomic<bool> stop{false};
    std::map<std::string, int> reached;
    std::vector<std::thread> threads;
    std::mutex mu;
    for (const auto& a : attacks()) {
      threads.emplace_back([&, a] {
        std::mt19937 g(42);
        while (!stop) {
          const bool ok = a.once(port, g);
          std::lock_guard lock(mu);
          reached[a.name] += ok ? 1 : 0;
          if (!ok) std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
      });
    }
    // A would-be rank 1 with another job's token, started while the job runs.
    Finished rogue;
    std::thread rogue_thread([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(800));
      Process p(small_mlp_job(TRAIN_MLP_PATH, 5, 1), {{"RANK", "1"},
                                                      {"WORLD_SIZE", "2"},
                                                      {"LOCAL_RANK", "0"},
                                                      {"LOCAL_WORLD_SIZE", "1"},
                                                      {"MASTER_ADDR", "127.0.0.1"},
                                                      {"MASTER_PORT", std::to_string(port)},
                                                      {"DTRAIN_JOB_TOKEN", "another-jobs-token-0123456789abcdef0123"},
                                                      {"DTRAIN_INSECURE_NO_TOKEN", std::nullopt},
                                                      {"DTRAIN_COMM_TIMEOUT_S", "5"}});
      rogue = p.wait(60);
    });
    EnvChanges env;
    if (insecure) env = {{"DTRAIN_INSECURE_NO_TOKEN", "1"}};
    const Run run = train(dir.path(), label, port, env);
    rogue_thread.join();
    stop = true;
    for (auto& t : threads) t.join();
    BOOST_TEST_INFO(label);
    BOOST_REQUIRE_MESSAGE(run.end.exited_with(0), label << ": " << run.end.out << run.end.err);
    BOOST_TEST((run.params == clean.params), label << ": the parameters differ from the undisturbed run's");
    for (const auto& a : attacks())
      BOOST_TEST(reached[a.name] > 0, label << ": the " << a.name << " client never reached the running job");
    BOOST_TEST(!rogue.exited_with(0), label << ": the rank with another token was admitted\n" << rogue.err);
    if (!insecure) {
      BOOST_TEST(rogue.err.find("refused this rank") != std::string::npos, rogue.err);
      // Rank 0's log names the strangers' address.
      BOOST_TEST(run.end.err.find("refused a client from 127.0.0.1:") != std::string::npos);
    } else {
      BOOST_TEST(run.end.err.find("WARNING: DTRAIN_INSECURE_NO_TOKEN=1") != std::string::npos);
    }
    std::printf("security_test (%s): reached the running job: ", label.c_str());
    for (const auto& [name, n] : reached) std::printf("%s %d, ", name.c_str(), n);
    std::printf("\n");
  }
}

BOOST_AUTO_TEST_SUITE_END()
