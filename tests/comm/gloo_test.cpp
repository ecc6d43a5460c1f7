#define BOOST_TEST_MODULE comm_gloo
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include <boost/test/unit_test.hpp>
#include <support/ranks.hpp>

#include <dtrain/backend/host/comm.hpp>
#include <dtrain/comm/store.hpp>
#include <dtrain/core/dtype.hpp>
#include <dtrain/run/preemption.hpp>

using namespace dtrain;
using dtrain::testing::random_values;
using dtrain::testing::require;
using dtrain::testing::require_throws;
using dtrain::testing::run_ranks;

namespace {

using Dtypes = std::tuple<float, bf16, fp16>;

// Tolerance relative to the float64 reference: fp32 sums accumulate a few
// ulps over the ring; half types are reduced in fp32 and rounded once, so
// they must be within one half-precision rounding (plus the fp32 error).
template <class T>
double rel_tol() {
  if constexpr (std::is_same_v<T, float>) return 1e-6;
  if constexpr (std::is_same_v<T, bf16>) return 1.0 / 256;  // 2^-8: bf16 has 8 significant bits
  return 1.0 / 2048;                                        // 2^-11: fp16 has 11
}

template <class T>
std::vector<T> as_dtype(const std::vector<double>& v) {
  std::vector<T> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = T(static_cast<float>(v[i]));
  return out;
}

// The values a rank contributes, already rounded to T (the reference sums
// exactly what was sent).
template <class T>
std::vector<double> rank_input(std::size_t n, int rank, std::uint64_t salt) {
  auto v = random_values(n, salt * 131 + static_cast<std::uint64_t>(rank));
  for (auto& x : v) x = static_cast<float>(T(static_cast<float>(x)));
  return v;
}

template <class T>
void check_close(const std::vector<T>& got, const std::vector<double>& want, const std::string& what) {
  require(got.size() == want.size(), what + ": wrong size");
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double g = static_cast<float>(got[i]);
    const double tol = rel_tol<T>() * std::max(1.0, std::abs(want[i]));
    require(std::abs(g - want[i]) <= tol, what + ": element " + std::to_string(i) + " is " + std::to_string(g) +
                                              ", expected " + std::to_string(want[i]));
  }
}

const std::vector<std::size_t> sizes = {0, 1, 7, 1000, 300007};

// Every reference test runs on each host transport: Gloo over TCP, shared
// memory with its default chunk (300007 elements span several chunks), and
// shared memory with 4 KiB chunks, so every size crosses chunk boundaries.
struct Setup {
  const char* name;
  host_transport host;
  std::size_t part_bytes;
};
const Setup setups[] = {{"gloo", host_transport::gloo, std::size_t{256} << 10},
                        {"shm", host_transport::shm, std::size_t{256} << 10},
                        {"shm", host_transport::shm, std::size_t{4} << 10}};

CommOptions options_for(const Setup& s) {
  CommOptions o;
  o.host = s.host;
  o.shm_part_bytes = s.part_bytes;
  return o;
}

void check_transport(const HostCommunicator& comm, const Setup& s) {
  require(comm.size() == 1 || comm.transport() == s.name,
          std::string("expected transport ") + s.name + ", got " + comm.description());
}

}  // namespace

BOOST_AUTO_TEST_CASE_TEMPLATE(all_reduce_matches_reference, T, Dtypes) {
  for (const Setup& setup : setups)
    for (int n = 1; n <= 4; ++n)
      for (auto op : {reduce_op::sum, reduce_op::avg})
        run_ranks(
            n,
            [&](World& w) {
              HostCommunicator comm(w);
              check_transport(comm, setup);
              for (std::size_t len : sizes) {
                auto buf = as_dtype<T>(rank_input<T>(len, w.rank(), len));
                comm.all_reduce(std::span<T>(buf), op).wait();
                std::vector<double> want(len, 0.0);
                for (int r = 0; r < n; ++r) {
                  const auto in = rank_input<T>(len, r, len);
                  for (std::size_t i = 0; i < len; ++i) want[i] += in[i];
                }
                if (op == reduce_op::avg)
                  for (auto& x : want) x /= n;
                check_close(buf, want,
                            std::string(setup.name) + " all_reduce " + std::string(reduce_op_name(op)) +
                                " n=" + std::to_string(n));
              }
            },
            options_for(setup));
}

BOOST_AUTO_TEST_CASE_TEMPLATE(reduce_scatter_matches_reference, T, Dtypes) {
  for (const Setup& setup : setups)
    for (int n = 1; n <= 4; ++n)
      for (auto op : {reduce_op::sum, reduce_op::avg})
        run_ranks(
            n,
            [&](World& w) {
              HostCommunicator comm(w);
              check_transport(comm, setup);
              for (std::size_t chunk : {std::size_t{0}, std::size_t{1}, std::size_t{13}, std::size_t{40001}}) {
                const std::size_t len = chunk * static_cast<std::size_t>(n);
                const auto in = as_dtype<T>(rank_input<T>(len, w.rank(), chunk));
                std::vector<T> out(chunk);
                comm.reduce_scatter(std::span<const T>(in), std::span<T>(out), op).wait();
                std::vector<double> want(chunk, 0.0);
                for (int r = 0; r < n; ++r) {
                  const auto x = rank_input<T>(len, r, chunk);
                  for (std::size_t i = 0; i < chunk; ++i) want[i] += x[static_cast<std::size_t>(w.rank()) * chunk + i];
                }
                if (op == reduce_op::avg)
                  for (auto& x : want) x /= n;
                check_close(out, want, std::string(setup.name) + " reduce_scatter n=" + std::to_string(n));
              }
            },
            options_for(setup));
}

BOOST_AUTO_TEST_CASE_TEMPLATE(all_gather_and_broadcast_are_exact, T, Dtypes) {
  for (const Setup& setup : setups)
    for (int n = 1; n <= 4; ++n)
      run_ranks(
          n,
          [&](World& w) {
            HostCommunicator comm(w);
            check_transport(comm, setup);
            for (std::size_t len : {std::size_t{0}, std::size_t{3}, std::size_t{50021}}) {
              const auto mine = as_dtype<T>(random_values(len, 7 + static_cast<std::uint64_t>(w.rank())));
              std::vector<T> all(len * static_cast<std::size_t>(n));
              comm.all_gather(std::span<const T>(mine), std::span<T>(all)).wait();
              for (int r = 0; r < n; ++r) {
                const auto theirs = as_dtype<T>(random_values(len, 7 + static_cast<std::uint64_t>(r)));
                for (std::size_t i = 0; i < len; ++i)
                  require(all[static_cast<std::size_t>(r) * len + i] == theirs[i], "all_gather mismatch");
              }
              for (int root = 0; root < n; ++root) {
                auto buf = as_dtype<T>(random_values(len, 100 + static_cast<std::uint64_t>(w.rank())));
                comm.broadcast(std::span<T>(buf), root).wait();
                const auto want = as_dtype<T>(random_values(len, 100 + static_cast<std::uint64_t>(root)));
                require(buf == want, "broadcast mismatch from root " + std::to_string(root));
              }
              // In place, as FSDP gathers: this rank's part already sits in its slot.
              std::vector<T> slots(len * static_cast<std::size_t>(n));
              std::copy(mine.begin(), mine.end(),
                        slots.begin() + static_cast<std::ptrdiff_t>(len * static_cast<std::size_t>(w.rank())));
              const std::span<T> own = std::span<T>(slots).subspan(len * static_cast<std::size_t>(w.rank()), len);
              comm.all_gather(std::span<const T>(own), std::span<T>(slots)).wait();
              require(slots == all, "in-place all_gather mismatch");
            }
            comm.barrier().wait();
          },
          options_for(setup));
}

BOOST_AUTO_TEST_CASE(many_collectives_in_flight_complete_in_order) {
  run_ranks(3, [](World& w) {
    GlooCommunicator comm(w);
    std::vector<std::vector<float>> bufs(8, std::vector<float>(2049));
    std::vector<GlooWork> works;
    for (std::size_t k = 0; k < bufs.size(); ++k) {
      for (auto& x : bufs[k]) x = static_cast<float>(k + 1) * static_cast<float>(w.rank() + 1);
      works.push_back(comm.all_reduce(std::span<float>(bufs[k]), reduce_op::sum));
    }
    for (auto& wk : works) wk.wait();
    for (std::size_t k = 0; k < bufs.size(); ++k)
      for (float x : bufs[k]) require(x == static_cast<float>(k + 1) * 6.f, "out-of-order completion");
  });
}

BOOST_AUTO_TEST_CASE(two_communicators_on_one_world_do_not_mix) {
  run_ranks(2, [](World& w) {
    GlooCommunicator a(w);
    GlooCommunicator b(w);
    std::vector<float> x(100, 1.f), y(100, 10.f);
    auto wa = a.all_reduce(std::span<float>(x), reduce_op::sum);
    auto wb = b.all_reduce(std::span<float>(y), reduce_op::sum);
    wa.wait();
    wb.wait();
    require(x[99] == 2.f && y[0] == 20.f, "communicators mixed their traffic");
  });
}

BOOST_AUTO_TEST_CASE(wrong_sizes_are_config_errors) {
  run_ranks(2, [](World& w) {
    GlooCommunicator comm(w);
    std::vector<float> in(5), out(3);
    require_throws<config_error>(
        [&] { comm.reduce_scatter(std::span<const float>(in), std::span<float>(out), reduce_op::sum); });
    require_throws<config_error>([&] { comm.all_gather(std::span<const float>(out), std::span<float>(in)); });
    require_throws<config_error>([&] { comm.broadcast(std::span<float>(in), 2); });
  });
}

BOOST_AUTO_TEST_CASE(a_rank_that_never_arrives_times_out_on_every_other_rank) {
  for (auto transport : {host_transport::gloo, host_transport::shm}) {
    CommOptions opts;
    opts.host = transport;
    opts.timeout = std::chrono::milliseconds(1500);
    std::vector<std::string> messages(3);
    std::atomic<int> reported{0};
    const auto start = std::chrono::steady_clock::now();
    run_ranks(
        3,
        [&](World& w) {
          HostCommunicator comm(w);
          std::vector<float> x(64, 1.f);
          comm.all_reduce(std::span<float>(x), reduce_op::sum).wait();  // #1: everyone
          if (w.rank() == 2) {  // rank 2 hangs (alive, connected) and never reaches #2
            while (reported < 2) std::this_thread::sleep_for(std::chrono::milliseconds(10));
            return;
          }
          try {
            comm.all_reduce(std::span<float>(x), reduce_op::sum).wait();
          } catch (const timeout_error& e) {
            messages[static_cast<std::size_t>(w.rank())] = e.what();
          }
          ++reported;
          // The communicator is poisoned: later calls fail fast instead of hanging.
          require_throws<comm_error>([&] { comm.barrier().wait(); });
        },
        opts);
    const auto took = std::chrono::steady_clock::now() - start;
    BOOST_TEST((took < std::chrono::seconds(15)));
    for (int r = 0; r < 2; ++r) {
      const auto& m = messages[static_cast<std::size_t>(r)];
      BOOST_TEST_INFO("rank " << r << ": " << m);
      BOOST_TEST(m.find("all_reduce") != std::string::npos);
      BOOST_TEST(m.find("#2") != std::string::npos);
      BOOST_TEST(m.find("2 (at #1)") != std::string::npos);
      BOOST_TEST(m.find(r == 0 ? "1 (at" : "0 (at") == std::string::npos);  // the other waiting rank did arrive
    }
  }
}

BOOST_AUTO_TEST_CASE(a_rank_that_dies_fails_the_others_fast) {
  CommOptions opts;
  opts.timeout = std::chrono::seconds(60);
  const auto start = std::chrono::steady_clock::now();
  std::atomic<int> failures{0};
  run_ranks(
      2,
      [&](World& w) {
        auto comm = std::make_unique<GlooCommunicator>(w);
        if (w.rank() == 1) {
          comm.reset();  // closes its connections, as a crashed process would
          return;
        }
        std::vector<float> x(1 << 16, 1.f);
        try {
          comm->all_reduce(std::span<float>(x), reduce_op::sum).wait();
        } catch (const comm_error&) {
          ++failures;
        }
      },
      opts);
  BOOST_TEST(failures.load() == 1);
  BOOST_TEST((std::chrono::steady_clock::now() - start < std::chrono::seconds(20)));
}

// World::split: groups of ranks with their own communicators, as FSDP's
// HybridShard uses them (shard groups {0,1}, {2,3}; replica groups {0,2}, {1,3}).
BOOST_AUTO_TEST_CASE(split_worlds_reduce_within_their_group) {
  std::vector<std::vector<float>> shard_sums(4), replica_sums(4);
  run_ranks(4, [&](World& w) {
    World shard = w.split(w.rank() / 2, "shard");
    World replica = w.split(w.rank() % 2, "replica");
    require(shard.size() == 2 && shard.rank() == w.rank() % 2 && shard.global_rank() == w.rank(), "shard group layout");
    require(replica.size() == 2 && replica.rank() == w.rank() / 2, "replica group layout");
    require(shard.group() == "shard/" + std::to_string(w.rank() / 2), "group name");
    require(shard.local_rank() == w.local_rank(), "the local rank (the GPU) stays the process's");
    GlooCommunicator a(shard), b(replica);
    std::vector<float> x{static_cast<float>(1 << w.rank())}, y = x;
    auto wa = a.all_reduce(std::span<float>(x), reduce_op::sum);
    auto wb = b.all_reduce(std::span<float>(y), reduce_op::sum);
    wa.wait();
    wb.wait();
    shard_sums[static_cast<std::size_t>(w.rank())] = x;
    replica_sums[static_cast<std::size_t>(w.rank())] = y;
  });
  // 2^rank identifies who contributed to each sum.
  const float shard_want[] = {1 + 2, 1 + 2, 4 + 8, 4 + 8}, replica_want[] = {1 + 4, 2 + 8, 1 + 4, 2 + 8};
  for (int r = 0; r < 4; ++r) {
    BOOST_TEST(shard_sums[static_cast<std::size_t>(r)][0] == shard_want[r]);
    BOOST_TEST(replica_sums[static_cast<std::size_t>(r)][0] == replica_want[r]);
  }
}

// A group's timeout names the missing rank by its group rank and its global rank.
BOOST_AUTO_TEST_CASE(a_group_timeout_names_global_ranks) {
  CommOptions opts;
  opts.timeout = std::chrono::milliseconds(1500);
  std::string message;
  std::atomic<bool> reported{false};
  run_ranks(
      4,
      [&](World& w) {
        World group = w.split(w.rank() < 2 ? 0 : 1, "shard");
        GlooCommunicator comm(group);
        std::vector<float> x(8, 1.f);
        comm.all_reduce(std::span<float>(x), reduce_op::sum).wait();
        if (w.rank() == 3) {  // global rank 3 = rank 1 of group 1 never reaches #2
          while (!reported) std::this_thread::sleep_for(std::chrono::milliseconds(10));
          return;
        }
        if (w.rank() != 2) return;
        try {
          comm.all_reduce(std::span<float>(x), reduce_op::sum).wait();
        } catch (const timeout_error& e) {
          message = e.what();
        }
        reported = true;
      },
      opts);
  BOOST_TEST_INFO(message);
  BOOST_TEST(message.find("on rank 0 (global 2) of 2") != std::string::npos);
  BOOST_TEST(message.find("ranks that never reached it: 1 (global 3) (at #1)") != std::string::npos);
}

namespace {
// A typed message with named fields (core/wire.hpp).
struct LayerShape {
  std::string name;
  std::vector<std::int64_t> shape;
  bool trainable = true;
  static constexpr auto wire_fields() {
    return std::tuple{field("name", &LayerShape::name), field("shape", &LayerShape::shape),
                      field("trainable", &LayerShape::trainable)};
  }
};
}  // namespace

// World::agree names the first rank that differs from rank 0 and the field.
BOOST_AUTO_TEST_CASE(agree_names_the_disagreeing_rank_and_field) {
  std::vector<std::string> errors(3);
  run_ranks(3, [&](World& w) {
    try {
      const std::vector<LayerShape> model{{"l1", {7, 15}, true}, {"l2", {15, w.rank() == 2 ? 17 : 16}, true}};
      w.agree("the model", model);
    } catch (const config_error& e) {
      errors[static_cast<std::size_t>(w.rank())] = e.what();
    }
  });
  for (const auto& e : errors)
    BOOST_TEST(
        e.find("ranks disagree on the model: rank 2 has [1].shape[1] = 17 where rank 0 has 16") != std::string::npos,
        e);
  // the same values everywhere: no error; all_gather gives every rank's
  run_ranks(3, [&](World& w) {
    w.agree("the seed", std::uint64_t{42});
    const std::vector<LayerShape> all =
        w.all_gather("mine", LayerShape{"r" + std::to_string(w.rank()), {w.rank()}, false});
    require(all.size() == 3 && all[2].name == "r2" && all[2].shape == std::vector<std::int64_t>{2} && !all[1].trainable,
            "all_gather returns every rank's value in rank order");
  });
}

BOOST_AUTO_TEST_CASE(store_port_in_use_and_unreachable_master_are_clear_errors) {
  TcpStoreServer first(0, "127.0.0.1");
  try {
    TcpStoreServer second(first.port());
    BOOST_FAIL("binding a used port must fail");
  } catch (const launch_error& e) {
    BOOST_TEST(std::string(e.what()).find("--master-port") != std::string::npos);
  }
  const int dead_port = [] {
    TcpStoreServer s(0, "127.0.0.1");
    return s.port();
  }();  // closed again: nobody listens there now
  const auto start = std::chrono::steady_clock::now();
  BOOST_CHECK_THROW(TcpStore("127.0.0.1", dead_port, std::chrono::milliseconds(800)), launch_error);
  BOOST_TEST((std::chrono::steady_clock::now() - start < std::chrono::seconds(5)));
}

// A rank told to stop (a watched signal: dtrain-run stopping the ranks
// after one failed) while its master is unreachable gives up at its next
// attempt instead of retrying for the whole timeout; the notice ends with
// the last watch, and retrying resumes.
BOOST_AUTO_TEST_CASE(a_stop_signal_ends_the_wait_for_an_unreachable_master) {
  const int dead_port = [] {
    TcpStoreServer s(0, "127.0.0.1");
    return s.port();
  }();
  {
    PreemptionWatch watch({SIGUSR2});
    ::raise(SIGUSR2);
    BOOST_REQUIRE(watch.signalled() == SIGUSR2);
    const auto start = std::chrono::steady_clock::now();
    try {
      TcpStore("127.0.0.1", dead_port, std::chrono::seconds(60));
      BOOST_FAIL("reaching a closed port must fail");
    } catch (const launch_error& e) {
      BOOST_TEST(e.problem().find("stopped by SIGUSR2 while trying to reach the rendezvous master at 127.0.0.1:") == 0u,
                 e.problem());
    }
    BOOST_TEST((std::chrono::steady_clock::now() - start < std::chrono::seconds(5)));
  }
  BOOST_TEST(detail::preemption_signal == 0);
  const auto start = std::chrono::steady_clock::now();
  BOOST_CHECK_THROW(TcpStore("127.0.0.1", dead_port, std::chrono::milliseconds(600)), launch_error);
  BOOST_TEST((std::chrono::steady_clock::now() - start >= std::chrono::milliseconds(600)));  // it retried
}

BOOST_AUTO_TEST_CASE(store_set_get_add_and_get_timeout) {
  TcpStoreServer server(0, "127.0.0.1");
  TcpStore a("127.0.0.1", server.port(), std::chrono::milliseconds(500));
  TcpStore b("127.0.0.1", server.port(), std::chrono::milliseconds(500));
  a.set("k", std::string("v\0x", 3));
  BOOST_TEST(b.get("k") == std::string("v\0x", 3));
  BOOST_TEST(a.add("n", 2) == 2);
  BOOST_TEST(b.add("n", 5) == 7);
  BOOST_TEST(!b.try_get("missing").has_value());
  BOOST_CHECK_THROW(b.get("missing"), timeout_error);
}

// A rank whose rendezvous connection closed (it exited or was killed) is
// listed as departed by the store: a rank waiting for a key it was to set
// fails at once, naming it, instead of at the timeout.
BOOST_AUTO_TEST_CASE(store_waits_on_a_departed_rank_fail_at_once) {
  for (const char* what : {"gather", "barrier"}) {
    BOOST_TEST_CONTEXT(what) {
      auto worlds = make_local_worlds(2, CommOptions{.timeout = std::chrono::seconds(30)});
      worlds.pop_back();  // rank 1 leaves without arriving
      const auto start = std::chrono::steady_clock::now();
      try {
        if (std::string_view(what) == "gather")
          worlds[0].all_gather("x", std::string("v"));
        else
          worlds[0].barrier("b");
        BOOST_FAIL("the wait on a departed rank returned");
      } catch (const comm_error& e) {
        BOOST_TEST(std::string(e.what()).find("rank 1 left the job before setting rendezvous key") != std::string::npos,
                   e.what());
      }
      const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      BOOST_TEST(took < 5.0);
    }
  }
}

// A key the departed rank did set before leaving is still read.
BOOST_AUTO_TEST_CASE(store_keys_set_before_leaving_are_read) {
  auto worlds = make_local_worlds(2, CommOptions{.timeout = std::chrono::seconds(30)});
  worlds[1].store()->set("gather/0/x/1", "from 1");
  worlds.pop_back();
  const int setter = 1;
  BOOST_TEST(worlds[0].store()->get("gather/0/x/1", std::nullopt, std::span(&setter, 1)) == "from 1");
}
